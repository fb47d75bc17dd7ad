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

    def scan(self, data: bytes) -> ScanResult: ...


def _escape(literal: bytes) -> bytes:
    return b"".join(b"\\x%02x" % c for c in literal)


class HyperscanMatcher:
    """One Hyperscan database: literal forms (single-match, exact length) then formats."""

    engine = "hyperscan"

    def __init__(
        self,
        literal_forms: Sequence[tuple[int, bytes]],
        formats: Sequence[FormatRule],
        confirm: Confirm,
        *,
        max_matches: int,
    ) -> None:
        import hyperscan  # the engine of record; import failure is handled by the caller

        self._hs = hyperscan
        self._owner = [owner for owner, _ in literal_forms]
        self._length = [len(form) for _, form in literal_forms]
        self._n_literals = len(literal_forms)
        self._confirm = confirm
        self._max = max_matches
        expressions = [_escape(form) for _, form in literal_forms]
        flags = [hyperscan.HS_FLAG_SINGLEMATCH] * len(expressions)
        expressions += [rule.pattern.encode("ascii") for rule in formats]
        flags += [0] * len(formats)
        self._db: Any = None
        if expressions:
            db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
            db.compile(
                expressions=expressions,
                ids=list(range(len(expressions))),
                elements=len(expressions),
                flags=flags,
            )
            self._db = db
        self._local = threading.local()

    def _scratch(self) -> Any:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._hs.Scratch(self._db)
        return scratch

    def scan(self, data: bytes) -> ScanResult:
        if self._db is None or not data:
            return ScanResult((), False)
        literal_ends: list[tuple[int, int]] = []
        format_ends: dict[int, list[int]] = {}
        n_literals = self._n_literals
        state = [0, False]

        def on_match(ident: int, _from: int, to: int, _flags: int, _ctx: object) -> bool:
            state[0] += 1
            if state[0] > self._max:
                state[1] = True
                return True  # stop scanning: the result is marked incomplete
            if ident < n_literals:
                literal_ends.append((ident, to))
            else:
                format_ends.setdefault(ident - n_literals, []).append(to)
            return False

        try:
            self._db.scan(data, match_event_handler=on_match, scratch=self._scratch())
        except self._hs.ScanTerminated:
            pass
        hits = [Hit(LITERAL, self._owner[i], end - self._length[i], end) for i, end in literal_ends]
        for rule_index, ends in format_ends.items():
            hits.extend(self._confirm_all(rule_index, data, ends))
        return ScanResult(tuple(hits), bool(state[1]))

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
    """The documented slow engine: same hits, roughly 100× slower on large payloads."""

    engine = "python"

    def __init__(
        self,
        literal_forms: Sequence[tuple[int, bytes]],
        full_scan: FullScan,
        *,
        max_matches: int,
    ) -> None:
        self._forms = list(literal_forms)
        self._full_scan = full_scan
        self._max = max_matches

    def scan(self, data: bytes) -> ScanResult:
        hits: list[Hit] = []
        for owner, form in self._forms:
            at = data.find(form)
            if at >= 0:
                hits.append(Hit(LITERAL, owner, at, at + len(form)))
        hits.extend(Hit(FORMAT, i, s, e) for i, s, e in self._full_scan(data))
        truncated = len(hits) > self._max
        return ScanResult(tuple(hits[: self._max]), truncated)
