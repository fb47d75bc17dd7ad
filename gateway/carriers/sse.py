"""Server-sent events: an incremental parser and the re-framer used for release.

Owns: turning bytes into `SSEEvent`s exactly as the HTML living standard's event-stream
rules say (one leading UTF-8 byte order mark is ignored; lines end in CRLF, LF or CR;
`data:` lines join with LF; comments and unknown fields are dropped; an event with no data
is not dispatched), and turning events back into canonical bytes. Events and multi-byte
UTF-8 characters, and the byte order mark, may be split anywhere across reads: a line is
decoded only once it is complete.
Must not: do I/O or interpret event payloads (carriers do that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from gateway.carriers import jsonraw
from gateway.carriers.jsonraw import JsonError
from gateway.vocab import ReasonCode

BOM = b"\xef\xbb\xbf"  # UTF-8's byte order mark: ignored once at the start of a stream


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None  # the `event:` name, None for data-only events (OpenAI chat)
    data: str
    id: str | None = None


class SSEParser:
    """Feed bytes as they arrive; get complete events back."""

    __slots__ = ("_buf", "_more", "_event", "_data", "_id", "_pending", "_started")

    def __init__(self) -> None:
        self._buf = b""
        self._more: list[bytes] = []  # later pieces of the line in `_buf`, joined once it ends
        self._started = False  # past the stream's first bytes (and the byte order mark there may be)
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._pending = False  # a field line was seen since the last dispatch

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._started and self._buf and b"\n" not in chunk and b"\r" not in chunk and not self._buf.endswith(b"\r"):
            self._more.append(chunk)  # a long line still arriving: kept in pieces, never re-joined
            return []  # (joining the pending bytes on every read made one large event quadratic)
        buf = self._pending_bytes() + chunk if self._buf else chunk
        if not self._started:
            if len(buf) < len(BOM) and BOM.startswith(buf):
                self._buf = buf  # a byte order mark may still be arriving
                return []
            self._started = True
            if buf.startswith(BOM):
                buf = buf[len(BOM) :]
        # A trailing CR may be the first half of CRLF: keep it until the next byte arrives.
        cut = len(buf)
        if buf.endswith(b"\r"):
            cut -= 1
        last = max(buf.rfind(b"\n", 0, cut), buf.rfind(b"\r", 0, cut))
        if last < 0:
            self._buf = buf
            return []
        complete, self._buf = buf[: last + 1], buf[last + 1 :]
        events: list[SSEEvent] = []
        for line in complete.splitlines():
            self._line(line, events)
        return events

    def close(self) -> tuple[list[SSEEvent], bool]:
        """End of stream. Returns any final events and whether the stream ended cleanly
        (no partial line or undispatched event left over)."""
        events: list[SSEEvent] = []
        clean = True
        if self._buf:
            rest = self._pending_bytes()
            self._buf = b""
            if rest == b"\r":
                self._line(b"", events)  # a lone trailing CR ends a line
                rest = b""
            if rest:
                clean = False  # a partial line: the stream was cut
        if self._pending:
            clean = False  # fields with no terminating blank line are discarded, per spec
        self._reset()
        return events, clean

    def _pending_bytes(self) -> bytes:
        if self._more:
            self._buf = b"".join((self._buf, *self._more))
            self._more = []
        return self._buf

    def _reset(self) -> None:
        self._event = None
        self._data = []
        self._id = None
        self._pending = False

    def _line(self, line: bytes, events: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                events.append(SSEEvent(self._event, "\n".join(self._data), self._id))
            self._reset()
            return
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise JsonError(ReasonCode.JSON_INVALID) from None
        if text[0] == ":":
            return  # comment / keep-alive
        self._pending = True
        name, sep, value = text.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        # `retry` and unknown fields are ignored, as the standard says.


def parse_all(data: bytes) -> tuple[list[SSEEvent], bool]:
    """Parse a complete buffered stream. Returns (events, ended_cleanly). The native module
    does it in one call when it is built (the same results: tests/test_jsonraw_native.py)."""
    native = jsonraw.native()
    if native is not None and type(data) is bytes:
        return cast(tuple[list[SSEEvent], bool], native.sse_parse_all(data, SSEEvent))
    return parse_all_reference(data)


def parse_all_reference(data: bytes) -> tuple[list[SSEEvent], bool]:
    """`parse_all` by the incremental parser: the reference."""
    parser = SSEParser()
    events = parser.feed(data)
    tail, clean = parser.close()
    events.extend(tail)
    return events, clean


def frame(events: Iterable[SSEEvent]) -> bytes:
    """Canonical bytes for events: what the client receives on release."""
    out: list[str] = []
    for ev in events:
        if ev.event is not None:
            out.append(f"event: {ev.event}\n")
        if ev.id is not None:
            out.append(f"id: {ev.id}\n")
        for line in ev.data.split("\n"):
            out.append(f"data: {line}\n")
        out.append("\n")
    return "".join(out).encode("utf-8")


HEARTBEAT = b": wiregate keep-alive\n\n"
