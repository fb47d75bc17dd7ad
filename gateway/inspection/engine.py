"""The inspection engine: one decision over raw bytes and decoded text units.

Owns: running the compiled matcher over
  (a) the exact bytes that will leave,
  (b) every decoded text unit a carrier produced (strings, keys, numbers, embedded JSON,
      joined parts, folded stream fields),
  (c) the normalised copy of every unit that has one (tag characters mapped to ASCII,
      default-ignorable, control and format characters removed, NFKC),
  (d) decoded copies of encoded runs inside units (base64, base64url, hex, percent,
      HTML character references, backslash escapes), one level nested, within a budget,
  (e) configured literals over the string units joined in document order (a value split
      across messages, or across a message's name and content);
turning hits into findings located by path; and folding findings, duplicate keys, opaque
content, JSON nested past the decoding budget and incompleteness into one `Verdict`.
Must not: do I/O, catch its own failures (the caller turns any exception into `withhold`),
or put matched text anywhere.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.inspection import decoders
from gateway.inspection.rules import LITERAL, Hit, Matcher, ScanResult
from gateway.inspection.verdict import Finding, Verdict, decide
from gateway.units import KIND_VALUES, STRUCTURAL_FIELDS, Path, TextUnit
from gateway.vocab import ReasonCode

_SEPARATOR = b"\x00"  # never part of a configured value; a boundary for every format rule
# Joined buffers also start with a separator: a bare-form rule consumes the byte before its
# value, so the first text in a buffer needs a neighbour too.
# Units whose text the document holds as text (what a reader reads in order).
JOINABLE = frozenset({"string", "folded"})  # unit kinds the joined read of configured values takes in


def joinable(unit: TextUnit) -> bool:
    """Does the joined read of configured values take this unit in (text, not a member
    that only labels structure)?"""
    return unit.kind in JOINABLE and not (unit.path and unit.path[-1] in STRUCTURAL_FIELDS)


@dataclass(frozen=True, slots=True)
class Subject:
    """Everything the engine looks at for one phase of one call."""

    raw: bytes | None  # the exact bytes that leave (None: the carrier says raw is not text)
    units: Sequence[TextUnit]
    opaque: Sequence[str] = ()
    duplicate_keys: Sequence[str] = ()
    complete: bool = True
    incomplete_reasons: tuple[str, ...] = ()
    extra_units: Sequence[TextUnit] = field(default=())  # e.g. forwarded header names and values
    too_deep: Sequence[str] = ()  # JSON held in strings nested past the decoding budget
    # Text read before this subject (a stream inspected window by window: the tail of what
    # the earlier checks read), taken in only by the joined read of configured values, ahead
    # of this subject's units: a value split across two events is read whole.
    joined_before: Sequence[TextUnit] = ()


@dataclass(frozen=True, slots=True)
class FormatInfo:
    id: str
    advisory: bool
    reason: str  # the reason code a finding carries: secret_format:<id> or pii:<kind>


@dataclass(slots=True)
class _Batch:
    """Texts scanned together (NUL-joined), each remembering the unit it came from: its
    path, or an offset that `resolve` turns into one (decoded copies, which are many and
    seldom hit, find their unit only when a scan needs it)."""

    parts: list[bytes] = field(default_factory=list)
    origins: list[Path | int] = field(default_factory=list)
    resolve: Callable[[int], Path] | None = None

    def add(self, data: bytes, origin: Path | int) -> None:
        self.parts.append(data)
        self.origins.append(origin)

    def size(self) -> int:
        return sum(len(p) for p in self.parts)


class Engine:
    def __init__(
        self,
        matcher: Matcher,
        formats: Sequence[FormatInfo],
        *,
        policy_version: str,
        decode_budget: float = 7.0,
    ) -> None:
        self.matcher = matcher
        self.formats = tuple(formats)
        self.policy_version = policy_version
        # Decoded copies may add at most this multiple of the units' bytes (plus 64 KiB):
        # past it inspection is incomplete and the call is withheld (`decode_limit`). A base64
        # run decodes at four alignments (about three times its length), and base64 of base64
        # of text about five and a quarter in all; a long hex run of digit text (itself a
        # base64 run, and hex again once decoded, each hex run read from two digits) about six
        # and a quarter: seven keeps such payloads readable.
        self.decode_budget = decode_budget

    def inspect(self, subject: Subject, *, allow_opaque: bool = False) -> Verdict:
        findings: dict[tuple[str, Path | None], Finding] = {}
        withhold: list[str] = []
        truncated = False
        if subject.raw is not None:
            truncated |= self._record(self.matcher.scan(subject.raw), findings, None)
        values = [u for u in subject.units if u.kind == KIND_VALUES]
        read = [u for u in subject.units if u.kind != KIND_VALUES] if values else subject.units
        units = [*read, *subject.extra_units]
        if values:
            truncated |= self._scan_values(values, findings)
        if units:
            encoded = [u.text.encode("utf-8", "surrogatepass") for u in units]
            buf = _SEPARATOR + _SEPARATOR.join(encoded)
            locator = _UnitLocator(units, encoded)
            truncated |= self._record(self.matcher.scan(buf), findings, locator)
            normalised, squeezed, squeezed_all = _normalised(units, encoded)
            if normalised.parts:
                truncated |= self._scan_batch(normalised, findings)
            if squeezed.parts:
                truncated |= self._scan_batch(squeezed, findings, literals_only=True)
            budget = int(self.decode_budget * len(buf)) + 65536
            with_nul = [(data, unit.path) for unit, data in zip(units, encoded, strict=True) if b"\x00" in data]
            decoded, over = _decoded(locator, buf, budget, with_nul)
            if decoded.parts:
                truncated |= self._scan_batch(decoded, findings)
                # a value split in parts that were each encoded on their own
                truncated |= self._scan_batch(decoded, findings, literals_only=True, separator=b"")
                nested, over_again = _decoded_again(decoded, budget - decoded.size())
                over |= over_again
                if nested.parts:
                    truncated |= self._scan_batch(nested, findings)
            if over:
                withhold.append(ReasonCode.DECODE_LIMIT)
            if subject.joined_before:
                before = list(subject.joined_before)
                before_encoded = [u.text.encode("utf-8", "surrogatepass") for u in before]
                _, before_squeezed = decoders.encoded_forms([u.text for u in before], before_encoded)
                before_squeezed = [d if q == d else q for d, q in zip(before_encoded, before_squeezed, strict=True)]
                truncated |= self._scan_joined(
                    [*before, *read],
                    [*before_encoded, *encoded[: len(read)]],
                    [*before_squeezed, *squeezed_all[: len(read)]],
                    findings,
                )
            else:
                truncated |= self._scan_joined(read, encoded, squeezed_all, findings)
        complete = subject.complete and not withhold
        if not subject.complete:
            withhold.extend(subject.incomplete_reasons or (ReasonCode.RESPONSE_INCOMPLETE,))
        if subject.duplicate_keys:
            withhold.append(ReasonCode.DUPLICATE_KEY)
        if subject.too_deep:
            complete = False
            withhold.append(ReasonCode.TOO_DEEP)
        if subject.opaque and not allow_opaque:
            complete = False
            withhold.append(ReasonCode.OPAQUE_CONTENT)
        if truncated:
            complete = False
            withhold.append(ReasonCode.MATCH_LIMIT)
        return decide(
            list(findings.values()),
            withhold_reasons=withhold,
            complete=complete,
            policy_version=self.policy_version,
        )

    def _scan_batch(
        self,
        batch: _Batch,
        findings: dict[tuple[str, Path | None], Finding],
        *,
        literals_only: bool = False,
        separator: bytes = _SEPARATOR,
    ) -> bool:
        buf = separator + separator.join(batch.parts)
        result = self.matcher.scan_literals(buf) if literals_only else self.matcher.scan(buf)
        locator = _Locator(batch.parts, batch.origins, len(separator), start=len(separator), resolve=batch.resolve)
        return self._record(result, findings, locator)

    def _scan_values(self, values: Sequence[TextUnit], findings: dict[tuple[str, Path | None], Finding]) -> bool:
        """Configured literals (as written, and squeezed) over JSON-in-a-string values read
        in order (`KIND_VALUES`): no format rule, no decoding (each value is a unit of its
        own, or inside one, for those)."""
        batch, squeezed = _Batch(), _Batch()
        encoded = [u.text.encode("utf-8", "surrogatepass") for u in values]
        _, flats = decoders.encoded_forms([u.text for u in values], encoded)
        for unit, data, flat in zip(values, encoded, flats, strict=True):
            batch.add(data, unit.path)
            if flat != data:
                squeezed.add(flat, unit.path)
        truncated = self._scan_batch(batch, findings, literals_only=True)
        if squeezed.parts:
            truncated |= self._scan_batch(squeezed, findings, literals_only=True)
        return truncated

    def _scan_joined(
        self,
        units: Sequence[TextUnit],
        encoded: Sequence[bytes],
        squeezed_all: Sequence[bytes],
        findings: dict[tuple[str, Path | None], Finding],
    ) -> bool:
        """Configured literals over the document's text read in order, with no boundary
        between units and without the members that only label structure — once with names
        (a value split across a message's name and content), once without (a value split
        across two tool calls has a tool name between its halves). Format rules are not run
        here: they could match across a boundary that a reader does see."""
        chosen = [i for i, u in enumerate(units) if joinable(u)]
        if len(chosen) < 2:
            return False
        texts = [units[i] for i in chosen]
        parts = [encoded[i] for i in chosen]
        squeezed = [squeezed_all[i] for i in chosen]
        origins = [u.path for u in texts]
        truncated = self._scan_in_order(parts, squeezed, origins, findings)
        named = [i for i, u in enumerate(texts) if u.path[-1:] != ("name",)]
        if 2 <= len(named) < len(texts):
            truncated |= self._scan_in_order(
                [parts[i] for i in named], [squeezed[i] for i in named], [origins[i] for i in named], findings
            )
        return truncated

    def _scan_in_order(
        self,
        parts: list[bytes],
        squeezed: list[bytes],
        origins: list[Path],
        findings: dict[tuple[str, Path | None], Finding],
    ) -> bool:
        truncated = self._record(self.matcher.scan_literals(b"".join(parts)), findings, _Locator(parts, origins, 0))
        if squeezed != parts:
            result = self.matcher.scan_literals(b"".join(squeezed))
            truncated |= self._record(result, findings, _Locator(squeezed, origins, 0))
        return truncated

    def _record(
        self, result: ScanResult, findings: dict[tuple[str, Path | None], Finding], locator: _Locator | None
    ) -> bool:
        for hit in result.hits:
            self._add(findings, hit, locator.origin(hit.start) if locator is not None else None)
        return result.truncated

    def _add(self, findings: dict[tuple[str, Path | None], Finding], hit: Hit, path: Path | None) -> None:
        if hit.kind == LITERAL:
            finding = Finding(ReasonCode.SECRET_VALUE, path)
        else:
            info = self.formats[hit.index]
            finding = Finding(info.reason, path, info.advisory)
        findings.setdefault((finding.reason, path), finding)


class _Locator:
    """Maps an offset in a joined buffer back to the unit it came from (built lazily: only
    scans that hit need it)."""

    __slots__ = ("_parts", "_origins", "_sep", "_start", "_starts", "_resolve")

    def __init__(
        self,
        parts: Sequence[bytes],
        origins: Sequence[Path | int],
        separator: int = 1,
        start: int = 0,
        resolve: Callable[[int], Path] | None = None,
    ) -> None:
        self._parts, self._origins, self._sep, self._start = parts, origins, separator, start
        self._starts: list[int] | None = None
        self._resolve = resolve

    def _offsets(self) -> list[int]:
        starts: list[int] = []
        at = self._start
        for part in self._parts:
            starts.append(at)
            at += len(part) + self._sep
        return starts

    def origin(self, offset: int) -> Path:
        if self._starts is None:
            self._starts = self._offsets()
        found = self._origins[max(0, bisect.bisect_right(self._starts, offset) - 1)]
        if isinstance(found, int):  # an offset in the units' buffer (a Path is a tuple)
            assert self._resolve is not None
            return self._resolve(found)
        return found


class _UnitLocator(_Locator):
    """The units' buffer (it starts with a separator): the paths are read off the units
    only for the offsets asked about."""

    __slots__ = ("_units",)

    def __init__(self, units: Sequence[TextUnit], encoded: Sequence[bytes]) -> None:
        super().__init__(encoded, (), start=1)
        self._units = units

    def origin(self, offset: int) -> Path:
        if self._starts is None:
            self._starts = self._offsets()
        return self._units[max(0, bisect.bisect_right(self._starts, offset) - 1)].path


def _normalised(units: Sequence[TextUnit], encoded: list[bytes]) -> tuple[_Batch, _Batch, list[bytes]]:
    """The normalised copy of every unit that reads differently once normalised (for every
    rule), the squeezed copy where it differs again (for configured literals), and every
    unit's squeezed form (its encoded text when nothing changes)."""
    batch, literal = _Batch(), _Batch()
    squeezed_all: list[bytes] = []
    normals, squeezeds = decoders.encoded_forms([u.text for u in units], encoded)
    for unit, data, normal, squeezed in zip(units, encoded, normals, squeezeds, strict=True):
        if normal != data:
            batch.add(normal, unit.path)
        if squeezed != normal:
            literal.add(squeezed, unit.path)
        squeezed_all.append(data if squeezed == data else squeezed)
    return batch, literal, squeezed_all


