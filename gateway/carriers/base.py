"""Shapes shared by every carrier: the Carrier protocol and what it produces.

Owns: `TextUnit`, `ParsedRequest`, `FoldedResponse`, `UsageReport`, `CarrierLimits`, the
`Carrier` protocol, and helpers that turn a decoded document into text units (every string,
key and number; JSON held inside strings decoded again to a bounded depth).
Must not: do I/O or know about policy. Carriers describe what the provider will read;
inspection decides what that means.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from gateway import units
from gateway.carriers import jsonraw
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent
from gateway.units import Path, TextUnit
from gateway.usage import Count
from gateway.vocab import Dialect, ReasonCode

# What a unit is, for inspection and attribution. Every unit is inspected the same way;
# the kind only explains where the text came from.
UnitKind = Literal[
    "string",  # any string value anywhere in the document
    "key",  # an object key
    "number",  # a number's exact lexical form
    "embedded",  # a string/key inside JSON that was itself held in a string (tool args, results)
    "joined",  # the text parts of one message (or one streamed block) joined together
    "folded",  # a streamed field reassembled from its deltas
]


@dataclass(frozen=True, slots=True)
class CarrierLimits:
    max_depth: int = 64  # JSON nesting accepted from clients and providers
    embedded_json_depth: int = 3  # how many times JSON-inside-a-string is decoded again


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Token usage exactly as the provider reported it (normalised later by usage.py)."""

    fields: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    carrier: str
    doc: dict[str, Any]
    model: str
    stream: bool
    units: tuple[TextUnit, ...]
    opaque: tuple[str, ...] = ()  # pointers of content nobody can read as text
    duplicate_keys: tuple[str, ...] = ()  # pointers of objects with duplicate keys
    too_deep: tuple[str, ...] = ()  # pointers of JSON-in-strings nested past the decoding budget


@dataclass(frozen=True, slots=True)
class FoldedResponse:
    """A complete provider response, reassembled (stream) or decoded (non-stream)."""

    units: tuple[TextUnit, ...]
    complete: bool  # the body parsed and, for a stream, a terminal event was seen
    incomplete_reason: str | None = None
    usage: UsageReport | None = None
    response_id: str | None = None
    is_error: bool = False  # an error object/event from the provider
    duplicate_keys: tuple[str, ...] = ()
    opaque: tuple[str, ...] = ()
    events: tuple[SSEEvent, ...] = field(default=())  # the parsed events, for re-framing
    raw_scan: bool = True  # False only where the raw bytes are non-text model output
    too_deep: tuple[str, ...] = ()

    @classmethod
    def unreadable(cls, reason: str) -> FoldedResponse:
        """A response that could not be read at all: nothing in it is vouched for."""
        return cls(units=(), complete=False, incomplete_reason=reason)

    def ended(self, clean: bool) -> FoldedResponse:
        """This fold of a stream, incomplete when the stream did not end cleanly (a cut last
        line, or fields never dispatched as an event)."""
        if clean or not self.complete:
            return self
        return dataclasses.replace(self, complete=False, incomplete_reason=ReasonCode.RESPONSE_INCOMPLETE)


class PromptPart(NamedTuple):
    """One part of a prompt as the provider renders it, in order: a tool schema, a system
    block, a message's content block (or its whole string content). A plain tuple: every
    collected or cache-planned call makes one per part (a frozen dataclass costs about
    six times as much to build)."""

    path: Path  # where it sits in the request
    region: Literal["tools", "system", "message"]
    message: int | None  # the index of its message
    role: str | None  # its message's role
    kind: str  # the block's type ("text", "tool_use", "tool_result", "thinking", ...), or "tool"
    text: str  # what it says (a non-text block as compact JSON, cache markers left out)
    is_string: bool  # a bare string (system or content), not a block object
    marker: str | None = None  # the TTL of a cache marker the client already put here
    markable: bool = False  # the provider accepts a cache marker here (and the client left it to us)
    inner_markers: tuple[str, ...] = ()  # TTLs of the client's markers on blocks nested inside it


@dataclass(frozen=True, slots=True)
class PromptLayout:
    parts: tuple[PromptPart, ...]
    automatic_marker: str | None = None  # a request-level cache marker (the provider places it)


