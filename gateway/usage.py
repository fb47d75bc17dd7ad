"""Usage accounting: one normalised record per upstream attempt (SPEC §9).

Owns: normalising each provider's usage object into disjoint parts — uncached input, cache
read, cache write (5 min / 1 h where reported), output, reasoning (a part of output) — each
`known` (the provider said so), `estimated` (the profile's estimator, only where the
profile asks) or `unknown`; totals with an unknown part are unknown, never summed as zero.
Also the two stream edits that make accounting complete without changing what the client
asked for: asking an OpenAI chat stream for its usage upstream, and dropping that extra
chunk on release. The ledger aggregates records for the report surface and metrics.
Must not: change or delay a release decision, or fail a request.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.carriers import jsonspan
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent

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


def known(value: Any) -> Count:
    return Count(value, "known") if type(value) is int and value >= 0 else UNKNOWN


def total(*parts: Count) -> Count:
    """A sum is known only when every part is; estimated if any part is estimated."""
    if any(p.value is None for p in parts):
        return UNKNOWN
    prov: Provenance = "estimated" if any(p.provenance == "estimated" for p in parts) else "known"
    return Count(sum(p.value for p in parts if p.value is not None), prov)


def _minus(whole: Count, *parts: Count) -> Count:
    if whole.value is None or any(p.value is None for p in parts):
        return UNKNOWN
    rest = whole.value - sum(p.value for p in parts if p.value is not None)
    return Count(rest, whole.provenance) if rest >= 0 else UNKNOWN


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        obj = obj.get(name) if isinstance(obj, dict) else None
    return obj


def normalise(carrier: str, usage: dict[str, Any] | None) -> dict[str, Count]:
    """The provider's own figures, as disjoint parts. Anything not reported is unknown."""
    if not usage:
        return {kind: UNKNOWN for kind in KINDS}
    if carrier == "anthropic.messages":
        uncached = known(usage.get("input_tokens"))
        read = known(usage.get("cache_read_input_tokens"))
        write = known(usage.get("cache_creation_input_tokens"))
        split = usage.get("cache_creation")
        return {
            "input_total": total(uncached, read, write),
            "input_uncached": uncached,
            "cache_read": read,
            "cache_write": write,
            "cache_write_5m": known(_get(split, "ephemeral_5m_input_tokens")),
            "cache_write_1h": known(_get(split, "ephemeral_1h_input_tokens")),
            "output": known(usage.get("output_tokens")),
            "reasoning": known(_get(usage, "output_tokens_details", "thinking_tokens")),
        }
    if carrier == "openai.embeddings":
        prompt = known(usage.get("prompt_tokens"))
        zero = Count(0, "known")  # embeddings are never cached and produce no output tokens
        return {
            "input_total": prompt,
            "input_uncached": prompt,
            "cache_read": zero,
            "cache_write": zero,
            "cache_write_5m": zero,
            "cache_write_1h": zero,
            "output": zero,
            "reasoning": zero,
        }
    responses = carrier == "openai.responses"
    details = usage.get("input_tokens_details" if responses else "prompt_tokens_details")
    out_details = usage.get("output_tokens_details" if responses else "completion_tokens_details")
    whole = known(usage.get("input_tokens" if responses else "prompt_tokens"))
    read = known(_get(details, "cached_tokens"))
    write = known(_get(details, "cache_write_tokens"))
    return {
        "input_total": whole,  # OpenAI's input includes the cached tokens
        "input_uncached": _minus(whole, read, write),
        "cache_read": read,
        "cache_write": write,
        "cache_write_5m": UNKNOWN,
        "cache_write_1h": UNKNOWN,
        "output": known(usage.get("output_tokens" if responses else "completion_tokens")),
        "reasoning": known(_get(out_details, "reasoning_tokens")),
    }


@dataclass(frozen=True, slots=True)
class UsageRecord:
    request_id: str
    attempt: int
    profile: str
    carrier: str
    outcome: str  # released | blocked | withheld | incomplete | retried | connection_error | timeout | upstream_error
    status: int | None
    counts: dict[str, Count]
    estimator: str | None = None  # name@version, when any figure is estimated

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "attempt": self.attempt,
            "profile": self.profile,
            "carrier": self.carrier,
            "outcome": self.outcome,
            "status": self.status,
            "estimator": self.estimator,
            **{k: self.counts[k].as_json() for k in KINDS},
        }


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


# --- OpenAI chat streams: usage the client did not ask for ------------------------------


def plan_stream_usage(carrier: str, text: str, doc: dict[str, Any]) -> tuple[list[Edit], bool]:
    """Ask a chat stream for its usage upstream when the client did not. Returns the edits
    and whether the usage chunk must be dropped on release."""
    if carrier != "openai.chat" or doc.get("stream") is not True:
        return [], False
    options = doc.get("stream_options")
    if options is None:
        top = jsonspan.locate(text, ())
        return [jsonspan.add_member(text, top, '"stream_options":{"include_usage":true}')], True
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return [], False
    if "include_usage" in options:
        start, end = jsonspan.locate(text, ("stream_options", "include_usage"))
        return [(start, end, "true")], True
    span = jsonspan.locate(text, ("stream_options",))
    return [jsonspan.add_member(text, span, '"include_usage":true')], True


_NULL_USAGE = ',"usage":null}'


def strip_injected_usage(events: Sequence[SSEEvent]) -> list[SSEEvent]:
    """What the client would have received without include_usage: no usage-only chunk and
    no `"usage":null` member on the others (removed only in the exact form OpenAI writes)."""
    out: list[SSEEvent] = []
    for ev in events:
        data = ev.data
        if data != "[DONE]":
            try:
                chunk = json.loads(data)
            except ValueError:
                chunk = None
            if isinstance(chunk, dict) and chunk.get("choices") == [] and chunk.get("usage"):
                continue
            if data.endswith(_NULL_USAGE):
                data = data[: -len(_NULL_USAGE)] + "}"
        out.append(SSEEvent(ev.event, data, ev.id))
    return out


# --- the ledger ------------------------------------------------------------------------


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


class UsageLedger:
    """Aggregates per profile (never per scope or principal) for the usage report."""

    def __init__(self, keep_recent: int = 200) -> None:
        self._profiles: dict[str, _ProfileTotals] = {}
        self._recent: list[UsageRecord] = []
        self._keep = keep_recent

    def add(self, record: UsageRecord) -> None:
        self._profiles.setdefault(record.profile, _ProfileTotals()).add(record)
        self._recent.append(record)
        if len(self._recent) > self._keep:
            del self._recent[: len(self._recent) - self._keep]

    def recent(self) -> list[UsageRecord]:
        return list(self._recent)

    def report(self) -> dict[str, Any]:
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
