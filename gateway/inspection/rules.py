"""Compiled matchers: every configured literal and credential-format rule in one database.

Owns: compiling literal byte forms and format patterns once per policy (at configuration
load, never per request) into one Hyperscan block-mode database, scanning a buffer with a
per-thread scratch, and confirming each format candidate in a small window. Also the
documented slow engine (`PythonMatcher`: bytes.find + Python `re`) used only when a policy
explicitly chooses it, with the same results.
Must not: decide anything (the engine does), or expose matched bytes beyond offsets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

LITERAL = 0
FORMAT = 1


@dataclass(frozen=True, slots=True)
class Hit:
    kind: int  # LITERAL or FORMAT
    index: int  # literal index (into the configured values) or format rule index
    start: int
    end: int


class FormatRule(Protocol):
    """What the matcher needs of a credential-format rule."""

    id: str
    pattern: str
    advisory: bool


# confirm(rule_index, data, end) -> [(start, end), ...]: windowed confirmation of a candidate
Confirm = Callable[[int, bytes, int], list[tuple[int, int]]]
# full_scan(data) -> [(rule_index, start, end), ...]: the slow engine's whole-buffer scan
FullScan = Callable[[bytes], list[tuple[int, int, int]]]


@dataclass(frozen=True, slots=True)
class ScanResult:
    hits: tuple[Hit, ...]
    truncated: bool  # the match cap was reached: the scan is not complete


class Matcher(Protocol):
    engine: str

    def scan(self, data: bytes) -> ScanResult:
        """Every literal form and every format rule."""
        ...

    def scan_literals(self, data: bytes) -> ScanResult:
        """Configured literals only (for text joined across units, where a format rule
        could match across a boundary that is not in the document)."""
        ...


# A literal form: (index of the configured value, the bytes to find, match ASCII case-insensitively)
LiteralForm = tuple[int, bytes, bool]


def _escape(literal: bytes) -> bytes:
    return b"".join(b"\\x%02x" % c for c in literal)


def _cap(hits: list[Hit], max_matches: int) -> ScanResult:
    """The match cap, the same for both engines: past `max_matches` confirmed hits the
    scan is reported incomplete (and the engine withholds)."""
    if len(hits) > max_matches:
        return ScanResult(tuple(hits[:max_matches]), True)
    return ScanResult(tuple(hits), False)


class HyperscanMatcher:
    """Two Hyperscan databases: every literal form (single-match, exact length) then the
    format rules; and the literal forms alone.

    Two bounds: the match cap on confirmed hits (`max_matches`, identical in the slow
    engine), and a guard on raw candidate callbacks (`max_candidates`) that bounds the
    confirmation work a pathological input can cause; past it the scan stops and is
    reported incomplete."""

    engine = "hyperscan"

    def __init__(
        self,
        literal_forms: Sequence[LiteralForm],
        formats: Sequence[FormatRule],
        confirm: Confirm,
        *,
        max_matches: int,
        max_candidates: int | None = None,
    ) -> None:
        import hyperscan  # the engine of record; import failure is handled by the caller

        self._hs = hyperscan
        self._owner = [owner for owner, _, _ in literal_forms]
        self._length = [len(form) for _, form, _ in literal_forms]
        self._n_literals = len(literal_forms)
        self._confirm = confirm
        self._max = max_matches
        self._max_candidates = max_candidates if max_candidates is not None else 16 * max_matches
        literal_exprs = [_escape(form) for _, form, _ in literal_forms]
        literal_flags = [
            hyperscan.HS_FLAG_SINGLEMATCH | (hyperscan.HS_FLAG_CASELESS if caseless else 0)
            for _, _, caseless in literal_forms
        ]
        expressions = literal_exprs + [rule.pattern.encode("ascii") for rule in formats]
        flags = literal_flags + [0] * len(formats)
        self._db = self._compile(expressions, flags)
        self._literal_db = self._compile(literal_exprs, literal_flags)
        self._local = threading.local()

    def _compile(self, expressions: list[bytes], flags: list[int]) -> Any:
        if not expressions:
            return None
        db = self._hs.Database(mode=self._hs.HS_MODE_BLOCK)
        db.compile(expressions=expressions, ids=list(range(len(expressions))), elements=len(expressions), flags=flags)
        return db

    def _scratch(self, which: str, db: Any) -> Any:
        scratch = getattr(self._local, which, None)
        if scratch is None:
            scratch = self._hs.Scratch(db)
            setattr(self._local, which, scratch)
        return scratch

    def scan(self, data: bytes) -> ScanResult:
        return self._scan(self._db, "scratch", data)

    def scan_literals(self, data: bytes) -> ScanResult:
        return self._scan(self._literal_db, "literal_scratch", data)

    def _scan(self, db: Any, which: str, data: bytes) -> ScanResult:
        if db is None or not data:
            return ScanResult((), False)
        literal_ends: list[tuple[int, int]] = []
        format_ends: dict[int, list[int]] = {}
        n_literals = self._n_literals
        limit = self._max_candidates
        state = [0, False]

        def on_match(ident: int, _from: int, to: int, _flags: int, _ctx: object) -> bool:
            state[0] += 1
            if state[0] > limit:
                state[1] = True
                return True  # stop scanning: the result is marked incomplete
            if ident < n_literals:
                literal_ends.append((ident, to))
            else:
                format_ends.setdefault(ident - n_literals, []).append(to)
            return False

        try:
            db.scan(data, match_event_handler=on_match, scratch=self._scratch(which, db))
        except self._hs.ScanTerminated:
            pass
        hits = [Hit(LITERAL, self._owner[i], end - self._length[i], end) for i, end in literal_ends]
        for rule_index, ends in format_ends.items():
            hits.extend(self._confirm_all(rule_index, data, ends))
        result = _cap(hits, self._max)
        return ScanResult(result.hits, result.truncated or bool(state[1]))

    def _confirm_all(self, rule_index: int, data: bytes, ends: list[int]) -> list[Hit]:
        found: dict[tuple[int, int], None] = {}
        covered_to = -1
        for end in sorted(set(ends)):
            if end <= covered_to:
                continue  # inside a match already confirmed for this rule
            for start, stop in self._confirm(rule_index, data, end):
                found.setdefault((start, stop), None)
                covered_to = max(covered_to, stop)
        return [Hit(FORMAT, rule_index, s, e) for s, e in found]


class PythonMatcher:
    """The documented slow engine: same hits, roughly 100x slower on large payloads. It
    has the same match cap; it has no candidate guard (it is never the engine of record)."""

    engine = "python"

    def __init__(
        self,
        literal_forms: Sequence[LiteralForm],
        full_scan: FullScan,
        *,
        max_matches: int,
    ) -> None:
        self._forms = list(literal_forms)
        self._full_scan = full_scan
        self._max = max_matches

    def _literals(self, data: bytes) -> list[Hit]:
        hits: list[Hit] = []
        lowered: bytes | None = None
        for owner, form, caseless in self._forms:
            if caseless:
                lowered = data.lower() if lowered is None else lowered
                at = lowered.find(form.lower())
            else:
                at = data.find(form)
            if at >= 0:
                hits.append(Hit(LITERAL, owner, at, at + len(form)))
        return hits

    def scan(self, data: bytes) -> ScanResult:
        hits = self._literals(data)
        hits.extend(Hit(FORMAT, i, s, e) for i, s, e in self._full_scan(data))
        return _cap(hits, self._max)

    def scan_literals(self, data: bytes) -> ScanResult:
        return _cap(self._literals(data), self._max)
