"""Usage accounting's vocabulary (SPEC §9). PURE.

Owns: the disjoint token kinds a usage record has — uncached input, cache read, cache
write (5 min / 1 h where reported), output, reasoning (a part of output) — each a `Count`
that is `known` (the provider said so), `estimated` (the profile's estimator, only where
the profile asks) or `unknown`; totals with an unknown part are unknown, never summed as
zero; the `UsageRecord` of one upstream attempt; and the profile's `usage_fields` filter
(only fields the profile says its target reports are believed). Each carrier normalises
its own provider's usage object into these kinds; the proxy projects records from a
call's trail; ledgers aggregate them.
Must not: change bytes on the wire or decide anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Provenance = Literal["known", "estimated", "unknown"]
KINDS = (
    "input_total",
    "input_uncached",
    "cache_read",
    "cache_write",
    "cache_write_5m",
    "cache_write_1h",
    "output",
    "reasoning",
)


@dataclass(frozen=True, slots=True)
class Count:
    value: int | None
    provenance: Provenance

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value, "provenance": self.provenance}


UNKNOWN = Count(None, "unknown")


# A count no call reaches (about 1.1e12 tokens): a larger one is not usage but a broken or
# hostile figure, and as unknown it cannot overflow the ledgers' 64-bit sums.
MAX_COUNT = 2**40


def known(value: Any) -> Count:
    return Count(value, "known") if type(value) is int and 0 <= value <= MAX_COUNT else UNKNOWN


def total(*parts: Count) -> Count:
    """A sum is known only when every part is; estimated if any part is estimated."""
    if any(p.value is None for p in parts):
        return UNKNOWN
    prov: Provenance = "estimated" if any(p.provenance == "estimated" for p in parts) else "known"
    return Count(sum(p.value for p in parts if p.value is not None), prov)


def minus(whole: Count, *parts: Count) -> Count:
    if whole.value is None or any(p.value is None for p in parts):
        return UNKNOWN
    rest = whole.value - sum(p.value for p in parts if p.value is not None)
    return Count(rest, whole.provenance) if rest >= 0 else UNKNOWN


def get(obj: Any, *path: str) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, dict) else None
    return obj


def all_unknown() -> dict[str, Count]:
    return {kind: UNKNOWN for kind in KINDS}


def believed(usage: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """`usage` with only the fields the profile says its target reports (`usage_fields`;
    empty: every field). A figure a target does not really report — a compatible server
    that always says `cached_tokens: 0` — is then unknown, never a misleading zero."""
    if not fields:
        return dict(usage)
    out: dict[str, Any] = {}
    for key, value in usage.items():
        if isinstance(value, Mapping):
            inner = believed(value, fields)
            if inner:
                out[key] = inner
        elif key in fields:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    attempt: int
    profile: str
    carrier: str
    outcome: str  # the call's Outcome for its last attempt, else the attempt's AttemptOutcome
    status: int | None
    counts: dict[str, Count]
    estimator: str | None = None  # name@version, when any figure is estimated
    account: str | None = None  # the profile's provider account and region (labels from its signed config)
    region: str | None = None
    cache_plan: tuple[str, ...] = ()  # which cache plan and why (content-free cachepace.EVIDENCE tags)
    cache_prices: str | None = None  # name@version of the cache prices it was planned by

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "attempt": self.attempt,
            "profile": self.profile,
            "carrier": self.carrier,
            "outcome": self.outcome,
            "status": self.status,
            "estimator": self.estimator,
            "account": self.account,
            "region": self.region,
            "cache_plan": list(self.cache_plan),
            "cache_prices": self.cache_prices,
            **{k: self.counts[k].as_json() for k in KINDS},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> UsageRecord:
        """The inverse of `as_json` (a ledger that stores records reads them back)."""
        counts = {k: Count(doc[k]["value"], doc[k]["provenance"]) for k in KINDS}
        return cls(
            request_id=doc["request_id"],
            attempt=doc["attempt"],
            profile=doc["profile"],
            carrier=doc["carrier"],
            outcome=doc["outcome"],
            status=doc["status"],
            counts=counts,
            estimator=doc["estimator"],
            account=doc["account"],
            region=doc["region"],
            cache_plan=tuple(doc.get("cache_plan") or ()),  # records stored before plans had evidence
            cache_prices=doc.get("cache_prices"),
        )


def with_estimates(
    counts: dict[str, Count], *, input_estimate: int | None, output_estimate: int | None, estimator: str
) -> tuple[dict[str, Count], str | None]:
    """Fill unknown input/output totals with estimates (only where the profile asks)."""
    filled = dict(counts)
    used = False
    if filled["input_total"].value is None and input_estimate is not None:
        filled["input_total"] = Count(input_estimate, "estimated")
        used = True
    if filled["output"].value is None and output_estimate is not None:
        filled["output"] = Count(output_estimate, "estimated")
        used = True
    return filled, estimator if used else None
