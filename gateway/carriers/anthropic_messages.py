"""Anthropic Messages (`POST /v1/messages`), JSON and SSE forms.

Owns: what the provider reads in a Messages request (system, messages, tools — every
string; text blocks of one message, and of `system`, joined; images, base64/URL documents,
container uploads and redacted thinking as opaque content) and how a stream folds back:
per content block index, every string field of every delta (`text_delta`, `input_json_delta`,
`thinking_delta`, `signature_delta`, citations and fields no one has named yet), each seeded
with the text its `content_block_start` already carried; usage split between
`message_start` and the cumulative `message_delta`; `message_stop` ends it; an
`error` event makes it incomplete (`common.EventDecoder.result`).
Must not: do I/O or judge content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.carriers import base, common, jsonraw, jsonspan
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest, PromptLayout, PromptPart
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent
from gateway.units import Path
from gateway.usage import Count, all_unknown, get, known, total
from gateway.vocab import Dialect, ReasonCode

# A delta field and the content-block field it extends (tool input arrives as JSON text).
_FOLDED_NAME: dict[str, str] = {"partial_json": "input"}
_NOT_TEXT = frozenset({"type"})
_DELTA_EVENT = frozenset({"type", "index", "delta"})
# Fields of a content_block_delta's `delta` that fold (a citation folds as an object of its own).
_FOLDED_DELTA = frozenset({"type", "text", "thinking", "signature", "partial_json"})
_DELTA_TYPES = frozenset({"text_delta", "thinking_delta", "signature_delta", "input_json_delta"})
_BARE_EVENTS = frozenset({"ping", "content_block_stop", "message_stop"})
# Every delta type the SDK's accumulator extends a block with; it ignores any other type, so
# the text of one is read as the block's by some clients and dropped by others.
_KNOWN_DELTAS = _DELTA_TYPES | {"citations_delta"}
_FOLDING_EVENTS = frozenset({"message_start", "content_block_start", "content_block_delta"})
_BARE_MEMBERS = frozenset({"type", "index"})
_DATA_MEMBERS = frozenset({"input"})  # a tool call's input: what the model wrote, not content it reads


def _is_opaque_block(block: dict[str, Any]) -> bool:
    kind = block.get("type")
    if kind in ("image", "container_upload", "redacted_thinking"):
        return True
    if kind == "document":
        source = block.get("source")
        # Plain-text and nested-content documents are text we read; base64 PDFs, URLs and
        # file references are not.
        return not (isinstance(source, dict) and source.get("type") in ("text", "content"))
    return False


class AnthropicMessages(base.NoEdits):
    name = "anthropic.messages"
    short_name = "messages"
    provider: Literal["openai", "anthropic"] = "anthropic"
    dialect = Dialect.ANTHROPIC
    cache_style: Literal["markers", "key"] | None = "markers"
    path = "/v1/messages"
    route = "/v1/messages"  # the gateway route clients call

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        doc, found = base.parse_object(raw, limits)
        units = found.units
        model = base.require_model(doc)
        stream = base.stream_flag(doc)
        messages = doc.get("messages")
        if not isinstance(messages, list):
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        system = doc.get("system")
        if isinstance(system, list):
            unit = base.joined(("system",), _texts(system))
            if unit is not None:
                units.append(unit)
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
            content = msg.get("content")
            if isinstance(content, list):
                unit = base.joined(("messages", i, "content"), _texts(content))
                if unit is not None:
                    units.append(unit)
        units.extend(common.render_order(doc, "system", "messages", lambda: self.prompt_layout(doc)))
        # Files and images anywhere the provider reads them: a message's blocks, a tool result's,
        # a server tool's fetched document, a search result.
        opaque = common.opaque_anywhere(system, ("system",), _is_opaque_block, _DATA_MEMBERS, [])
        common.opaque_anywhere(messages, ("messages",), _is_opaque_block, _DATA_MEMBERS, opaque)
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

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse:
        return common.json_response(raw, limits, error_key="error")

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        return common.first_count(doc, "max_tokens")

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        """`input_tokens` excludes cache reads and writes; stream usage arrives split
        between message_start and message_delta (folded before this)."""
        if not usage:
            return all_unknown()
        uncached = known(usage.get("input_tokens"))
        read = known(usage.get("cache_read_input_tokens"))
        write = known(usage.get("cache_creation_input_tokens"))
        split = usage.get("cache_creation")
        return {
            "input_total": total(uncached, read, write),
            "input_uncached": uncached,
            "cache_read": read,
            "cache_write": write,
            "cache_write_5m": known(get(split, "ephemeral_5m_input_tokens")),
            "cache_write_1h": known(get(split, "ephemeral_1h_input_tokens")),
            "output": known(usage.get("output_tokens")),
            "reasoning": known(get(usage, "output_tokens_details", "thinking_tokens")),
        }

    def prompt_layout(self, doc: Mapping[str, Any]) -> PromptLayout:
        """Tools, then system, then messages — the order Anthropic renders (and caches)."""
        parts: list[PromptPart] = []
        for i, tool in enumerate(common.listed(doc.get("tools"))):
            parts.append(_part(("tools", i), tool, "tools", None, None))
        system = doc.get("system")
        if isinstance(system, str) and system:
            parts.append(_part(("system",), system, "system", None, None))
        elif isinstance(system, list):
            for i, block in enumerate(system):
                parts.append(_part(("system", i), block, "system", None, None))
        for m, msg in enumerate(common.listed(doc.get("messages"))):
            content = msg.get("content") if isinstance(msg, dict) else None
            role = msg.get("role") if isinstance(msg, dict) and jsonraw.is_str(msg.get("role")) else None
            if isinstance(content, str):
                parts.append(_part(("messages", m, "content"), content, "message", m, role))
            elif isinstance(content, list):
                for j, block in enumerate(content):
                    parts.append(_part(("messages", m, "content", j), block, "message", m, role))
        return PromptLayout(tuple(parts), _ttl_of(doc.get("cache_control")))

    def marker_edit(self, text: str, part: PromptPart, ttl: str) -> Edit:
        """A `cache_control` member on a block; a bare string becomes one text block."""
        marker = '{"type":"ephemeral","ttl":"1h"}' if ttl == "1h" else '{"type":"ephemeral"}'
        span = jsonspan.locate(text, part.path)
        if part.is_string:
            literal = text[span[0] : span[1]]
            return (span[0], span[1], f'[{{"type":"text","text":{literal},"cache_control":{marker}}}]')
        return jsonspan.add_member(text, span, f'"cache_control":{marker}')

    def stream_folder(self, limits: CarrierLimits) -> common.StreamFolder:
        return _Folder(limits)

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse:
        return common.fold(_Folder(limits), events)

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str, error_type: str) -> bytes:
        body = {
            "type": "error",
            "error": {"type": error_type, "message": message, "code": code, "reason_codes": list(reason_codes)},
        }
        return b"event: error\ndata: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def _ttl_of(control: Any) -> str | None:
    if not isinstance(control, dict):
        return None
    return "1h" if control.get("ttl") == "1h" else "5m"


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return str(block["text"])
    stripped = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
    return json.dumps(stripped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_DATA_MEMBERS_OF_BLOCKS = frozenset({"input", "input_schema"})  # what a model or a tool wrote: data


def _inner_markers(block: dict[str, Any], out: list[str]) -> list[str]:
    """TTLs of the client's markers on everything a block holds, in prompt order, at any
    depth: a tool result's `content` blocks, a web fetch result's document, a tool search
    result's references, a document's `source.content`, a tool added mid-conversation (the
    API takes a marker on each, and each counts toward its four). Only a tool call's
    `input` and a schema are skipped: data, even where it has a member named
    `cache_control`."""
    for key, value in block.items():
        if key in _DATA_MEMBERS_OF_BLOCKS or key == "cache_control":
            continue
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, dict):
                _inner_markers(item, out)
                ttl = _ttl_of(item.get("cache_control"))
                if ttl is not None:
                    out.append(ttl)
    return out


def _part(path: Path, value: Any, region: Any, message: int | None, role: str | None) -> PromptPart:
    """A block, a tool or a bare string as a prompt part. A `cache_control` member of any
    value (null included) is the client's decision for that block: it counts as a
    breakpoint when it is an object, and wiregate never adds one beside it; nor on a tool
    loaded on demand (`defer_loading`, which the provider refuses to cache), a thinking
    block, or an empty text."""
    text = _block_text(value)
    is_string = isinstance(value, str)
    kind = str(value.get("type")) if isinstance(value, dict) else ("tool" if region == "tools" else "text")
    if region == "tools":
        kind = "tool"
    block = value if isinstance(value, dict) else None
    decided = block is not None and ("cache_control" in block or block.get("defer_loading") is True)
    markable = not decided and kind not in _UNMARKABLE and not (kind == "text" and not text)
    marker = _ttl_of(block.get("cache_control")) if block is not None else None
    inner = tuple(_inner_markers(block, [])) if block is not None and region != "tools" else ()
    return PromptPart(path, region, message, role, kind, text, is_string, marker, markable, inner)


def _texts(blocks: list[Any]) -> list[str]:
    """Text of the text blocks in a block list (joined, so a value split across them is
    read whole)."""
    return [
        b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]


def _merge_usage(into: dict[str, Any], usage: Any) -> None:
    """Anthropic stream usage: start values, overwritten by any non-null cumulative value."""
    if isinstance(usage, dict):
        for key, value in usage.items():
            if value is not None:
                into[key] = value


class _Folder(common.StreamFolder):
    def __init__(self, limits: CarrierLimits) -> None:
        super().__init__(limits)
        self.merged: dict[str, Any] = {}  # message_start's usage, then message_delta's
        self.usage = self.merged
        self.citations: dict[int, int] = {}  # per block: the citations it holds so far
        self.started = 0  # content blocks started so far: the next one's index
        self.open: int | None = None  # the block that is started and not yet stopped

    def _delta_only(self, obj: Any) -> common.Labels | None:
        """A text, thinking, signature or input-JSON delta (its one text field folded, its
        type one of those four), a block's end, a ping or the message's stop: no labels."""
        kind = obj.get("type") if isinstance(obj, dict) else None
        if type(kind) is not str:  # a list or an object would not even hash: read in full
            return None
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not (common.keys_within(obj, _DELTA_EVENT) and type(obj.get("index")) is int):
                return None
            if not (
                common.keys_within(delta, _FOLDED_DELTA)
                and type(delta.get("type")) is str
                and delta.get("type") in _DELTA_TYPES
            ):
                return None
            return [] if all(type(v) is str for v in delta.values()) else None
        if kind in _BARE_EVENTS and common.keys_within(obj, _BARE_MEMBERS) and common.ints_within(obj, ("index",)):
            return []
        return None

    def _in_order(self, kind: str | None, obj: dict[str, Any]) -> bool:
        """Blocks come one after another: each starts at the next index, its deltas and its
        stop name it while it is open. The fold joins blocks by index, a client by the order
        things arrive: out of this order the two could read different text (a value split
        over two blocks started in reverse, or deltas that go back to an earlier block)."""
        if kind not in ("content_block_start", "content_block_delta", "content_block_stop"):
            return True
        index = obj.get("index")
        if type(index) is not int:
            return False
        if kind == "content_block_start":
            if self.open is not None or index != self.started:
                return False
            self.open, self.started = index, self.started + 1
            return True
        if index != self.open:
            return False
        if kind == "content_block_stop":
            self.open = None
        return True

    @staticmethod
    def _one_reading(kind: str | None, named: str | None, obj: dict[str, Any]) -> bool:
        """Does every client fold this event the same way the fold does? The SDK skips an
        event with no `event:` name and a delta of a type it does not know (a raw reader
        takes both). The content `message_start` holds (the API sends it empty) must be a
        list: the SDK starts the message with its blocks, so the fold reads them as blocks
        0.. and the first `content_block_start` must come next (`_in_order`)."""
        if kind not in _FOLDING_EVENTS:
            return True
        if not named:
            return False
        if kind == "message_start":
            msg = obj.get("message")
            return not (isinstance(msg, dict) and "content" in msg and not isinstance(msg["content"], list))
        if kind == "content_block_delta":
            delta = obj.get("delta")
            return not isinstance(delta, dict) or delta.get("type") in _KNOWN_DELTAS
        return True

    def _event(self, event: SSEEvent, obj: dict[str, Any]) -> None:
        kind = common.get_str(obj, "type") or event.event
        named = event.event
        if "error" in (kind, named):  # the SDKs go by the event's name: either one says error
            self.is_error = True
        if named and named != kind:  # the SDK would act on the name, we on the data: neither
            self.broken = ReasonCode.UPSTREAM_INVALID_RESPONSE  # reading can be vouched for
            return
        if not self._in_order(kind, obj) or not self._one_reading(kind, named, obj):
            self.broken = ReasonCode.UPSTREAM_INVALID_RESPONSE
            return
        if kind == "message_start":
            msg = obj.get("message")
            self.response_id = common.get_str(msg, "id")
            held = msg.get("content") if isinstance(msg, dict) else None
            for index, block in enumerate(held if isinstance(held, list) else ()):  # blocks the SDK starts with
                common.string_leaves(block, ("content", index), self.pieces, skip=_NOT_TEXT)
                self.started += 1
            start = msg.get("usage") if isinstance(msg, dict) else None
            # Its output figure is a starting value: the count is known only once message_delta says it.
            _merge_usage(
                self.merged,
                {k: v for k, v in start.items() if k != "output_tokens"} if isinstance(start, dict) else None,
            )
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict):  # text it already holds starts the folded field
                index = common.get_int(obj, "index") or 0
                common.string_leaves(block, ("content", index), self.pieces, skip=_NOT_TEXT)
                held = block.get("citations")
                self.citations[index] = len(held) if isinstance(held, list) else 0
        elif kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                index = common.get_int(obj, "index") or 0
                for field, value in delta.items():
                    if field == "citation":  # each a whole object of its own: content[i].citations[n]
                        n = self.citations.get(index, 0)
                        self.citations[index] = n + 1
                        common.string_leaves(value, ("content", index, "citations", n), self.pieces)
                    elif field not in _NOT_TEXT:
                        name = _FOLDED_NAME.get(str(field), str(field))
                        common.string_leaves(value, ("content", index, name), self.pieces)
        elif kind == "message_delta":
            _merge_usage(self.merged, obj.get("usage"))
        elif kind == "message_stop":
            self.terminal = True
