"""Windowed release of a strict stream (a profile's `release = "windowed"`): events go to
the client as they arrive, each only once every character it adds has been inspected
together with the window of text that follows it.

Theory
------
The carrier folds the stream one event at a time (`Carrier.stream_folder`), field by field,
exactly as a buffered fold would. For every event we remember, per folded field it extends,
how many significant characters the field held after it (significant: what `squeeze`
keeps — invisible, control and format characters do not count, tag characters do, so
padding a secret with zero-width characters cannot stretch it past the window). Event `k`
may be released when, for each field it extends, either

* at least `window` significant characters have arrived in that field after it (any match
  that includes one of its characters is then complete, and has been inspected), or
* the field is quiet: `window` significant characters have arrived in other fields of its
  lane, or of the lanes within it, since it last grew (a role, a finished text block before
  a tool call). A lane is what one generation writes in order: the whole answer, except
  that each of OpenAI chat's `choices` is its own lane (choices stream side by side, so one
  choice's text says nothing about whether another's has ended), and each of a choice's
  tool calls is a lane within its choice (the fragments of parallel calls may interleave,
  so one call's arguments say nothing about whether another's have ended; the choice's
  text, which comes before its calls, is quiet once they have run a window), or
* the field labels structure (`role`, `type`, `id`, a tool's `name`...), which a provider
  sends whole in one event (a tool's `name`, which the model chooses, once an event that
  does not extend it has followed: a name split over events is read whole before any of it
  leaves),

and every event before it may be released too (events never reorder). The last two rules
assume a field has ended; a field released whole under them that grows again breaks the
assumption, and the stream ends there (`upstream_invalid_response`): the new text never
leaves (what was released of the field was inspected, but alone). Before anything is
released, one inspection covers what arrived since the previous one: each new event's own
units, the re-framed bytes of the new events (with the previous `window` bytes before
them), and for each folded field the slice from `window` significant characters before the
first character not yet inspected (or not yet released) to its end, moved back to a
whitespace boundary so that no encoded run (base64, hex, escapes) is cut. Slices are given
in the fold's field order, so configured values split across fields are read joined, as a
buffered check reads them. Any non-allow ends the stream: nothing after the last released
event leaves. The end of the stream is judged by the complete buffered check
(`decide.read_response` + `runner.before_release`) before the held remainder is released.

Cost: inspection runs at most once per `window / 2` new significant characters (or after
`interval_s` with something releasable), each over about `window` characters of overlap
plus the new text.

Owns: `WindowedRelease`. Must not: do I/O (the flow feeds it bytes and writes what it
returns).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.carriers import sse
from gateway.carriers.base import Carrier, FoldedResponse, starts_json
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.sse import SSEEvent
from gateway.checks.inspect import header_units, inspect
from gateway.config.runtime import Runtime
from gateway.inspection import decoders
from gateway.inspection.engine import Subject, joinable
from gateway.inspection.verdict import Verdict, withhold
from gateway.units import STRUCTURAL_FIELDS, Path, TextUnit
from gateway.vocab import ReasonCode

# Folded fields that label structure: sent whole by a provider, never held.
LABELS: frozenset[str] = STRUCTURAL_FIELDS | {"name"}
_JSON_STRING_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def significant(text: str) -> int:
    """Characters that count towards the window."""
    if text.isascii() and text.isprintable():
        return len(text)
    return len(decoders.INSIGNIFICANT.sub("", text))


def _back_by(text: str, at: int, need: int) -> int:
    """The position before `at` from which `text` holds `need` significant characters up
    to `at` (0 when it holds fewer)."""
    start = at
    while need > 0 and start > 0:
        lo = max(0, start - need)
        need -= significant(text[lo:start])
        start = lo
    return start


def _unescape(match: re.Match[str]) -> str:
    token = match.group(1)
    if token[0] == "u":
        return chr(int(token[1:], 16))
    return _SIMPLE_ESCAPES[token]


def json_string_text(text: str) -> str:
    """Partial JSON text (tool arguments still arriving) with its string escapes decoded:
    what its strings will say once it is whole."""
    return _JSON_STRING_ESCAPE.sub(_unescape, text)


@dataclass(frozen=True, slots=True)
class Step:
    release: bytes  # re-framed events now safe to send (may be empty)
    refusal: Verdict | None = None  # not allowed: end the stream, release nothing more
    seconds: float = 0.0  # time spent inspecting


def _lane(path: Path) -> Path:
    """The lane a folded field belongs to (see the theory above): a chat tool call's
    (`choices`, i, `message`, `tool_calls`, j) within its choice's (`choices`, i), else the
    whole answer's ()."""
    if len(path) > 1 and path[0] == "choices":
        return path[:5] if len(path) > 5 and path[3] == "tool_calls" else path[:2]
    return ()


def _enclosing(lane: Path) -> tuple[Path, ...]:
    """A lane and every lane it lies within (its prefixes): where its growth is counted."""
    return tuple(lane[:n] for n in range(len(lane), -1, -1))