class Carrier(Protocol):
    """One wire schema. Bytes in, values out. Everything wiregate knows about a schema is
    here: its route and names, how a request and a response read, what output a request
    asks for, how its provider reports usage, the edits that make usage complete without
    changing what the client asked for, and its error event."""

    name: str  # registry key, e.g. "openai.chat"
    short_name: str  # the name profiles list in `carriers`, e.g. "chat"
    provider: Literal["openai", "anthropic"]
    dialect: Dialect  # how errors on its route are written
    path: str  # the upstream path appended to a profile's base_url
    route: str  # the gateway route clients call

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        """The output cap the request asks for (None when it does not say)."""
        ...

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        """The provider's usage object as disjoint known/unknown parts (see gateway.usage)."""
        ...

    def usage_edits(self, text: str, doc: Mapping[str, Any]) -> tuple[list[Edit], bool]:
        """Edits that ask the provider for usage the client did not ask for, and whether
        the released events must then drop it (`released_events`)."""
        ...

    def released_events(self, events: Sequence[SSEEvent], usage_injected: bool) -> list[SSEEvent]:
        """The events the client receives: as sent, less any usage only wiregate asked for."""
        ...

    # How the provider caches prompt prefixes: explicit markers on parts, a request-level
    # cache key, or not at all.
    cache_style: Literal["markers", "key"] | None

    def prompt_layout(self, doc: Mapping[str, Any]) -> PromptLayout:
        """The prompt's parts in the order the provider renders them."""
        ...

    def marker_edit(self, text: str, part: PromptPart, ttl: str) -> Edit:
        """The edit that puts a cache marker with `ttl` on `part` (markers style only)."""
        ...

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest: ...

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse: ...

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse: ...

    def stream_folder(self, limits: CarrierLimits) -> StreamFolding:
        """`fold_stream` one event at a time (for a stream released as it arrives)."""
        ...

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str, error_type: str) -> bytes:
        """The protocol's own error event, for a refusal once a stream's headers are out."""
        ...


class StreamFolding(Protocol):
    """A stream folded as it arrives: the same fields `fold_stream` reads, so far."""

    pieces: dict[Path, list[str]]  # every folded field so far, in first-arrival order
    terminal: bool  # a terminal event was seen
    is_error: bool  # the provider's error event was seen
    broken: str | None  # an event could not be read (why)
    usage: dict[str, Any] | None  # the provider's usage as reported so far
    response_id: str | None  # the response's id, once an event named it

    @property
    def found(self) -> Collected:
        """The units, duplicate keys and too-deep pointers of every event read so far."""
        ...

    def add(self, n: int, event: SSEEvent) -> None: ...

    def result(self, events: tuple[SSEEvent, ...]) -> FoldedResponse: ...


class NoEdits:
    """For carriers whose provider reports usage without being asked."""

    def usage_edits(self, text: str, doc: Mapping[str, Any]) -> tuple[list[Edit], bool]:
        return [], False

    def released_events(self, events: Sequence[SSEEvent], usage_injected: bool) -> list[SSEEvent]:
        return list(events)


# ---------------------------------------------------------------------------------------
# Unit collection shared by all carriers.

_JSON_START = re.compile(r"\s*[\[{]")


@dataclass(slots=True)
class Collected:
    """What a document holds for inspection: its units, the pointers of objects with
    duplicate keys, and of JSON-in-strings nested past the decoding budget."""

    units: list[TextUnit]
    dups: list[str]
    deep: list[str] = field(default_factory=list)

    def extend(self, other: Collected) -> None:
        self.units.extend(other.units)
        self.dups.extend(other.dups)
        self.deep.extend(other.deep)


def units_of(doc: Any, limits: CarrierLimits, base: Path = ()) -> Collected:
    """Every string, key and number in an already decoded `doc`, plus what JSON held inside
    its strings holds (see `parse_document`). Raises JsonError(too_deep) past the depth
    limit."""
    items, dup_paths, _ = jsonraw.collect(doc, base, limits.max_depth)
    return _with_embedded(items, dup_paths, limits)


def parse_document(raw: bytes | str, limits: CarrierLimits, base: Path = ()) -> tuple[Any, Collected]:
    """Decode wire bytes (or one event's text) and collect every unit: every string, key
    and number; the strings of JSON held inside a string (tool-call arguments, tool
    results, embeddings inputs and unknown fields alike) decoded again up to
    `limits.embedded_json_depth` times, as one `embedded` unit at the path of the string
    that held them."""
    doc, items, dup_paths = jsonraw.decode_units(raw, base, limits.max_depth)
    return doc, _with_embedded(items, dup_paths, limits)


