"""The inspection engine: one decision over raw bytes and decoded text units.

Owns: running the compiled matcher over (a) the exact bytes that will leave, (b) every
decoded text unit a carrier produced (strings, keys, numbers, embedded JSON, joined parts,
folded stream fields) and (c) an NFKC / zero-width-stripped copy of every non-ASCII unit;
turning hits into findings located by JSON pointer; and folding findings, duplicate keys,
opaque content and incompleteness into one `Verdict`.
Must not: do I/O, catch its own failures (the caller turns any exception into `withhold`),
or put matched text anywhere.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.carriers.base import TextUnit
from gateway.inspection import verdict as rc
from gateway.inspection.rules import LITERAL, Hit, Matcher
from gateway.inspection.verdict import Finding, Verdict, decide

# Characters that render as nothing and are dropped from the normalised copy, so a value
# interleaved with them is still seen.
_ZERO_WIDTH = re.compile("[\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u2061\u2062\u2063\u2064]")
_SEPARATOR = "\x00"  # never part of a configured value; a boundary for every format rule


@dataclass(frozen=True, slots=True)
class Subject:
    """Everything the engine looks at for one phase of one call."""

    raw: bytes | None  # the exact bytes that leave (None: the carrier says raw is not text)
    units: Sequence[TextUnit]
    opaque: Sequence[str] = ()
    duplicate_keys: Sequence[str] = ()
    complete: bool = True
    incomplete_reasons: tuple[str, ...] = ()
    extra_units: Sequence[TextUnit] = field(default=())  # e.g. forwarded header values


@dataclass(frozen=True, slots=True)
class FormatInfo:
    id: str
    advisory: bool
    reason: str  # the reason code a finding carries: secret_format:<id> or pii:<kind>


class Engine:
    def __init__(
        self,
        matcher: Matcher,
        formats: Sequence[FormatInfo],
        *,
        policy_version: str,
    ) -> None:
        self.matcher = matcher
        self.formats = tuple(formats)
        self.policy_version = policy_version

    def inspect(self, subject: Subject, *, allow_opaque: bool = False) -> Verdict:
        findings: dict[tuple[str, str | None], Finding] = {}
        withhold: list[str] = []
        truncated = False
        if subject.raw is not None:
            result = self.matcher.scan(subject.raw)
            truncated |= result.truncated
            for hit in result.hits:
                self._add(findings, hit, None)
        units = [*subject.units, *subject.extra_units]
        truncated |= self._scan_units(units, findings)
        normalised = [
            TextUnit(u.path, n, u.kind) for u in units if not u.text.isascii() and (n := _normalise(u.text)) != u.text
        ]
        if normalised:
            truncated |= self._scan_units(normalised, findings)
        complete = subject.complete
        if not subject.complete:
            withhold.extend(subject.incomplete_reasons or (rc.RESPONSE_INCOMPLETE,))
        if subject.duplicate_keys:
            withhold.append(rc.DUPLICATE_KEY)
        if subject.opaque and not allow_opaque:
            complete = False
            withhold.append(rc.OPAQUE_CONTENT)
        if truncated:
            complete = False
            withhold.append(rc.MATCH_LIMIT)
        return decide(
            list(findings.values()),
            withhold_reasons=withhold,
            complete=complete,
            policy_version=self.policy_version,
        )

    def _scan_units(self, units: Sequence[TextUnit], findings: dict[tuple[str, str | None], Finding]) -> bool:
        if not units:
            return False
        buf = _SEPARATOR.join(u.text for u in units).encode("utf-8", "surrogatepass")
        result = self.matcher.scan(buf)
        if result.hits:
            starts = _byte_starts(units)
            for hit in result.hits:
                unit = units[bisect.bisect_right(starts, hit.start) - 1]
                self._add(findings, hit, unit.pointer)
        return result.truncated

    def _add(self, findings: dict[tuple[str, str | None], Finding], hit: Hit, pointer: str | None) -> None:
        if hit.kind == LITERAL:
            finding = Finding(rc.SECRET_VALUE, pointer)
        else:
            info = self.formats[hit.index]
            finding = Finding(info.reason, pointer, info.advisory)
        findings.setdefault((finding.reason, pointer), finding)


def _normalise(text: str) -> str:
    """NFKC without zero-width characters (C-speed checks first: most text needs neither)."""
    if _ZERO_WIDTH.search(text):
        text = _ZERO_WIDTH.sub("", text)
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    return text


def _byte_starts(units: Sequence[TextUnit]) -> list[int]:
    """Byte offset of each unit in the joined buffer (computed only when something hit)."""
    starts: list[int] = []
    at = 0
    for unit in units:
        starts.append(at)
        at += len(unit.text.encode("utf-8", "surrogatepass")) + 1
    return starts
