"""The format material of one policy: catalogue rules (built-in and custom) and detectors,
in one indexable list the matcher compiles and the engine reports from.

Owns: selecting rules (catalogue on/off, disabled ids, ids demoted to advisory, custom
rules), adding enabled detectors with their mode, and the `FormatSource` the engine
builder needs: candidate patterns, windowed confirmation, and the slow engine's scan.
Must not: do I/O (custom rules arrive as bytes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway import vocab
from gateway.inspection import catalogue, detectors
from gateway.inspection.catalogue import Catalogue, Rule
from gateway.inspection.detectors import Detector
from gateway.inspection.engine import FormatInfo


class FormatConfigError(ValueError):
    pass


@dataclass(frozen=True)
class FormatSet:
    """Rules first, then detectors; index i of `infos()` is index i of `patterns()`."""

    rules: tuple[Rule, ...]
    detectors: tuple[tuple[Detector, bool], ...]  # (detector, advisory)
    version: str

    def infos(self) -> Sequence[FormatInfo]:
        out = [FormatInfo(r.id, r.advisory, vocab.secret_format(r.id)) for r in self.rules]
        out += [FormatInfo(d.kind, advisory, vocab.pii(d.kind)) for d, advisory in self.detectors]
        return out

    def patterns(self) -> Sequence[str]:
        return [r.pattern for r in self.rules] + [d.pattern for d, _ in self.detectors]

    def widths(self) -> list[tuple[str, int]]:
        """(id, the longest text it can match) for every rule and detector."""
        return [(r.id, r.max_width) for r in self.rules] + [(d.kind, d.max_width) for d, _ in self.detectors]

    def confirm(self, index: int, data: bytes, end: int) -> list[tuple[int, int]]:
        if index < len(self.rules):
            return [(m.start, m.end) for m in catalogue.confirm_in_window(self.rules[index], data, end)]
        detector, _ = self.detectors[index - len(self.rules)]
        return detectors.confirm_in_window(detector, data, end)

    def full_scan(self, data: bytes) -> list[tuple[int, int, int]]:
        ids = {r.id: i for i, r in enumerate(self.rules)}
        out = [
            (ids[m.rule_id], m.start, m.end)
            for m in catalogue.reference_scan(Catalogue(self.version, self.rules), data)
        ]
        for j, (detector, _) in enumerate(self.detectors):
            out.extend((len(self.rules) + j, s, e) for s, e in detectors.full_scan(detector, data))
        return out


def build_format_set(
    *,
    use_catalogue: bool,
    disable: Sequence[str],
    advisory: Sequence[str],
    custom: bytes | None,
    detector_modes: Mapping[str, str],
) -> FormatSet:
    base = catalogue.load_catalogue() if use_catalogue else None
    rules = list(base.rules) if base else []
    if custom is not None:
        try:
            extra = catalogue.load_catalogue(custom)
        except catalogue.CatalogueError as exc:
            raise FormatConfigError(f"custom rules: {exc}") from None
        clash = {r.id for r in rules} & {r.id for r in extra.rules}
        if clash:
            raise FormatConfigError(f"custom rules reuse built-in ids: {sorted(clash)}")
        rules += extra.rules
    known = {r.id for r in rules}
    for rule_id in [*disable, *advisory]:
        if rule_id not in known:
            raise FormatConfigError(f"unknown format rule id {rule_id!r}")
    rules = [dataclasses.replace(r, advisory=True) if r.id in advisory else r for r in rules if r.id not in disable]
    chosen: list[tuple[Detector, bool]] = []
    for kind, mode in detector_modes.items():
        if kind not in detectors.DETECTORS:
            raise FormatConfigError(f"unknown detector {kind!r}")
        if mode != "off":
            chosen.append((detectors.DETECTORS[kind], mode == "advisory"))
    version = base.version if base else "none"
    return FormatSet(tuple(rules), tuple(chosen), version)
