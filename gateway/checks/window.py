"""Windowed release of a strict stream (a profile's `release = "windowed"`): events go to
the client as they arrive, each only once every character it adds has been inspected
together with the window of text that follows it.

Theory
------
The carrier folds the stream one event at a time (`Carrier.stream_folder`), field by field,
exactly as a buffered fold would. The window is counted in what every copy the engine
reads holds for certain, however the text decodes. A field's text is cut into words
(`decoders.WORD`: the characters some decoding reads as part of an encoded run) and the
characters between them, each of which reads as itself in every copy. Such a character
counts one when it is significant (what `normalise` keeps: invisible, control and format
characters, combining marks and what NFKC joins to the character before it do not count;
tag characters do). A whole word in which no text decoding can start (no `%`, `&` or
`\\`) counts its length: every copy holds it as it is, and a base64 or hex copy holds that
run alone. One whose only `\\` are JSON's string escapes (`\\n`, `\\"`, `\\u00e9`: tool-call
arguments) counts what it says once they are read, when that holds none of the three. Any
other word counts only what comes before its first `%`, `&` or `\\` (a decoding reads on
from where it starts, never back), and nothing from there on, whatever its length: an
escape, a character reference or a percent-encoded byte may stand for one character or
none, nested in each other at any depth, so neither an encoded secret nor padding of
escapes stretches past the window. The
word at the field's end counts only once something follows it (it may be a run still
arriving), and an event that ends inside a word is followed only by what comes after that
word. Event `k` may be released when, for each field it extends, either

* at least `window` has arrived in that field after it (any match that includes one of
  its characters is then complete, and has been inspected), or
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
them), and for each folded field the slice from `window` (counted as above) before the
first character not yet inspected (or not yet released) to its end, moved back to a
whitespace boundary so that no encoded run (base64, hex, escapes) is cut. Slices are given
in the fold's field order, so configured values split across fields are read joined, as a
buffered check reads them. Any non-allow ends the stream: nothing after the last released
event leaves. The end of the stream is judged by the complete buffered check
(`decide.read_response` + `runner.before_release`) before the held remainder is released.

Cost: inspection runs at most once per `window / 2` new significant characters, or after
`interval_s` with something releasable (or, when nothing is, with new text), each over
about `window` of overlap plus the new text.

Owns: `WindowedRelease`. Must not: do I/O (the flow feeds it bytes and writes what it
returns).
"""

from __future__ import annotations

import dataclasses
import re
import time
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.carriers import sse
from gateway.carriers.base import Carrier, FoldedResponse, starts_json
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.sse import SSEEvent
from gateway.checks.inspect import header_units, inspect
from gateway.config.runtime import Runtime
from gateway.inspection import decoders
from gateway.inspection.engine import Subject, joinable
from gateway.inspection.verdict import Verdict, withhold
from gateway.units import LABEL_FIELDS, Path, TextUnit
from gateway.vocab import ReasonCode

_JSON_STRING_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _joining() -> re.Pattern[str]:
    """The characters `normalise` removes or joins to the one before them, beyond the
    invisible ones: combining marks, what NFKC composes with the character before it (a
    vowel sign, a Hangul vowel or final consonant), and any character whose compatibility
    form starts with one of those (a half-width voiced mark); and lone surrogates (two JSON
    escapes of a pair read as one character). Planes 0-2; plane 14's marks are invisible
    anyway."""
    category, decomposition = unicodedata.category, unicodedata.decomposition
    joining = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V and T jamo
    joining |= set(range(0xD800, 0xE000))
    decomposed: list[tuple[int, str]] = []
    for cp in range(0x80, 0x30000):
        if category(chr(cp)) in ("Mn", "Me"):
            joining.add(cp)
        if form := decomposition(chr(cp)):
            decomposed.append((cp, form))
    for cp, form in decomposed:
        parts = form.split()
        if form[0] != "<" and len(parts) == 2:
            first, second = (chr(int(part, 16)) for part in parts)
            if unicodedata.normalize("NFC", first + second) == chr(cp):
                joining.add(ord(second))
    joining |= {cp for cp, _ in decomposed if ord(unicodedata.normalize("NFKD", chr(cp))[0]) in joining}
    return re.compile("[" + "".join(re.escape(chr(cp)) for cp in sorted(joining)) + "]")


