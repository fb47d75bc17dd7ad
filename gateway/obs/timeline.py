"""A bounded, in-memory, per-process record of usage tokens and decisions over time, for
the /ui/ pages (Prometheus holds the same counters without their history).

Owns: one-minute buckets of usage tokens by kind and provenance, and of check decisions by
phase, decision, reason code, route and profile — the last `keep` minutes only, and at most
`max_keys` distinct keys a bucket (past that the rest are counted as `dropped`).
Must not: hold content, request, principal, scope or session ids. Every key is a bounded
label (a kind, a provenance, a decision, a reason code, a route template, a profile id).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

UsageKey = tuple[str, str, str]  # (kind, provenance, profile)
DecisionKey = tuple[str, str, str, str, str]  # (phase, decision, reason, route, profile)


class Timeline:
    def __init__(self, *, bucket_s: int = 60, keep: int = 24 * 60, max_keys: int = 512) -> None:
        self.bucket_s = bucket_s
        self.keep = keep  # buckets kept: a day of minutes
        self.max_keys = max_keys  # distinct keys a bucket holds
        self._usage: OrderedDict[int, dict[UsageKey, int]] = OrderedDict()
        self._decisions: OrderedDict[int, dict[DecisionKey, int]] = OrderedDict()
        self.dropped = 0

    def _bucket(self, table: OrderedDict[int, Any], now: float) -> Any:
        start = int(now // self.bucket_s) * self.bucket_s
        bucket = table.get(start)
        if bucket is None:
            bucket = table[start] = {}
            while len(table) > self.keep:
                table.popitem(last=False)
        return bucket

    def _count(self, bucket: dict[Any, int], key: Any, value: int) -> None:
        if key not in bucket and len(bucket) >= self.max_keys:
            self.dropped += 1
            return
        bucket[key] = bucket.get(key, 0) + value

    def note_usage(self, now: float, kind: str, provenance: str, profile: str, value: int) -> None:
        self._count(self._bucket(self._usage, now), (kind, provenance, profile), value)

    def note_decision(
        self, now: float, phase: str, decision: str, reasons: tuple[str, ...], route: str, profile: str
    ) -> None:
        bucket = self._bucket(self._decisions, now)
        for reason in reasons or ("none",):
            self._count(bucket, (phase, decision, reason, route, profile), 1)

    def snapshot(self, since: float = 0.0) -> dict[str, Any]:
        """Buckets at or after `since`, oldest first, as JSON."""
        usage = [
            {
                "start": start,
                "counts": [
                    {"kind": k, "provenance": p, "profile": prof, "tokens": v}
                    for (k, p, prof), v in sorted(bucket.items())
                ],
            }
            for start, bucket in self._usage.items()
            if start + self.bucket_s > since
        ]
        decisions = [
            {
                "start": start,
                "counts": [
                    {"phase": ph, "decision": d, "reason": r, "route": route, "profile": prof, "count": v}
                    for (ph, d, r, route, prof), v in sorted(bucket.items())
                ],
            }
            for start, bucket in self._decisions.items()
            if start + self.bucket_s > since
        ]
        return {"bucketSeconds": self.bucket_s, "usage": usage, "decisions": decisions, "dropped": self.dropped}
