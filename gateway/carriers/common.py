"""Helpers several carriers share: non-stream response decoding and event decoding.

Must not: do I/O or know any one provider's schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from gateway import units
from gateway.carriers import jsonraw
from gateway.carriers.base import (
    CarrierLimits,
    Collected,
    FoldedResponse,
    PromptLayout,
    PromptPart,
    UsageReport,
    folded_units,
    parse_document,
    units_of,
)
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.sse import SSEEvent
from gateway.units import Path, TextUnit
from gateway.usage import UNKNOWN, Count, all_unknown, get, known, minus
from gateway.vocab import ReasonCode


def listed(value: Any) -> list[Any] | tuple[()]:
    """A member that should hold a list, as one (anything else holds no items to lay out)."""
    return value if isinstance(value, list) else ()


def json_response(
    raw: bytes,
    limits: CarrierLimits,
    *,
    error_key: str | None,
    skip: frozenset[str] = frozenset(),
    opaque: Callable[[dict[str, Any]], list[str]] | None = None,
) -> FoldedResponse:
    """Decode a complete non-stream JSON response. `skip` names top-level members whose
    values are not text (embedding vectors) and are left out of the units."""
    try:
        if skip:
            doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
            if not isinstance(doc, dict):
                raise JsonError(ReasonCode.JSON_INVALID)
            found = units_of(jsonraw.without(doc, skip), limits)
        else:
            doc, found = parse_document(raw, limits)
            if not isinstance(doc, dict):
                raise JsonError(ReasonCode.JSON_INVALID)
    except JsonError as exc:
        return FoldedResponse.unreadable(exc.reason)
    usage = doc.get("usage")
    rid = doc.get("id")
    return FoldedResponse(
        units=tuple(found.units),
        complete=True,
        usage=UsageReport(dict(usage)) if isinstance(usage, dict) else None,
        response_id=rid if jsonraw.is_str(rid) else None,
        is_error=error_key is not None and error_key in doc,
        duplicate_keys=tuple(found.dups),
        opaque=tuple(opaque(doc)) if opaque is not None else (),
        too_deep=tuple(found.deep),
    )


# Where an event's own SSE fields sit under its base ("~events", index): the HTML standard
# calls `event:` the event's type and `id:` its id. Fixed names, never client or model text.
_EVENT_FIELD: Path = ("~sse", "type")
_ID_FIELD: Path = ("~sse", "id")


class EventDecoder:
    """Decodes each event's JSON payload, collecting every string it holds as units (every
    raw event is inspected decoded, not only the folded result).

    A delta event whose payload is ASCII without a single backslash takes a short path when
    the carrier vouches for its shape (`delta_only`): every member is one it knows, every
    string either text its fold reads (decoded, normalised and joined as part of the folded
    field) or a label it returns (ids, the model's name, padding), and every other value a
    number, a boolean, null or one of a few known words. Such an event's text is read with
    its field; each distinct label becomes a unit once per stream (they repeat on every
    event). Any other event — one that carries text outside the folded fields (a finished
    item, a final response object, a message start with content, logprobs, a member no one
    has named), any escape, or any non-ASCII character (which gets an NFKC copy) — takes the
    full path: its every string and key decoded, normalised and joined, as in a non-stream
    answer. Every event's own `event:` and `id:` values are read too (`fields`): the client
    receives them re-framed with the data."""

    def __init__(self, limits: CarrierLimits) -> None:
        self.limits = limits
        self.found = Collected([], [])
        self._labels: set[str] = set()  # label texts already read as units in this stream

    def fields(self, event: SSEEvent, index: int) -> None:
        """Event `index`'s own SSE fields (an `SSEEvent`'s `event` name and `id`), which the
        client receives re-framed beside its data (`sse.frame`): each a string unit, read
        like the data's strings (normalised, decoded), at `_EVENT_FIELD` / `_ID_FIELD` under
        the event's base (no provider's data holds a `~sse` member). Each distinct text is
        read once per stream, as labels are (a name repeats on every event). The last
        segment is a structural field's name, so the joined read of the text leaves them
        out as it leaves out the data's `type` and `id`: a name read between two strings
        would hide a value split across them."""
        seen = self._labels
        name, eid = event.event, event.id
        if name and name not in seen:
            seen.add(name)
            self.found.units.append(TextUnit(("~events", index, *_EVENT_FIELD), name, units.KIND_STRING))
        if eid and eid not in seen:
            seen.add(eid)
            self.found.units.append(TextUnit(("~events", index, *_ID_FIELD), eid, units.KIND_STRING))

    def decode(self, data: str, index: int, delta_only: Callable[[Any], Labels | None] | None = None) -> Any:
        base: Path = ("~events", index)
        if delta_only is not None and data.isascii() and "\\" not in data:
            doc, has_dups = jsonraw.decode_shape(data, self.limits.max_depth)
            labels = delta_only(doc) if not has_dups else None
            if labels is not None:
                for path, text in labels:
                    if text not in self._labels:
                        self._labels.add(text)
                        self.found.units.append(TextUnit((*base, *path), text, units.KIND_STRING))
                return doc
        doc, found = parse_document(data, self.limits, base)
        self.found.extend(found)
        return doc

    def result(
        self,
        *,
        complete: bool,
        incomplete_reason: str | None,
        usage: dict[str, Any] | None,
        response_id: str | None,
        is_error: bool,
        events: tuple[Any, ...],
        opaque: tuple[str, ...] = (),
    ) -> FoldedResponse:
        """The folded stream. A stream that carried the provider's error event (Anthropic
        `error`, an OpenAI chat chunk with `error`, Responses `error`/`response.failed`) is
        never complete, whatever came before it or after: the provider gave up mid-answer,
        so the text before the error is a fragment and nothing of it may be released."""
        complete = complete and not is_error
        return FoldedResponse(
            units=tuple(self.found.units),
            complete=complete,
            incomplete_reason=None if complete else (incomplete_reason or ReasonCode.RESPONSE_INCOMPLETE),
            usage=UsageReport(dict(usage)) if usage else None,
            response_id=response_id,
            is_error=is_error,
            duplicate_keys=tuple(self.found.dups),
            opaque=opaque,
            events=events,
            too_deep=tuple(self.found.deep),
        )


class StreamFolder:
    """Folds a stream one event at a time (`add`), so a caller that releases a stream as it
    arrives reads the same fields a buffered fold reads. `pieces` holds every folded field
    so far (field path → its deltas, in first-arrival order); `found` the units of every
    event read so far. A subclass reads one decoded event in `_event`."""

    def __init__(self, limits: CarrierLimits) -> None:
        self.limits = limits
        self.decoder = EventDecoder(limits)
        self.pieces: dict[Path, list[str]] = {}
        self.usage: dict[str, Any] | None = None
        self.response_id: str | None = None
        self.terminal = False
        self.is_error = False
        self.broken: str | None = None  # why an event could not be read (then nothing folds)
        self.opaque: list[str] = []  # pointers of content no check can read (images, audio)

    @property
    def found(self) -> Collected:
        return self.decoder.found

    def add(self, n: int, event: Any) -> None:
        """Event `n` (an `SSEEvent`) of the stream."""
        if self.broken is not None:
            return
        self.decoder.fields(event, n)  # on every event: `[DONE]` is released with its fields too
        if event.data == "[DONE]":
            self._done()
            return
        try:
            obj = self.decoder.decode(event.data, n, self._delta_only)
        except JsonError as exc:
            self.broken = exc.reason
            return
        if not isinstance(obj, dict):
            self.broken = ReasonCode.JSON_INVALID
            return
        self._event(event, obj)

    def _done(self) -> None:
        """The `[DONE]` sentinel (by default tolerated, not terminal)."""

    def _delta_only(self, obj: Any) -> Labels | None:
        """The labels of a decoded event whose shape the carrier knows whole (see
        `EventDecoder`): every other string in it is folded by `_event`. None for any other
        event (by default, every event)."""
        return None

    def _event(self, event: Any, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def result(self, events: tuple[Any, ...]) -> FoldedResponse:
        if self.broken is not None:
            return FoldedResponse.unreadable(self.broken)
        for path, parts in self.pieces.items():
            folded_units(path, "".join(parts), self.limits, self.decoder.found)
        return self.decoder.result(
            complete=self.terminal,
            incomplete_reason=None,
            usage=self.usage,
            response_id=self.response_id,
            is_error=self.is_error,
            events=events,
            opaque=tuple(self.opaque),
        )


def fold(folder: StreamFolder, events: Sequence[Any]) -> FoldedResponse:
    """A whole stream through `folder`: what `Carrier.fold_stream` returns."""
    for n, event in enumerate(events):
        folder.add(n, event)
    return folder.result(tuple(events))


def opaque_anywhere(
    node: Any, path: Path, is_opaque: Callable[[dict[str, Any]], bool], skip: frozenset[str], out: list[str]
) -> list[str]:
    """The pointer of every object under `node` that `is_opaque` says the provider reads
    but no check can (a file, an image, audio), wherever it sits: in a message's content, a
    tool's output, a server tool's result, a template's variables. Members named in `skip`
    are data, not content (a tool call's own input); an opaque object's insides are not
    searched further (it is refused whole)."""
    if isinstance(node, dict):
        if is_opaque(node):
            out.append(units.pointer(path))
            return out
        for key, value in node.items():
            if key not in skip and isinstance(value, (dict, list)):
                opaque_anywhere(value, (*path, key), is_opaque, skip, out)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, (dict, list)):
                opaque_anywhere(value, (*path, i), is_opaque, skip, out)
    return out


def of_type(kinds: frozenset[str]) -> Callable[[dict[str, Any]], bool]:
    """An `opaque_anywhere` test: is the object's `type` one of `kinds`?"""

    def test(node: dict[str, Any]) -> bool:
        kind = node.get("type")
        return jsonraw.is_str(kind) and kind in kinds

    return test


def string_leaves(node: Any, path: Path, out: dict[Path, list[str]], skip: frozenset[str] = frozenset()) -> None:
    """Every string in `node` appended to `out[path of the string]` (object members named
    in `skip` left out): how streamed deltas are folded generically, field by field."""
    cls = type(node)
    if cls is str:
        out.setdefault(path, []).append(node)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key not in skip:
                string_leaves(value, (*path, key), out)
    elif cls is list:
        for i, value in enumerate(node):
            string_leaves(value, (*path, i), out)


def get_int(obj: Any, key: str) -> int | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if type(value) is int else None


def valid_index(obj: Any, key: str) -> bool:
    """Is `obj`'s `key` an index a client can agree with the fold on: absent, null or a
    non-negative JSON integer? A JavaScript client reads 1.0, 1e0 or "1" as 1 (and Python
    dicts key 1.0 as 1) where the fold would not: a stream with such an index is not one
    whose reading can be vouched for."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value is None or (type(value) is int and value >= 0)


def get_str(obj: Any, key: str) -> str | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if jsonraw.is_str(value) else None


def first_count(doc: Mapping[str, Any], *names: str) -> int | None:
    """The first of `names` that holds a non-negative integer (an output cap)."""
    for name in names:
        value = doc.get(name)
        if type(value) is int and value >= 0:
            return value
    return None


def openai_usage(
    usage: Mapping[str, Any] | None, inp: str, out: str, in_details: str, out_details: str
) -> dict[str, Count]:
    """OpenAI's usage (chat and Responses name the same figures differently): its input
    total includes the cached tokens."""
    if not usage:
        return all_unknown()
    details = usage.get(in_details)
    whole = known(usage.get(inp))
    read = known(get(details, "cached_tokens"))
    write = known(get(details, "cache_write_tokens"))
    return {
        "input_total": whole,
        "input_uncached": minus(whole, read, write),
        "cache_read": read,
        "cache_write": write,
        "cache_write_5m": UNKNOWN,
        "cache_write_1h": UNKNOWN,
        "output": known(usage.get(out)),
        "reasoning": known(get(usage.get(out_details), "reasoning_tokens")),
    }


_COMPACT = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# The C encoder `_COMPACT.encode` builds afresh on every call, built once. Without a
# circular-reference table (`markers` None) it keeps no state, so threads may share it;
# what it encodes is a parsed request, a tree the strict reader bounded in depth.
_MAKE_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)  # CPython's _json (not in typeshed)
_C_COMPACT = (
    _MAKE_C_ENCODER(None, _COMPACT.default, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _MAKE_C_ENCODER is not None
    else None
)


def compact(value: Any) -> str:
    """A JSON value as compact text (for estimates of what a non-text part says): sorted
    keys, no spaces, non-ASCII as is (what `_COMPACT.encode` writes)."""
    if _C_COMPACT is None or isinstance(value, str):
        return _COMPACT.encode(value)
    return "".join(_C_COMPACT(value, 0))


def tool_part(path: Path, tool: Any) -> PromptPart:
    return PromptPart(path, "tools", None, None, "tool", compact(tool), False)


def message_parts(path: Path, index: int, msg: Any, field: str) -> list[PromptPart]:
    """An OpenAI-style message's parts: its string content, or each content part; tool
    calls and anything else the message holds as one JSON part."""
    if not isinstance(msg, dict):
        return []
    role = msg.get("role") if jsonraw.is_str(msg.get("role")) else None
    region: Literal["system", "message"] = "system" if role in ("system", "developer") else "message"
    content = msg.get(field)
    parts: list[PromptPart] = []
    if isinstance(content, str):
        parts.append(PromptPart((*path, field), region, index, role, "text", content, True))
    elif isinstance(content, list):
        for j, part in enumerate(content):
            kind = str(part.get("type") or "text") if isinstance(part, dict) else "text"
            text = part["text"] if isinstance(part, dict) and jsonraw.is_str(part.get("text")) else compact(part)
            parts.append(PromptPart((*path, field, j), region, index, role, kind, text, False))
    if len(msg) <= (field in msg) + ("role" in msg):
        return parts  # nothing beside the content and the role (most messages)
    rest = {k: v for k, v in msg.items() if k not in (field, "role")}
    if rest:
        kind = "tool_calls" if "tool_calls" in rest else ("tool_result" if role == "tool" else "fields")
        parts.append(PromptPart(path, region, index, role, kind, compact(rest), False))
    return parts


Labels = list[tuple[Path, str]]  # strings of a delta event that are not folded: read as units


def labels_of(obj: Mapping[str, Any], names: Sequence[str], out: Labels) -> bool:
    """Append the members of `obj` named in `names` (each absent, null or a string) to
    `out` as labels; False when one holds anything else."""
    for name in names:
        value = obj.get(name)
        if value is None:
            continue
        if type(value) is not str:
            return False
        out.append(((name,), value))
    return True


def ints_within(obj: Any, names: Sequence[str]) -> bool:
    """Members of `obj` named in `names` are absent, null or whole numbers."""
    return all(obj.get(name) is None or type(obj.get(name)) is int for name in names)


def keys_within(obj: Any, allowed: frozenset[str]) -> bool:
    """Is `obj` an object whose every member is named in `allowed`?"""
    return isinstance(obj, dict) and all(key in allowed for key in obj)


def render_order(
    doc: Mapping[str, Any], instructions: str, turns: str, layout: Callable[[], PromptLayout]
) -> list[TextUnit]:
    """When the document holds its `turns` (messages, input) before its `instructions`
    (system, instructions) — the official SDKs write them so — the text as the provider
    reads it (instructions first) joined into one unit read for configured values only
    (`KIND_VALUES`): the engine's own joined read follows the document's order, so a value
    split across the end of the instructions and the start of the first turn was never
    read whole. Tool schemas are left out (they are not part of that text)."""
    if instructions not in doc or turns not in doc:
        return []
    keys = list(doc)
    if keys.index(instructions) < keys.index(turns):
        return []
    texts = [part.text for part in layout().parts if part.region != "tools"]
    return [TextUnit(("~render",), "".join(texts), units.KIND_VALUES)] if len(texts) >= 2 else []