def _with_embedded(items: list[TextUnit], dup_paths: list[Path], limits: CarrierLimits) -> Collected:
    found = Collected(list(items), [units.pointer(p) for p in dup_paths])
    if limits.embedded_json_depth > 0:
        match = _JSON_START.match
        for unit in items:
            if unit.kind == "string" and match(unit.text):
                _decode_embedded(unit.text, unit.path, limits, limits.embedded_json_depth, found)
    return found


def _holds_more_json(text: str, limits: CarrierLimits) -> bool:
    """JSON text whose strings hide more escaped content (so stopping here would leave
    something unread)."""
    if "\\" not in text:
        return False  # every string in it stands verbatim in `text`, which is inspected
    try:
        jsonraw.decode_shape(text, limits.max_depth)
    except JsonError as exc:
        return exc.reason == ReasonCode.TOO_DEEP
    return True


def _decode_embedded(text: str, path: Path, limits: CarrierLimits, budget: int, found: Collected) -> None:
    """JSON held in the string `text` at `path`: its strings, keys and numbers become one
    `embedded` unit at `path` (joined with LF: a boundary for every format rule that the
    normalised copy keeps, unlike NUL, which it removes), and JSON held
    in its strings is decoded again while `budget` lasts. When the budget runs out and a
    string still holds JSON with escapes, the path is reported too deep (withheld), never
    silently left unread."""
    try:
        if "\\" not in text:
            # No escape inside: every key, string and number of the inner document stands
            # verbatim in `text`, which is itself a unit. Its shape is left to check, and its
            # strings read in order.
            doc, has_dups = jsonraw.decode_shape(text, limits.max_depth)
            if has_dups:
                found.dups.append(units.pointer(path))
            _values_joined(doc, path, found)
            return
        doc, texts, has_dups = jsonraw.decode_texts(text, limits.max_depth)
    except JsonError as exc:
        if exc.reason == ReasonCode.TOO_DEEP:
            found.deep.append(units.pointer(path))  # too deep to inspect: never silently accepted
        return  # otherwise an ordinary string that merely starts with a bracket
    if has_dups:
        found.dups.append(units.pointer(path))
    found.units.append(TextUnit(path, "\n".join(texts), "embedded"))
    _values_joined(doc, path, found)
    match = _JSON_START.match
    for inner_text in texts:
        if not match(inner_text):
            continue
        if budget > 1:
            _decode_embedded(inner_text, path, limits, budget - 1, found)
        elif _holds_more_json(inner_text, limits):
            found.deep.append(units.pointer(path))
            return


def _values_joined(doc: Any, path: Path, found: Collected) -> None:
    """The string values of JSON held in a string, read in order with no boundary (keys
    and numbers left out): a configured value split across two members of tool arguments
    is seen whole (the engine reads this unit for configured values only, as it reads the
    document's own strings joined: a format rule could match across a boundary a reader
    sees)."""
    values: list[str] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        if jsonraw.is_str(node):
            values.append(node)
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    if len(values) >= 2:
        found.units.append(TextUnit(path, "".join(values), units.KIND_VALUES))


def joined(path: Path, parts: Sequence[str]) -> TextUnit | None:
    """The text parts of one message joined, so a value split across parts is seen whole."""
    if len(parts) < 2:
        return None
    return TextUnit(path, "".join(parts), "joined")


def starts_json(text: str) -> bool:
    """Whether `text` may be JSON held in a string: after whitespace, `{` or `[`."""
    return _JSON_START.match(text) is not None


def folded_units(path: Path, text: str, limits: CarrierLimits, found: Collected) -> None:
    """A reassembled streamed field, plus its strings if it is JSON (tool arguments)."""
    found.units.append(TextUnit(path, text, "folded"))
    if limits.embedded_json_depth > 0 and starts_json(text):
        _decode_embedded(text, path, limits, limits.embedded_json_depth, found)


def require_object(raw: bytes, limits: CarrierLimits) -> dict[str, Any]:
    """The request document. Its depth is enforced when its units are collected."""
    doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
    if not isinstance(doc, dict):
        raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
    return doc


def parse_object(raw: bytes, limits: CarrierLimits) -> tuple[dict[str, Any], Collected]:
    """A request that must be a JSON object, with its units (see `parse_document`)."""
    doc, found = parse_document(raw, limits)
    if not isinstance(doc, dict):
        raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
    return doc, found


def require_model(doc: dict[str, Any]) -> str:
    model = doc.get("model")
    if not jsonraw.is_str(model) or not model or len(model) > 256:
        raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
    return str(model)


def stream_flag(doc: dict[str, Any]) -> bool:
    value = doc.get("stream", False)
    if value is None:
        return False
    if type(value) is not bool:
        raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
    return value