_JOINING = _joining()


def significant(text: str) -> int:
    """Characters that count towards the window: what `normalise` keeps as characters of
    their own."""
    if text.isascii() and text.isprintable():
        return len(text)
    return len(_JOINING.sub("", decoders.INSIGNIFICANT.sub("", text)))


def _word_count(word: str) -> int:
    """What a whole word counts towards the window (see the theory above)."""
    if "\\" in word:  # JSON's escapes: what the word says once read (a JSON reader reads it so)
        read = json_string_text(word)
        if decoders.DECODING_START.search(read) is None:
            return significant(read)
    start = decoders.DECODING_START.search(word)
    return significant(word if start is None else word[: start.start()])


def _counted(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """(position, count) of the words and the runs between them in `text[start:end]`, in
    order. A word cut by `start` or `end` (the text goes on with a word character) counts
    nothing."""
    items: list[tuple[int, int]] = []
    at = start
    word = decoders.WORD
    for m in word.finditer(text, start, end):
        if m.start() > at:
            items.append((at, significant(text[at : m.start()])))
        cut = (m.start() == start and start > 0 and word.match(text, start - 1, start) is not None) or (
            m.end() == end and end < len(text) and word.match(text, end, end + 1) is not None
        )
        items.append((m.start(), 0 if cut else _word_count(m.group())))
        at = m.end()
    if at < end:
        items.append((at, significant(text[at:end])))
    return items


def _back_over(text: str, at: int, need: int) -> int:
    """A position before `at` from which `text` holds at least `need` of the window's count
    up to `at`, at the start of a word or of a run between words (0 when it holds less)."""
    got = 0
    end = at
    size = max(2 * need, 256)
    while end > 0:
        start = max(0, end - size)
        for position, count in reversed(_counted(text, start, end)):
            got += count
            if got >= need:
                return position
        end = start
        size *= 2
    return 0


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


# What some text decoding reads: a percent-encoded byte, a character reference (named ones
# `html.unescape` reads without `;` too) or a backslash escape.
_DECODABLE = re.compile(r"%[0-9A-Fa-f]{2}|&[#A-Za-z]|\\[xuU0-7]")
# One of each kind and how it reads, so that a text decoding applies every kind, in the
# engine's order (the mixed copy keeps percent-encoded bytes that are not UTF-8 as they are).
_EVERY_KIND = b"%25 &amp; \\x5c "
_EVERY_KIND_READ = b"% & \\ "


def decoded_throughout(text: str) -> str:
    """`text` read through every kind of text decoding, twice over (the engine's two levels),
    whether or not the rest of its field holds that kind. The engine chains kinds (a
    percent-encoded reference to a backslash escape) only where the whole unit holds each:
    a slice without a kind that the rest of its field holds would read less than the
    complete check of the whole field will."""
    data = text.encode("utf-8", "surrogatepass")
    for _ in range(2):
        *_, mixed = decoders.text_decodings(_EVERY_KIND + data)
        data = mixed[len(_EVERY_KIND_READ) :]
    return data.decode("utf-8", "replace")


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
    settled: int = 0  # the window's count of its text before the word at its end
    open_word: list[str] | None = None  # the word at its end, as it arrived (None: it ends between words)
    waiting: list[_Contribution] = dataclasses.field(default_factory=list)  # events ending in that word
    last_growth: int = 0  # its lane's significant total when it last grew
    inspected: int = 0  # characters of `text` inspected through
    released: int = 0  # characters of `text` released

    @property
    def text(self) -> str:
        """The field so far (joined once per inspection, not once per delta)."""
        if len(self.chunks) > 1:
            self.chunks = ["".join(self.chunks)]
        return self.chunks[0] if self.chunks else ""


@dataclass(slots=True)
class _Contribution:
    path: Path
    len_end: int  # the field's length after this event
    held: bool  # a label field is never held
    # The field's count (`_Field.settled`) up to where what follows this event begins: the
    # end of the word it ends in, so None while that word is still open.
    followed_from: int | None


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
        self.last_release = float("-inf")
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

    def reported(self) -> tuple[dict[str, Any] | None, str | None]:
        """The provider's usage and the response's id as read so far: what a stream ended
        early still bills (Anthropic's first event holds the input and cache figures)."""
        folder = self.folder
        return (dict(folder.usage) if folder.usage else None), folder.response_id

    def _broken(self) -> str | None:
        folder = self.folder
        if folder.broken is not None:
            return folder.broken
        if self.reopened:
            return ReasonCode.UPSTREAM_INVALID_RESPONSE  # a field taken as ended went on
        if folder.is_error:
            return ReasonCode.RESPONSE_INCOMPLETE  # the provider gave up mid-answer
        return None

    def _settle(self, field: _Field, added: str) -> None:
        """Count `added`, just appended to `field` (see the theory above): each word once it
        is whole, and the events that end inside a word once it is."""
        at = 0
        word = decoders.WORD
        if field.open_word is not None:  # the word at the field's end goes on, or ends here
            m = word.match(added)
            at = m.end() if m is not None else 0
            field.open_word.append(added[:at])
            if at == len(added):
                return
            field.settled += _word_count("".join(field.open_word))
            field.open_word = None
            for c in field.waiting:
                c.followed_from = field.settled
            field.waiting.clear()
        for m in word.finditer(added, at):
            if m.start() > at:
                field.settled += significant(added[at : m.start()])
            if m.end() == len(added):  # it may go on
                field.open_word = [m.group()]
                return
            field.settled += _word_count(m.group())
            at = m.end()
        if at < len(added):
            field.settled += significant(added[at:])

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
            self._settle(field, added)
            sig = significant(added)
            self.total_sig += sig
            for lane in field.enclosing:
                self.lane_sig[lane] = self.lane_sig.get(lane, 0) + sig
            field.last_growth = self.lane_sig[field.lane]
            field.last_event = n
            held = not (path and path[-1] in LABEL_FIELDS)
            followed_from = None if field.open_word is not None else field.settled
            contribution = _Contribution(path, field.length, held, followed_from)
            if contribution.followed_from is None:
                field.waiting.append(contribution)
            grew.append(contribution)
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
            if c.followed_from is not None and field.settled - c.followed_from >= self.window:
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
        new = self.total_sig - self.sig_at_check
        if limit == self.released:
            # Nothing to release (the window still filling, a word running on): new text is
            # read at the same pace all the same, so a finding ends the stream once it is whole.
            if not (new >= self.step or (new and now - self.last_check >= self.interval_s)):
                return Step(b"")
        elif not (self.released == 0 or new >= self.step or now - self.last_release >= self.interval_s):
            return Step(b"")  # the first events (headers of the answer) go at once
        started = time.perf_counter()
        verdict = self._inspect(now)
        seconds = time.perf_counter() - started
        if not verdict.allowed:
            return self._refuse(verdict, seconds)
        if limit == self.released:
            return Step(b"", None, seconds)
        self.last_release = now
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
            # the window before the first character not yet read, and all not yet released
            start = min(_back_over(whole, field.inspected, self.window), field.released)
            text = whole[self._slice_start(whole, start) :]
            units.append(TextUnit(path, text, "folded"))
            read = [text]
            if "\\" in text and starts_json(whole):
                read.append(json_string_text(text))
                units.append(TextUnit(path, read[-1], "embedded"))
            units.extend(TextUnit(path, decoded_throughout(t), "embedded") for t in read if _DECODABLE.search(t))
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

    def _slice_start(self, text: str, start: int) -> int:
        """`start` moved back to a whitespace boundary (or the start of `text`)."""
        if start == 0 or start == len(text):
            return start
        cut = max(text.rfind(ch, 0, start) for ch in " \n\t\r")
        return cut + 1 if cut >= 0 else 0