def _decoded(
    locator: _UnitLocator, buf: bytes, budget: int, with_nul: Sequence[tuple[bytes, Path]] = ()
) -> tuple[_Batch, bool]:
    """Decoded copies of the encoded runs in every unit (`buf`, located by `locator`),
    within `budget` bytes. Returns the copies and whether the budget ran out. `with_nul`:
    the units whose own text holds a NUL (the separator between units in `buf`, which
    ends a text decoding's segment), each also decoded whole without its NULs."""
    batch = _Batch(resolve=locator.origin)
    used = 0
    for offset, decoded in decoders.run_decodings(buf):
        used += len(decoded)
        if used > budget:
            return batch, True
        batch.add(decoded, offset)
    for start, joined in decoders.wrapped_blocks(buf):  # base64 wrapped in lines, read whole
        for _, decoded in decoders.run_decodings(joined):
            used += len(decoded)
            if used > budget:
                return batch, True
            batch.add(decoded, start)
    for start, end in decoders.trigger_segments(buf):
        for decoded in decoders.text_decodings(buf[start:end]):
            used += len(decoded)
            if used > budget:
                return batch, True
            batch.add(decoded, start)
    for data, path in with_nul:
        whole = data.replace(b"\x00", b"")
        if decoders.TEXT_TRIGGER.search(whole) is None:
            continue
        for decoded in decoders.text_decodings(whole):
            used += len(decoded)
            if used > budget:
                return batch, True
            batch.add(decoded, path)
    return batch, False


def _decoded_again(first: _Batch, budget: int) -> tuple[_Batch, bool]:
    """One level of nesting: the encoded runs inside decoded copies that are text (and the
    normalised form of that text), within what is left of the budget."""
    batch = _Batch(resolve=first.resolve)
    used = 0
    for data, origin in zip(first.parts, first.origins, strict=True):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # binary (a decoded image, a hash): scanned as it is, nothing nested in it
        copies: list[bytes] = [d for _, d in decoders.run_decodings(data)]
        if decoders.TEXT_TRIGGER.search(data):
            copies.extend(decoders.text_decodings(data))
        squeezed = decoders.squeeze_encoded(decoders.normalise_encoded(data, text))
        if squeezed != data:
            copies.append(squeezed)
        for copy in copies:
            used += len(copy)
            if used > budget:
                return batch, True
            batch.add(copy, origin)
    return batch, False
