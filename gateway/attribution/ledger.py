"""The attribution ledger and report: one bounded pass over raw records, in time order.

Owns: the formulas (per block: meanTokensWhenInjected, injectionCount, injectionCoverage,
cumulative materialized, exposure, controllable exposure, target exposure, addressable
exposure), lifetimes across a session (boundary_only, session_persistent,
until_replaced — ended by a newer instance of a singleton block or by a compaction — and
unknown), deduplication of retries and replays (same invocation, same block identity:
counted once), the exposure evidence status, the separate top-N, the mutually exclusive
partition and the controllable view, and the provider's own usage of the same calls.
Must not: approximate exposure from injection counts, fall back from exposure to the
materialized figure without naming the estimator, or read anything but records.

Evidence. Exposure needs a stable invocation identity (the provider's response id) and
the complete active-block set of that invocation. A request that carries its whole context
(chat, messages, a Responses call without server-side state) is its own complete set, plus
what its session carries; one that continues server-side state is complete only in a
session whose whole context was seen before it (its carried blocks stand for what the
provider holds), and incomplete otherwise. Every copy of a block in the context counts:
two identical tool results are two blocks of one invocation (count-once is for the same
invocation recorded again, not for repeated text). All correlated and complete: `supported`; some: `limited`; none:
`unsupported`, and every exposure figure is absent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.attribution.blocks import ESTIMATOR, Block
from gateway.attribution.registry import PARTITION, BlockSpec, Registry

SCHEMA = "wiregate.attribution-report.v1"
USAGE_KINDS = ("input_total", "output", "cache_read", "cache_write")
TOP_N = 12  # the opportunity view's ceiling
MAX_ENTRIES = 256  # ledger entries a report holds; more makes it `limited`
_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Record:
    """One input boundary as stored: no text, no raw ids (keyed digests only)."""

    ts: float
    blocks: tuple[Block, ...]
    invocation: str | None = None  # digest of the provider's response id
    session: str | None = None  # digest of x-wiregate-session
    full_context: bool = True  # the request holds its whole context (see the module docstring)
    usage: Mapping[str, tuple[int | None, str]] = field(default_factory=dict)  # kind → (value, provenance)
    truncated: bool = False
    profile: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "b": [[b.block_id, b.instance, b.estimate] for b in self.blocks],
            "f": self.full_context,
            "u": {k: [v, p] for k, (v, p) in self.usage.items()},
            "t": self.truncated,
        }

    def as_text(self) -> str:
        """`as_json` as the compact text a stored record holds (one encoder for every call)."""
        return _COMPACT.encode(self.as_json())

    @classmethod
    def from_json(
        cls, ts: float, invocation: str | None, session: str | None, profile: str, doc: Mapping[str, Any]
    ) -> Record:
        return cls(
            ts=ts,
            blocks=tuple(Block(str(b[0]), str(b[1]), int(b[2])) for b in doc.get("b", ())),
            invocation=invocation,
            session=session,
            full_context=bool(doc.get("f", True)),
            usage={str(k): (None if v[0] is None else int(v[0]), str(v[1])) for k, v in doc.get("u", {}).items()},
            truncated=bool(doc.get("t", False)),
            profile=profile,
        )


@dataclass(slots=True)
class _Entry:
    spec: BlockSpec
    materialized: int = 0
    injections: int = 0
    exposure: int = 0
    target_exposure: int = 0
    active_invocations: int = 0


Key = tuple[str, str]  # (block id, instance digest)


class Aggregator:
    """Feed records in time order (`add`), then `report()`. Records before `since` only
    build session state; they are not counted."""

    def __init__(self, registry: Registry, *, since: float = float("-inf"), max_entries: int = MAX_ENTRIES) -> None:
        self.registry = registry
        self.since = since
        self.max_entries = max_entries
        self.entries: dict[str, _Entry] = {}
        # session → its carried blocks, each with the copies of it the context holds
        self.sessions: dict[str, dict[Key, tuple[Block, int]]] = {}
        self.launched: set[str] = set()  # sessions a full-context request was seen in
        self.seen: dict[str, set[Key]] = {}  # invocation → block identities already counted
        self.counted: set[str] = set()  # invocations whose first sighting in the window was counted
        self.boundaries = 0
        self.correlated = 0
        self.incomplete = 0
        self.replays = 0
        self.truncated = 0
        self.dropped_entries = 0
        self.usage: dict[str, dict[str, int]] = {
            k: {"known": 0, "estimated": 0, "unknown_records": 0} for k in USAGE_KINDS
        }

    def _entry(self, block_id: str) -> _Entry | None:
        spec = self.registry.resolve(block_id)
        entry = self.entries.get(spec.id)
        if entry is None:
            if len(self.entries) >= self.max_entries:
                self.dropped_entries += 1
                return None
            entry = self.entries[spec.id] = _Entry(spec)
        return entry

    def _carry(self, record: Record) -> dict[Key, tuple[Block, int]]:
        """The session's active blocks before this record, after this record's
        compaction and replacements; then updated with what it materialises (with the
        copies of each it holds). Returns the carried set as it stood for this invocation."""
        carried = dict(self.sessions.get(record.session, {})) if record.session is not None else {}
        here = Counter((b.block_id, b.instance) for b in record.blocks)
        specs = [self.registry.resolve(b.block_id) for b in record.blocks]
        if any(
            s.compacts and (b.block_id, b.instance) not in carried for s, b in zip(specs, record.blocks, strict=True)
        ):
            carried = {k: v for k, v in carried.items() if not self.registry.resolve(k[0]).compactable}
        elif record.full_context:
            # The request shows the whole context: compactable material it no longer holds was compacted away.
            carried = {k: v for k, v in carried.items() if k in here or not self.registry.resolve(k[0]).compactable}
        for spec, block in zip(specs, record.blocks, strict=True):
            if spec.singleton and spec.lifetime == "until_replaced":
                carried = {k: v for k, v in carried.items() if k[0] != block.block_id or k[1] == block.instance}
        before = dict(carried)
        for spec, block in zip(specs, record.blocks, strict=True):
            if spec.lifetime in ("session_persistent", "until_replaced"):
                key = (block.block_id, block.instance)
                carried[key] = (block, here[key])
        if record.session is not None:
            self.sessions[record.session] = carried
        return before

    def add(self, record: Record) -> None:
        counted = record.ts >= self.since
        fresh = list(record.blocks)
        here = {(b.block_id, b.instance) for b in record.blocks}
        replay = False
        if record.invocation is not None:
            seen = self.seen.get(record.invocation)
            # A repeat of an invocation first seen before the window is its first sighting in
            # the window: a whole boundary (its earlier blocks, usage and correlation were
            # never counted), not a replay of one.
            if seen is not None and (record.invocation in self.counted or not counted):
                replay = True
                fresh = [b for b in record.blocks if (b.block_id, b.instance) not in seen]
                if not fresh:
                    if counted:
                        self.replays += 1
                    return
            self.seen.setdefault(record.invocation, set()).update((b.block_id, b.instance) for b in fresh)
            if counted and not replay:
                self.counted.add(record.invocation)
        carried = self._carry(record)
        # A continuation (server-side state) is complete only in a session whose whole
        # context was seen before it: what that launch carried stands for what the provider holds.
        complete = record.full_context or (record.session is not None and record.session in self.launched)
        if record.full_context and record.session is not None:
            self.launched.add(record.session)
        if not counted:
            return
        if record.truncated:
            self.truncated += 1
        if replay:
            self.replays += 1
        else:
            self.boundaries += 1
            for kind in USAGE_KINDS:
                value, provenance = record.usage.get(kind, (None, "unknown"))
                slot = self.usage[kind]
                if value is None:
                    slot["unknown_records"] += 1
                else:
                    slot[provenance if provenance in ("known", "estimated") else "known"] += value
        injected: set[str] = set()
        for block in fresh:
            entry = self._entry(block.block_id)
            if entry is None:
                continue
            entry.materialized += block.estimate
            if entry.spec.id not in injected:
                injected.add(entry.spec.id)
                if not (replay and self._injected_before(record.invocation, entry.spec.id, fresh)):
                    entry.injections += 1
        if record.invocation is None:
            return
        if not replay:
            self.correlated += 1
            if not complete:
                self.incomplete += 1
        # The invocation's active blocks, every copy: the request's own (two identical tool
        # results are two), and what its session carries that it does not repeat. On a
        # replay only what the first sighting lacked: the rest was counted then.
        active = list(fresh)
        if not replay:
            active += [block for key, (block, n) in carried.items() if key not in here for _ in range(n)]
        per_block: dict[str, int] = {}
        for block in active:
            spec_id = self.registry.resolve(block.block_id).id
            per_block[spec_id] = per_block.get(spec_id, 0) + block.estimate
        for spec_id, tokens in per_block.items():
            entry = self._entry(spec_id)
            if entry is None:
                continue
            entry.exposure += tokens
            if not replay or not self._injected_before(record.invocation, spec_id, fresh):
                entry.active_invocations += 1
                if entry.spec.target is not None:
                    entry.target_exposure += entry.spec.target

    def _injected_before(self, invocation: str | None, spec_id: str, fresh: list[Block]) -> bool:
        """On a replay: did the first sighting of this invocation already carry this block id?"""
        if invocation is None:
            return False
        fresh_keys = {(b.block_id, b.instance) for b in fresh}
        return any(self.registry.resolve(k[0]).id == spec_id for k in self.seen[invocation] - fresh_keys)

    # --- the report -----------------------------------------------------------------------

    def exposure_status(self) -> str:
        if self.correlated == 0:
            return "unsupported"
        if self.correlated == self.boundaries and self.incomplete == 0:
            return "supported"
        return "limited"

    def report(self, *, limited_scan: bool = False, top_n: int = TOP_N) -> dict[str, Any]:
        status = self.exposure_status()
        if status == "supported" and (limited_scan or self.truncated):
            status = "limited"
        exposure_known = status != "unsupported"
        ledger = [self._row(e, exposure_known) for e in self.entries.values()]
        ledger.sort(key=lambda r: (-r["cumulativeMaterializedEstimate"], r["blockId"]))
        partition = {"owned": 0, "workspaceConfiguration": 0, "userTaskPayload": 0, "unknown": 0}
        controllable = 0
        for entry in self.entries.values():
            partition[PARTITION[entry.spec.origin]] += entry.materialized
            if entry.spec.eligible:
                controllable += entry.materialized
        reasons = []
        if limited_scan:  # the read stopped at a bound: its record count or its bytes of stored records
            reasons.append("record_bound")
        if self.dropped_entries:
            reasons.append("entry_bound")
        if self.truncated:
            reasons.append("blocks_per_call_bound")
        return {
            "schema": SCHEMA,
            "estimator": {"name": ESTIMATOR, "kind": "relative_attribution_only"},
            "limited": bool(reasons),
            "limitReasons": reasons,
            "boundaries": self.boundaries,
            "replaysDeduplicated": self.replays,
            "exposure": {
                "status": status,
                "correlatedInvocations": self.correlated,
                "incompleteInvocations": self.incomplete,
            },
            "ledger": ledger,
            "opportunities": opportunities(ledger, top_n),
            "partition": {"compiledMaterialized": sum(partition.values()), **partition},
            "controllableMaterialized": controllable,
            "providerUsage": {"invocations": self.boundaries, "kinds": self.usage},
        }

    def _row(self, entry: _Entry, exposure_known: bool) -> dict[str, Any]:
        spec = entry.spec
        row: dict[str, Any] = {
            "blockId": spec.id,
            "displayName": spec.display_name,
            "type": spec.type,
            "origin": spec.origin,
            "control": spec.control,
            "lifetime": spec.lifetime,
            "partition": PARTITION[spec.origin],
            "eligible": spec.eligible,
            "suggestedAction": spec.action,
            "requiredValidation": spec.validation,
            "injectionCount": entry.injections,
            "injectionCoverage": round(entry.injections / self.boundaries, 6) if self.boundaries else 0.0,
            "meanTokensWhenInjected": round(entry.materialized / entry.injections, 2) if entry.injections else 0.0,
            "cumulativeMaterializedEstimate": entry.materialized,
        }
        if spec.target is not None:
            row["targetPerInjection"] = spec.target
        if exposure_known:
            controllable = entry.exposure if spec.eligible else 0
            row["activeInvocations"] = entry.active_invocations
            row["cumulativeExposureEstimate"] = entry.exposure
            row["cumulativeControllableExposureEstimate"] = controllable
            if spec.target is not None:
                row["cumulativeTargetExposureEstimate"] = entry.target_exposure
                row["cumulativeAddressableExposureEstimate"] = max(controllable - entry.target_exposure, 0)
                row["estimator"] = "addressable_exposure_target"
            else:
                row["estimator"] = "exposure_contribution"
        else:
            row["estimator"] = "materialized_contribution"
        return row


_VALUE_OF = {
    "addressable_exposure_target": "cumulativeAddressableExposureEstimate",
    "exposure_contribution": "cumulativeExposureEstimate",
    "materialized_contribution": "cumulativeMaterializedEstimate",
}


def opportunities(ledger: Iterable[Mapping[str, Any]], top_n: int = TOP_N) -> list[dict[str, Any]]:
    """The separate top-N: eligible blocks only (never user payload or unattributed), by
    the figure their evidence supports, then injection count, then block id."""
    ranked = []
    for row in ledger:
        if not row["eligible"]:
            continue
        value = int(row[_VALUE_OF[row["estimator"]]])
        if value <= 0:
            continue
        ranked.append((value, row))
    ranked.sort(key=lambda vr: (-vr[0], -vr[1]["injectionCount"], vr[1]["blockId"]))
    return [
        {
            "rank": n + 1,
            "blockId": row["blockId"],
            "displayName": row["displayName"],
            "estimator": row["estimator"],
            "value": value,
            "suggestedAction": row["suggestedAction"],
            "requiredValidation": row["requiredValidation"],
        }
        for n, (value, row) in enumerate(ranked[: min(top_n, TOP_N)])
    ]


def aggregate(
    records: Iterable[Record],
    registry: Registry,
    *,
    since: float = float("-inf"),
    limited_scan: bool = False,
    top_n: int = TOP_N,
    max_entries: int = MAX_ENTRIES,
) -> dict[str, Any]:
    """The report over `records` (time order), counting those at or after `since`."""
    agg = Aggregator(registry, since=since, max_entries=max_entries)
    for record in records:
        agg.add(record)
    return agg.report(limited_scan=limited_scan, top_n=top_n)
