"""OpenAI Chat Completions (`POST /v1/chat/completions`), JSON and SSE forms.

Owns: what the provider reads in a chat request (every string; text parts of a message
joined; images, audio and files as opaque content) and how a chat stream folds back into
choices: every string field of every delta, per choice — content, refusal, reasoning
fields, legacy `function_call.arguments`, `audio.transcript`, fields no one has named yet —
and tool calls per `tool_calls[].index`. A chunk holding `error` makes the stream
incomplete (`common.EventDecoder.result`), even if `[DONE]` follows.
Must not: do I/O or judge content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.carriers import base, common, jsonspan
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest, PromptLayout, PromptPart
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent
from gateway.units import Path
from gateway.usage import Count
from gateway.vocab import Dialect, ReasonCode

_OPAQUE_PARTS = frozenset({"image_url", "input_audio", "file"})
_OPAQUE = common.of_type(_OPAQUE_PARTS)
_DATA_MEMBERS = frozenset({"function"})  # a tool call's name and arguments: what the model wrote


_TOOL_CALLS = frozenset({"tool_calls"})
_NULL_USAGE = ',"usage":null}'
_INDEX = frozenset({"index"})


class OpenAIChat:
    name = "openai.chat"
    short_name = "chat"
    provider: Literal["openai", "anthropic"] = "openai"
    dialect = Dialect.OPENAI
    cache_style: Literal["markers", "key"] | None = "key"
    path = "/chat/completions"
    route = "/v1/chat/completions"  # the gateway route clients call

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        doc, found = base.parse_object(raw, limits)
        units = found.units
        model = base.require_model(doc)
        stream = base.stream_flag(doc)
        messages = doc.get("messages")
        if not isinstance(messages, list):
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        # Images, audio and files wherever a message holds them (content parts, a tool's
        # content); an assistant's earlier audio by reference.
        opaque = common.opaque_anywhere(messages, ("messages",), _OPAQUE, _DATA_MEMBERS, [])
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
            content = msg.get("content")
            if isinstance(content, list):
                texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
                unit = base.joined(("messages", i, "content"), texts)
                if unit is not None:
                    units.append(unit)
            if isinstance(msg.get("audio"), dict):
                opaque.append(f"/messages/{i}/audio")
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
        """Tools, then messages (OpenAI renders tool definitions ahead of the conversation)."""
        parts: list[PromptPart] = [
            common.tool_part(("tools", i), tool) for i, tool in enumerate(common.listed(doc.get("tools")))
        ]
        for m, msg in enumerate(common.listed(doc.get("messages"))):
            parts.extend(common.message_parts(("messages", m), m, msg, "content"))
        return PromptLayout(tuple(parts))

    def marker_edit(self, text: str, part: PromptPart, ttl: str) -> Edit:
        raise NotImplementedError("OpenAI caches by prefix and key, not by marker")

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse:
        return common.json_response(raw, limits, error_key="error", opaque=_spoken)

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        return common.first_count(doc, "max_completion_tokens", "max_tokens")

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        return common.openai_usage(
            usage, "prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"
        )

    def usage_edits(self, text: str, doc: Mapping[str, Any]) -> tuple[list[Edit], bool]:
        """A stream whose client did not ask for usage is asked upstream
        (`stream_options.include_usage`); the extra chunk is dropped on release."""
        if doc.get("stream") is not True:
            return [], False
        options = doc.get("stream_options")
        if "stream_options" not in doc:
            top = jsonspan.locate(text, ())
            return [jsonspan.add_member(text, top, '"stream_options":{"include_usage":true}')], True
        if options is None:  # null, as the SDKs may send it: the value, not a second member
            start, end = jsonspan.locate(text, ("stream_options",))
            return [(start, end, '{"include_usage":true}')], True
        if not isinstance(options, dict) or options.get("include_usage") is True:
            return [], False
        if "include_usage" in options:
            start, end = jsonspan.locate(text, ("stream_options", "include_usage"))
            return [(start, end, "true")], True
        span = jsonspan.locate(text, ("stream_options",))
        return [jsonspan.add_member(text, span, '"include_usage":true')], True

    def released_events(self, events: Sequence[SSEEvent], usage_injected: bool) -> list[SSEEvent]:
        """What the client would have received without include_usage: no usage-only chunk
        and no `"usage":null` member on the others (removed only in the exact form OpenAI
        writes)."""
        if not usage_injected:
            return list(events)
        out: list[SSEEvent] = []
        for ev in events:
            data = ev.data
            if data.endswith(_NULL_USAGE):  # its last member, so its usage is null
                out.append(SSEEvent(ev.event, data[: -len(_NULL_USAGE)] + "}", ev.id))
                continue
            if data != "[DONE]" and ('"usage"' in data or "\\" in data):  # can name a usage
                try:
                    chunk = json.loads(data)
                except (ValueError, RecursionError):  # unreadable: the fold refuses it
                    chunk = None
                if isinstance(chunk, dict) and chunk.get("choices") == [] and chunk.get("usage"):
                    continue
            out.append(ev)  # unchanged (events are frozen): no copy
        return out

    def stream_folder(self, limits: CarrierLimits) -> common.StreamFolder:
        return _Folder(limits)

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse:
        return common.fold(_Folder(limits), events)

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str, error_type: str) -> bytes:
        body = {
            "error": {
                "message": message,
                "type": error_type,
                "param": None,
                "code": code,
                "reason_codes": list(reason_codes),
            }
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _spoken(doc: dict[str, Any]) -> list[str]:
    """Audio an answer holds (`choices[i].message.audio.data`): no check reads it."""
    found = []
    for position, choice in enumerate(common.listed(doc.get("choices"))):
        message = choice.get("message") if isinstance(choice, dict) else None
        audio = message.get("audio") if isinstance(message, dict) else None
        if isinstance(audio, dict) and audio.get("data") is not None:
            found.append(f"/choices/{common.get_int(choice, 'index') or position}/message/audio")
    return found


def _named(value: Any, names: frozenset[str]) -> bool:
    return type(value) is str and value in names


def _indexes_valid(choice: Any) -> bool:
    """The fold files a choice and its tool calls by their `index`: each must be one a
    client reads the same way (`common.valid_index`)."""
    if not common.valid_index(choice, "index"):
        return False
    delta = choice.get("delta") if isinstance(choice, dict) else None
    calls = delta.get("tool_calls") if isinstance(delta, dict) else None
    return all(common.valid_index(call, "index") for call in (calls if isinstance(calls, list) else ()))


def _fold_choice(choice: Any, pieces: dict[Path, list[str]]) -> None:
    """Every string of a choice's delta, appended to its field of the folded message;
    tool calls by their `index` (the position in one chunk's list says nothing)."""
    ci = common.get_int(choice, "index") or 0
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        return
    message: Path = ("choices", ci, "message")
    common.string_leaves(delta, message, pieces, skip=_TOOL_CALLS)
    calls = delta.get("tool_calls")
    for position, call in enumerate(calls if isinstance(calls, list) else ()):
        ti = common.get_int(call, "index")
        common.string_leaves(call, (*message, "tool_calls", position if ti is None else ti), pieces, skip=_INDEX)


_CHUNK_MEMBERS = frozenset(
    {"id", "object", "created", "model", "system_fingerprint", "service_tier", "choices", "usage", "obfuscation"}
)
_CHUNK_LABELS = ("id", "object", "model", "system_fingerprint", "service_tier", "obfuscation")
_CHOICE_MEMBERS = frozenset({"index", "delta", "finish_reason", "logprobs"})
_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
_DELTA_MEMBERS = frozenset({"role", "content", "refusal", "reasoning_content", "tool_calls", "function_call"})
_STRUCTURED = frozenset({"tool_calls", "function_call"})  # objects, never text of their own
_CALL_MEMBERS = frozenset({"index", "id", "type", "function"})
_FUNCTION_MEMBERS = frozenset({"name", "arguments"})


def _texts(obj: Any, names: frozenset[str]) -> bool:
    """`obj` holds only members named in `names`, each null or a string (all folded)."""
    return common.keys_within(obj, names) and all(v is None or type(v) is str for v in obj.values())


def _known_call(call: Any) -> bool:
    return (
        common.keys_within(call, _CALL_MEMBERS)
        and type(call.get("index")) is int
        and all(call.get(k) is None or type(call.get(k)) is str for k in ("id", "type"))
        and (call.get("function") is None or _texts(call.get("function"), _FUNCTION_MEMBERS))
    )


def _known_delta(delta: Any) -> bool:
    """A choice's delta whose every string folds: text fields, a role, tool calls by index."""
    if not common.keys_within(delta, _DELTA_MEMBERS):
        return False
    for key, value in delta.items():
        if value is None or (type(value) is str and key not in _STRUCTURED):
            continue
        if key == "tool_calls":
            if not (isinstance(value, list) and all(_known_call(call) for call in value)):
                return False
        elif key != "function_call" or not _texts(value, _FUNCTION_MEMBERS):
            return False
    return True


def _counts(usage: Any) -> bool:
    """Usage as numbers only (whole numbers, or objects of them, one level down)."""
    if usage is None:
        return True
    if not isinstance(usage, dict):
        return False
    for value in usage.values():
        if isinstance(value, dict):
            if not all(v is None or type(v) is int for v in value.values()):
                return False
        elif value is not None and type(value) is not int:
            return False
    return True


def _indexed_list(value: Any, top: bool = True) -> bool:
    """Does `value` hold a list of objects with an `index` (other than a delta's own
    `tool_calls`)? The SDK merges such a list's entries by their `index`, the fold files
    them by position: the two would read different text."""
    if isinstance(value, dict):
        return any(_indexed_list(v, False) for k, v in value.items() if not (top and k == "tool_calls"))
    if isinstance(value, list):
        return any(isinstance(v, dict) and ("index" in v or _indexed_list(v, False)) for v in value)
    return False


SDK_CALLS = "tool_calls~sdk"  # where a message's tool calls fold as the SDK places them


class _Folder(common.StreamFolder):
    """Chunks folded by their choices' and tool calls' `index`. The SDK files them by their
    place in its lists instead: the first chunk's choice at its `index`, then an index it
    has not seen goes to the end. For choices the two must agree (each new index the next
    one, `_positions`): past that a stream is not one anyone can vouch for. Tool calls that
    start past the next index (some providers number them from 1) are read both ways: by
    index, and, once the two differ, as the SDK places them (under `SDK_CALLS`)."""

    def __init__(self, limits: CarrierLimits) -> None:
        super().__init__(limits)
        self.choices: dict[int, int] = {}  # per choice seen, the tool calls the SDK has placed
        self.first = True  # no chunk the SDK reads has come yet
        self.placed: list[tuple[int, int]] = []  # this chunk's tool calls: (choice, SDK place)
        self.sdk: dict[Path, list[str]] = {}  # tool calls as the SDK places them: `pieces` once they differ

    def _done(self) -> None:
        self.terminal = True

    def _delta_only(self, obj: Any) -> common.Labels | None:
        """A chunk of labels and choices whose only text is their `delta` (folded whole),
        every member one the chunk format names, no logprobs (tokens of their own)."""
        if not common.keys_within(obj, _CHUNK_MEMBERS) or not common.ints_within(obj, ("created",)):
            return None
        choices = obj.get("choices")
        if not isinstance(choices, list) or not _counts(obj.get("usage")):
            return None
        for choice in choices:
            if not (
                common.keys_within(choice, _CHOICE_MEMBERS)
                and type(choice.get("index")) is int
                and choice.get("logprobs") is None
                and (choice.get("finish_reason") is None or _named(choice.get("finish_reason"), _FINISH))
                and _known_delta(choice.get("delta"))
            ):
                return None
        labels: common.Labels = []
        return labels if common.labels_of(obj, _CHUNK_LABELS, labels) else None

    def _positions(self, chunk: dict[str, Any], choices: list[Any]) -> bool:
        """Are this chunk's new choices each the next index (the first chunk's in order), so
        that index and place in the SDK's list agree? Notes where the SDK places each tool
        call (`placed`). A chunk the SDK skips (its `object` another than a chunk's, as
        Azure's filter events are) carries no text, or it is read one way by the SDK and
        another by the rest."""
        self.placed = []
        if "object" in chunk and chunk["object"] != "chat.completion.chunk":
            return not any(isinstance(c, dict) and c.get("delta") for c in choices)
        for place, choice in enumerate(choices):
            ci = choice.get("index") if isinstance(choice, dict) else None
            if type(ci) is not int or (self.first and ci != place):
                return False
            if ci not in self.choices:
                if ci != len(self.choices):
                    return False
                self.choices[ci] = 0
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if _indexed_list(delta):
                return False
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                ti = call.get("index") if isinstance(call, dict) else None
                if type(ti) is not int:
                    return False
                placed = ti if ti < self.choices[ci] else self.choices[ci]
                if placed == self.choices[ci]:
                    self.choices[ci] += 1
                if placed != ti and self.sdk is not self.pieces:  # from now on, read both ways
                    self.pieces.update(self.sdk)
                    self.sdk = self.pieces
                self.placed.append((ci, placed))
        self.first = False
        return True

    def _fold_as_placed(self, choices: list[Any]) -> None:
        """This chunk's tool calls as the SDK places them (see `_positions`)."""
        places = iter(self.placed)
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for call in calls if isinstance(calls, list) else ():
                ci, placed = next(places)
                common.string_leaves(call, ("choices", ci, "message", SDK_CALLS, placed), self.sdk, skip=_INDEX)

    def _event(self, event: SSEEvent, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            self.is_error = True
        self.response_id = self.response_id or common.get_str(chunk, "id")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if choices is not None and not isinstance(choices, list):
            self.broken = ReasonCode.JSON_INVALID  # not a chat chunk: nothing of the stream folds
            return
        if not all(_indexes_valid(choice) for choice in choices or ()) or not self._positions(chunk, choices or []):
            self.broken = ReasonCode.UPSTREAM_INVALID_RESPONSE
            return
        if self.placed:
            self._fold_as_placed(choices or [])
        for choice in choices or ():
            _fold_choice(choice, self.pieces)
            delta = choice.get("delta") if isinstance(choice, dict) else None
            audio = delta.get("audio") if isinstance(delta, dict) else None
            if isinstance(audio, dict) and audio.get("data") is not None:  # spoken in parts: unreadable
                where = f"/choices/{common.get_int(choice, 'index') or 0}/message/audio"
                if where not in self.opaque:
                    self.opaque.append(where)
