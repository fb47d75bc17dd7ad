"""The usage ledger: every usage record, aggregated for the report.

Owns: the `UsageLedger` interface and its in-memory form (totals per profile and kind,
split by provenance; the most recent records, bounded).
Must not: hold content, or anything keyed by scope or principal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.usage import KINDS, UsageRecord


class UsageLedger(Protocol):
    async def add(self, record: UsageRecord) -> None: ...

    async def recent(self) -> list[UsageRecord]: ...

    async def report(self) -> dict[str, Any]: ...


@dataclass
class _ProfileTotals:
    records: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> provenance -> n

    def add(self, record: UsageRecord) -> None:
        self.records += 1
        self.outcomes[record.outcome] = self.outcomes.get(record.outcome, 0) + 1
        for kind in KINDS:
            count = record.counts[kind]
            slot = self.tokens.setdefault(kind, {"known": 0, "estimated": 0, "unknown_records": 0})
            if count.value is None:
                slot["unknown_records"] += 1
            else:
                slot[count.provenance] += count.value


class MemoryUsageLedger:
    """Aggregates per profile (never per scope or principal) for the usage report, in one
    process, with the most recent records (bounded)."""

    def __init__(self, keep_recent: int = 200) -> None:
        self._profiles: dict[str, _ProfileTotals] = {}
        self._recent: list[UsageRecord] = []
        self._keep = keep_recent

    async def add(self, record: UsageRecord) -> None:
        self._profiles.setdefault(record.profile, _ProfileTotals()).add(record)
        self._recent.append(record)
        if len(self._recent) > self._keep:
            del self._recent[: len(self._recent) - self._keep]

    async def recent(self) -> list[UsageRecord]:
        return list(self._recent)

    async def report(self) -> dict[str, Any]:
        return {
            "schema": "wiregate.usage-report.v1",
            "kinds": list(KINDS),
            "profiles": {
                pid: {
                    "records": t.records,
                    "outcomes": dict(t.outcomes),
                    "tokens": {k: dict(v) for k, v in t.tokens.items()},
                }
                for pid, t in sorted(self._profiles.items())
            },
        }