@dataclass(slots=True)
class _Field:
    lane: Path = ()
    enclosing: tuple[Path, ...] = ((),)  # the lane and the lanes it lies within
    last_event: int = 0  # the event that last grew it
    parts_seen: int = 0  # deltas already taken into `chunks`
    chunks: list[str] = dataclasses.field(default_factory=list)  # joined only to be read
    length: int = 0
    sig: int = 0  # significant characters so far
    last_growth: int = 0  # its lane's significant total when it last grew
    inspected: int = 0  # characters of `text` inspected through
    released: int = 0  # characters of `text` released

    @property
    def text(self) -> str:
        """The field so far (joined once per inspection, not once per delta)."""
        if len(self.chunks) > 1:
            self.chunks = ["".join(self.chunks)]
        return self.chunks[0] if self.chunks else ""


@dataclass(frozen=True, slots=True)
class _Contribution:
    path: Path
    sig_end: int  # the field's significant count after this event
    len_end: int  # the field's length after this event
    held: bool  # a label field is never held


class WindowedRelease:
    def __init__(
        self,
        runtime: Runtime,
        carrier: Carrier,
        profile_id: str,
        headers: Mapping[str, str],
        usage_injected: bool,
        *,
        interval_s: float = 0.05,
    ) -> None:
        self.runtime = runtime
        self.carrier = carrier
        self.profile_id = profile_id
        self.headers = headers
        self.usage_injected = usage_injected
        self.window = runtime.policy.window.chars
        self.joined_window = runtime.policy.window.joined_chars
        self.step = max(32, self.window // 2)
        self.interval_s = interval_s
        self.parser = sse.SSEParser()
        self.folder = carrier.stream_folder(runtime.carrier_limits)
        self.events: list[SSEEvent] = []
        self.contributions: list[tuple[_Contribution, ...]] = []
        self.fields: dict[Path, _Field] = {}
        self.total_sig = 0
        self.lane_sig: dict[Path, int] = {}  # significant characters so far, per lane
        self.reopened = False  # a field released whole grew again
        self.released = 0  # events released
        self.releasable = 0  # events that may be released once inspected
        self.sent: list[bytes] = []  # the bytes released so far (the complete check reads them)
        self.inspected_events = 0
        self.units_seen = self.dups_seen = self.deep_seen = 0
        self.raw_tail = b""
        self.joined_tail: list[TextUnit] = []  # the text the joined read took in, its last window
        self.sig_at_check = 0
        self.last_check = float("-inf")
        self.checks = 0
        self.refused = False

    @property
    def released_bytes(self) -> int:
        return sum(len(b) for b in self.sent)

    # --- input -------------------------------------------------------------------------

    def feed(self, chunk: bytes, now: float) -> Step:
        """Bytes from the upstream; returns what may be released now."""
        if self.refused:
            return Step(b"")
        try:
            events = self.parser.feed(chunk)
        except JsonError as exc:
            return self._refuse(withhold(exc.reason, self.runtime.policy.version))
        for event in events:
            self._add(event)
        broken = self._broken()
        if broken is not None:
            return self._refuse(withhold(broken, self.runtime.policy.version))
        return self._advance(now)

    def close(self) -> tuple[FoldedResponse, bytes]:
        """The upstream ended: the whole stream folded (as `fold_stream` folds it: an
        unclean end is incomplete) and every byte a release would send, for the complete
        check."""
        try:
            events, clean = self.parser.close()
        except JsonError as exc:
            return FoldedResponse.unreadable(exc.reason), b""
        for event in events:
            self._add(event)
        if self.reopened:
            return FoldedResponse.unreadable(ReasonCode.UPSTREAM_INVALID_RESPONSE), b"".join(self.sent)
        folded = self.folder.result(tuple(self.events)).ended(clean)
        rest = sse.frame(self.carrier.released_events(self.events[self.released :], self.usage_injected))
        return folded, b"".join(self.sent) + rest  # exactly what the client has, and what it would get

    def _broken(self) -> str | None:
        folder = self.folder
        if folder.broken is not None:
            return folder.broken
        if self.reopened:
            return ReasonCode.UPSTREAM_INVALID_RESPONSE  # a field taken as ended went on
        if folder.is_error:
            return ReasonCode.RESPONSE_INCOMPLETE  # the provider gave up mid-answer
        return None

    def _add(self, event: SSEEvent) -> None:
        n = len(self.events)
        self.events.append(event)
        pieces = self.folder.pieces
        self.folder.add(n, event)
        grew: list[_Contribution] = []
        for path, parts in pieces.items():
            field = self.fields.get(path)
            if field is None:
                lane = _lane(path)
                field = self.fields[path] = _Field(lane, _enclosing(lane))
            if len(parts) == field.parts_seen:
                continue
            added = "".join(parts[field.parts_seen :])
            field.parts_seen = len(parts)
            if not added:
                continue
            if field.length and field.released == field.length:
                self.reopened = True  # released whole (as a label, or as quiet): it had ended
            field.chunks.append(added)
            field.length += len(added)
            sig = significant(added)
            field.sig += sig
            self.total_sig += sig
            for lane in field.enclosing:
                self.lane_sig[lane] = self.lane_sig.get(lane, 0) + sig
            field.last_growth = self.lane_sig[field.lane]
            field.last_event = n
            held = not (path and path[-1] in LABELS)
            grew.append(_Contribution(path, field.sig, field.length, held))
        self.contributions.append(tuple(grew))

    # --- release -----------------------------------------------------------------------

    def _releasable(self, k: int) -> bool:
        last = len(self.events) - 1
        for c in self.contributions[k]:
            field = self.fields[c.path]
            if not c.held:
                if c.path[-1] == "name" and field.last_event >= last:
                    return False  # model text: whole only once another event has followed
                continue
            if field.sig - c.sig_end >= self.window:
                continue  # the window after it has arrived
            if self.lane_sig[field.lane] - field.last_growth >= self.window:
                continue  # quiet: the window arrived elsewhere in its lane since it last grew
            return False
        return True

    def _advance(self, now: float) -> Step:
        limit = self.releasable  # once releasable, an event stays so: its window only grows
        while limit < len(self.events) and self._releasable(limit):
            limit += 1
        self.releasable = limit
        if limit == self.released:
            return Step(b"")
        due = (
            self.released == 0  # the first events (headers of the answer) go at once
            or self.total_sig - self.sig_at_check >= self.step
            or now - self.last_check >= self.interval_s
        )
        if not due:
            return Step(b"")
        started = time.perf_counter()
        verdict = self._inspect(now)
        seconds = time.perf_counter() - started
        if not verdict.allowed:
            return self._refuse(verdict, seconds)
        return Step(self._release_through(limit), None, seconds)

    def _release_through(self, limit: int) -> bytes:
        chosen = self.carrier.released_events(self.events[self.released : limit], self.usage_injected)
        for k in range(self.released, limit):
            for c in self.contributions[k]:
                field = self.fields[c.path]
                field.released = max(field.released, c.len_end)
        self.released = limit
        out = sse.frame(chosen)
        self.sent.append(out)
        return out

    def _refuse(self, verdict: Verdict, seconds: float = 0.0) -> Step:
        self.refused = True
        return Step(b"", verdict, seconds)

    # --- inspection --------------------------------------------------------------------

    def _inspect(self, now: float) -> Verdict:
        found = self.folder.found
        units: list[TextUnit] = list(found.units[self.units_seen :])
        dups = found.dups[self.dups_seen :]
        deep = found.deep[self.deep_seen :]
        new_events = self.carrier.released_events(self.events[self.inspected_events :], self.usage_injected)
        frames = sse.frame(new_events)
        raw = self.raw_tail + frames
        for path, field in self.fields.items():
            if field.inspected == field.length and field.released == field.length:
                continue
            whole = field.text
            at = min(field.inspected, field.released)
            # the window before the first character not yet read, less what is held anyway
            need = self.window - significant(whole[at : field.inspected])
            text = whole[self._slice_start(whole, at, need) :]
            units.append(TextUnit(path, text, "folded"))
            if "\\" in text and starts_json(whole):
                units.append(TextUnit(path, json_string_text(text), "embedded"))
        subject = Subject(
            raw=raw,
            units=units,
            duplicate_keys=dups,
            too_deep=deep,
            extra_units=header_units(self.headers) if self.checks == 0 else (),
            joined_before=self.joined_tail,
        )
        verdict = inspect(self.runtime, subject, self.profile_id)
        if self.joined_window:
            self.joined_tail = self._tail([*self.joined_tail, *(u for u in units if joinable(u))])
        self.checks += 1
        self.units_seen, self.dups_seen, self.deep_seen = len(found.units), len(found.dups), len(found.deep)
        self.inspected_events = len(self.events)
        self.raw_tail = raw[-self.window :] if self.window else b""
        for field in self.fields.values():
            field.inspected = field.length
        self.sig_at_check = self.total_sig
        self.last_check = now
        return verdict

    def _tail(self, units: list[TextUnit]) -> list[TextUnit]:
        """The last `joined_window` significant characters of `units` read in order (the
        first one kept cut at the front): what a configured value split over the next
        check's text and this one's can start with (twice its longest wire form). Text
        outside the folded fields (a logprobs token, a member no one named, text a start
        event already holds) has no field to hold it back, so without this an event's
        half and the next one's would never be read together."""
        kept: list[TextUnit] = []
        need = self.joined_window
        for unit in reversed(units):
            if need <= 0:
                break
            size = significant(unit.text)
            if size > need:  # cut exactly: the joined read runs configured values only, no word rule
                unit = unit._replace(text=unit.text[_back_by(unit.text, len(unit.text), need) :])
            kept.append(unit)
            need -= size
        kept.reverse()
        return kept

    def _slice_start(self, text: str, at: int, need: int) -> int:
        """Where to start reading `text` so that `need` significant characters before `at`
        are read too, at a whitespace boundary (or the start)."""
        start = _back_by(text, at, need)
        if start == 0 or start == len(text):
            return start
        cut = max(text.rfind(ch, 0, start) for ch in " \n\t\r")
        return cut + 1 if cut >= 0 else 0
