"""OpenAI Responses (`POST /v1/responses`), JSON and SSE forms.

Owns: what the provider reads in a Responses request (instructions, input items, tools —
every string; text parts of one message joined; images, files, audio, inline binary
sources and `data:` URLs anywhere in the request, and encrypted reasoning state, as opaque
content; generated images and audio in the answer too) and how named `response.*` events
fold back: every
event that carries a `delta` — named or not yet known — is reassembled by its event family,
output item and content part (function-call arguments per output item);
`response.completed | incomplete | failed` and `error` are terminal, and the last two make
the stream incomplete (`common.EventDecoder.result`): nothing of a failed answer is released.
Must not: do I/O or judge content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.carriers import base, common
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest, PromptLayout, PromptPart
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent
from gateway.units import LABEL_FIELDS, Path
from gateway.usage import Count
from gateway.vocab import Dialect, ReasonCode

_OPAQUE_TYPES = frozenset({"input_image", "input_file", "input_audio", "computer_screenshot"})
_TEXT_MEDIA = ("text/", "application/json")


_DATA_URL = re.compile(r"data:([\w.+-]+/[\w.+-]+)(;[^,\s]*)?,", re.IGNORECASE)
# Members that carry a URL or inline data the provider fetches or decodes (text never does).
_URL_MEMBERS = frozenset({"image_url", "file_url", "file_data", "url", "data", "audio_url", "video_url"})


def _binary_data_url(value: Any) -> bool:
    """A `data:` URL (RFC 2397, with its media type) of anything but text."""
    if not isinstance(value, str):
        return False
    found = _DATA_URL.match(value)
    return found is not None and not found.group(1).lower().startswith(_TEXT_MEDIA)


def _opaque(node: dict[str, Any]) -> bool:
    """Content the provider reads (or returns) that no check can: files, images, audio —
    typed as such, an image generation's result, an inline `base64` source that is not
    text (a skill's zip), or a `data:` URL of an image in a member that carries URLs or
    data (an image mask). Text that merely starts with "data:" is text."""
    kind = node.get("type")
    if isinstance(kind, str):
        if kind in _OPAQUE_TYPES:
            return True
        if kind == "image_generation_call" and node.get("result") is not None:
            return True
        media = node.get("media_type")
        if kind == "base64" and not (isinstance(media, str) and media.lower().startswith(_TEXT_MEDIA)):
            return True
    return any(_binary_data_url(node.get(key)) for key in _URL_MEMBERS.intersection(node))


def _opaque_output(doc: dict[str, Any]) -> list[str]:
    return common.opaque_anywhere(doc.get("output"), ("output",), _opaque, frozenset(), [])


_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


class OpenAIResponses(base.NoEdits):
    name = "openai.responses"
    short_name = "responses"
    provider: Literal["openai", "anthropic"] = "openai"
    dialect = Dialect.OPENAI
    cache_style: Literal["markers", "key"] | None = "key"
    path = "/responses"
    route = "/v1/responses"  # the gateway route clients call

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        doc, found = base.parse_object(raw, limits)
        units = found.units
        model = base.require_model(doc)
        stream = base.stream_flag(doc)
        items = doc.get("input")
        if items is not None and not isinstance(items, (str, list)):
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        # Files and images anywhere the provider reads them: a message's content, a tool's
        # output, a template's variables, a tool's own settings (an inline skill, an image
        # mask); and reasoning state the provider encrypted.
        opaque = common.opaque_anywhere(doc, (), _opaque, frozenset(), [])
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if not isinstance(item, dict):
                raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
            if item.get("type") == "reasoning" and item.get("encrypted_content") is not None:
                opaque.append(f"/input/{i}/encrypted_content")
            content = item.get("content")
            if isinstance(content, list):
                texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
                unit = base.joined(("input", i, "content"), texts)
                if unit is not None:
                    units.append(unit)
        units.extend(common.render_order(doc, "instructions", "input", lambda: self.prompt_layout(doc)))
        return ParsedRequest(
            carrier=self.name,
            doc=doc,
            model=model,
            stream=stream,
            units=tuple(units),
            opaque=tuple(opaque),
            duplicate_keys=tuple(found.dups),
            too_deep=tuple(found.deep),
        )

    def prompt_layout(self, doc: Mapping[str, Any]) -> PromptLayout:
        """Tools, instructions, then the input items in order."""
        parts: list[PromptPart] = [
            common.tool_part(("tools", i), tool) for i, tool in enumerate(common.listed(doc.get("tools")))
        ]
        instructions = doc.get("instructions")
        if isinstance(instructions, str) and instructions:
            parts.append(PromptPart(("instructions",), "system", None, "developer", "text", instructions, True))
        items = doc.get("input")
        if isinstance(items, str):
            parts.append(PromptPart(("input",), "message", 0, "user", "text", items, True))
        for i, item in enumerate(items if isinstance(items, list) else ()):
            if isinstance(item, dict) and "role" in item:
                parts.extend(common.message_parts(("input", i), i, item, "content"))
            elif isinstance(item, dict):  # a function call, its output, reasoning...
                kind = str(item.get("type") or "item")
                parts.append(PromptPart(("input", i), "message", i, None, kind, common.compact(item), False))
        return PromptLayout(tuple(parts))

    def marker_edit(self, text: str, part: PromptPart, ttl: str) -> Edit:
        raise NotImplementedError("OpenAI caches by prefix and key, not by marker")

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse:
        # A Responses object always has an `error` member (null on success); its status says.
        return common.json_response(raw, limits, error_key=None, opaque=_opaque_output)

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        return common.first_count(doc, "max_output_tokens")

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        return common.openai_usage(
            usage, "input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details"
        )

    def stream_folder(self, limits: CarrierLimits) -> common.StreamFolder:
        return _Folder(limits)

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse:
        return common.fold(_Folder(limits), events)

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str, error_type: str) -> bytes:
        # `error` mapping included so the SDK raises APIError on this event.
        body = {
            "type": "error",
            "code": code,
            "message": message,
            "param": None,
            "reason_codes": list(reason_codes),
            "error": {"message": message, "type": error_type, "code": code, "reason_codes": list(reason_codes)},
        }
        return b"event: error\ndata: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _delta_path(kind: str, obj: dict[str, Any]) -> Path:
    """Where a delta's reassembled text lives in the final response object (an event type
    no one has named yet folds under its own family name, by its ids). A delta is text: a
    family that bears a structural field's name (`response.status.delta`) folds under
    `<family>_delta`, so nothing reads the text as a label (which a windowed release would
    send whole, unheld)."""
    index = common.get_int(obj, "output_index")
    out_i: int | str = index if index is not None else (common.get_str(obj, "item_id") or 0)
    part_i = common.get_int(obj, "content_index")
    family = kind.removesuffix(".delta").removeprefix("response.") or "delta"
    if family in LABEL_FIELDS:
        family += "_delta"
    if family == "function_call_arguments":
        return ("output", out_i, "arguments")
    if family == "output_text" and part_i is not None:
        return ("output", out_i, "content", part_i, "text")
    path: list[str | int] = ["output", out_i, family]
    for key in ("content_index", "summary_index"):
        value = common.get_int(obj, key)
        if value is not None:
            path.append(value)
    return tuple(path)


_DELTA_MEMBERS = frozenset(
    {"type", "sequence_number", "item_id", "output_index", "content_index", "summary_index", "delta", "obfuscation"}
)
_DELTA_INDEXES = ("sequence_number", "output_index", "content_index", "summary_index")
_FOLD_INDEXES = ("output_index", "content_index", "summary_index")  # where the fold files text
_DELTA_TYPES = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.audio.transcript.delta",
        "response.code_interpreter_call_code.delta",
        "response.mcp_call_arguments.delta",
    }
)


_OPAQUE_EVENTS = {
    "response.image_generation_call.partial_image": "result",
    "response.audio.delta": "audio",
}


_STARTS = frozenset({"response.created", "response.queued", "response.in_progress"})


def _seeded(item: Any) -> bool:
    """Does an output item, as a stream starts it, already hold text its deltas extend?"""
    if not isinstance(item, dict):
        return False
    return any(item.get(name) not in (None, "", []) for name in ("content", "arguments", "input", "summary", "text"))


def _one_reading(kind: str, obj: dict[str, Any]) -> bool:
    """Does every client fold this event the way the fold does? The SDK extends the text an
    item or a part starts with (`content_part.added`, `output_item.added`, the output of the
    response a stream starts with), which the API always sends empty: the fold starts a
    field at its first delta. And it extends a field only by a `*.delta` event: a `delta` in
    any other event is text a raw reader may join to the field and the SDK drops."""
    if "delta" in obj and not kind.endswith(".delta") and kind not in _TERMINAL:
        return False
    if kind in _STARTS:
        resp = obj.get("response")
        return not (isinstance(resp, dict) and resp.get("output") not in (None, []))
    if kind == "response.output_item.added":
        return not _seeded(obj.get("item"))
    if kind == "response.content_part.added":
        return not _seeded(obj.get("part"))
    return True


class _Folder(common.StreamFolder):
    # `[DONE]` is tolerated (the SDK stops on it); completion needs a terminal event.

    def __init__(self, limits: CarrierLimits) -> None:
        super().__init__(limits)
        self.last_delta: Path | None = None  # the field the latest delta extended

    def _opaque(self, pointers: list[str]) -> None:
        self.opaque.extend(p for p in pointers if p not in self.opaque)

    def _delta_only(self, obj: Any) -> common.Labels | None:
        """A `*.delta` event of a kind the API names, whose text is its `delta` string
        (folded whole) beside ids, indexes and padding (labels); an empty `logprobs` list
        holds nothing. A finished item, part or text, and the final response object, carry
        text of their own: they are read in full."""
        kind = obj.get("type") if isinstance(obj, dict) else None
        if type(kind) is not str or kind not in _DELTA_TYPES or type(obj.get("delta")) is not str:
            return None
        if not all(key in _DELTA_MEMBERS or (key == "logprobs" and obj[key] == []) for key in obj):
            return None
        if not common.ints_within(obj, _DELTA_INDEXES):
            return None
        labels: common.Labels = []
        return labels if common.labels_of(obj, ("item_id", "obfuscation"), labels) else None

    def _event(self, event: SSEEvent, obj: dict[str, Any]) -> None:
        kind = common.get_str(obj, "type") or event.event or ""
        if kind in _TERMINAL:
            self.terminal = True
            # A later terminal event never takes back an error the stream already carried.
            self.is_error = self.is_error or kind in ("error", "response.failed")
        if not all(common.valid_index(obj, key) for key in _FOLD_INDEXES) or not _one_reading(kind, obj):
            self.broken = ReasonCode.UPSTREAM_INVALID_RESPONSE
            return
        resp = obj.get("response")
        if isinstance(resp, dict):
            self.response_id = self.response_id or common.get_str(resp, "id")
            if isinstance(resp.get("usage"), dict):
                self.usage = resp["usage"]
            self._opaque(_opaque_output(resp))
        index = common.get_int(obj, "output_index")
        item = obj.get("item")
        if isinstance(item, dict):
            self._opaque(common.opaque_anywhere(item, ("output", index or 0), _opaque, frozenset(), []))
        if kind in _OPAQUE_EVENTS:  # an image drawn in parts, audio: no check reads them
            self._opaque([f"/output/{index or 0}/{_OPAQUE_EVENTS[kind]}"])
        delta = obj.get("delta")
        if delta is not None and kind not in _TERMINAL:
            path = _delta_path(kind, obj)
            if path != self.last_delta and path in self.pieces:
                # Back to a field an earlier delta left: the fold joins fields in the order
                # they first came, a client prints deltas as they come. Out of order, the two
                # could read different text: not a stream anyone can vouch for.
                self.broken = ReasonCode.UPSTREAM_INVALID_RESPONSE
                return
            self.last_delta = path
            common.string_leaves(delta, path, self.pieces)
