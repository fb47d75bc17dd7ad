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
what its session carries. One that continues server-side state names what it continues (a
keyed digest of its `previous_response_id`, or of its `conversation`); its session's carried
blocks stand for what the provider holds only when that is the session's last correlated
call (its parent; for a conversation, the last call was in that conversation): then they
are carried into it, and it is complete when a full-context request began that chain and
nothing of unknown lifetime was materialised in it since (such blocks are never carried,
so the carried set would miss them). Anything else — a branch from an older response, a
parent never recorded, a conversation whose opening items were never seen, a record that
does not name its parent (stored before parents were recorded) — is incomplete, and only
what the request itself holds is counted: never blocks the provider did not hold for it.
Every copy of a block in the context counts: two identical tool results are two blocks of
one invocation (count-once is for the same invocation recorded again, not for repeated
text). All correlated and complete: `supported`; some: `limited` (and so is a report whose
records were bounded, truncated or dropped); none: `unsupported`, and every exposure figure
is absent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.attribution.blocks import ESTIMATOR, UNKNOWN_PARENT, Block
from gateway.attribution.registry import PARTITION, BlockSpec, Registry

SCHEMA = "wiregate.attribution-report.v1"
USAGE_KINDS = ("input_total", "output", "cache_read", "cache_write")
TOP_N = 12  # the opportunity view's ceiling
MAX_ENTRIES = 256  # ledger entries a report holds; more makes it `limited`
MAX_CARRIED = 4096  # blocks one session carries across its calls; more makes a report `limited`
_COMPACT = json.JSONEncoder(separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Record:
    """One input boundary as stored: no text, no raw ids (keyed digests only).

    A continuation (`full_context` false) names what it continues: `parent`, the digest of
    its `previous_response_id` made as `invocation` is made, and/or `conversation`, the
    digest of its conversation (UNKNOWN_PARENT: present but unreadable, or a record stored
    before parents were recorded). Both None: it continues its session's last call (a record
    built by hand; the gateway always names the parent)."""

    ts: float
    blocks: tuple[Block, ...]
    invocation: str | None = None  # digest of the provider's response id
    session: str | None = None  # digest of x-wiregate-session
    full_context: bool = True  # the request holds its whole context (see the module docstring)
    usage: Mapping[str, tuple[int | None, str]] = field(default_factory=dict)  # kind → (value, provenance)
    truncated: bool = False
    profile: str = ""
    parent: str | None = None  # a continuation's parent response (digest)
    conversation: str | None = None  # a continuation's conversation (digest)

    def as_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "b": [[b.block_id, b.instance, b.estimate] for b in self.blocks],
            "f": self.full_context,
            "u": {k: [v, p] for k, (v, p) in self.usage.items()},
            "t": self.truncated,
        }
        if not self.full_context:  # a full-context record is stored as before
            doc["p"] = self.parent
            if self.conversation is not None:
                doc["c"] = self.conversation
        return doc

    def as_text(self) -> str:
        """`as_json` as the compact text a stored record holds (one encoder for every call)."""
        return _COMPACT.encode(self.as_json())

    @classmethod
    def from_json(
        cls, ts: float, invocation: str | None, session: str | None, profile: str, doc: Mapping[str, Any]
    ) -> Record:
        full_context = bool(doc.get("f", True))
        parent: str | None = None
        conversation: str | None = None
        if not full_context:
            # A continuation stored before parents were recorded ("p" absent) cannot show
            # which response it continued: its parent is unknown, its evidence incomplete.
            parent = _digest(doc["p"]) if "p" in doc else UNKNOWN_PARENT
            conversation = _digest(doc.get("c"))
        return cls(
            ts=ts,
            blocks=tuple(Block(str(b[0]), str(b[1]), int(b[2])) for b in doc.get("b", ())),
            invocation=invocation,
            session=session,
            full_context=full_context,
            usage={str(k): (None if v[0] is None else int(v[0]), str(v[1])) for k, v in doc.get("u", {}).items()},
            truncated=bool(doc.get("t", False)),
            profile=profile,
            parent=parent,
            conversation=conversation,
        )


def _digest(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(slots=True)
class _Chain:
    """What a session's carried blocks stand for: the provider-side state after its last
    correlated call (a full-context request starts a chain; a continuation of that call
    moves it on)."""

    head: str | None  # that call's invocation digest
    conversation: str | None  # the conversation it continued, if any
    whole: bool  # the carried set is its whole active set as far as lifetimes go (see `_evidence`)
    opaque: bool  # material of unknown lifetime (never carried) was materialised in the chain
    complete: bool  # that call's own evidence (a sighting of it again has the same)


@dataclass(slots=True)
class _Entry:
    spec: BlockSpec
    materialized: int = 0
    injections: int = 0
    exposure: int = 0
    target_exposure: int = 0
    active_invocations: int = 0


Key = tuple[str, str]  # (block id, instance digest)


class _Carried:
    """The blocks a session carries across its calls, each with the copies of it the
    context holds and its spec, with running totals per spec id ([tokens of every copy,
    blocks]) and the indexes a compaction and a replacement read."""

    __slots__ = ("blocks", "by_id", "compactable", "totals")

    def __init__(self) -> None:
        self.blocks: dict[Key, tuple[Block, int, BlockSpec]] = {}
        self.totals: dict[str, list[int]] = {}
        self.by_id: dict[str, set[Key]] = {}
        self.compactable: set[Key] = set()

    def put(self, key: Key, block: Block, copies: int, spec: BlockSpec) -> None:
        if key in self.blocks:
            self.drop([key])
        self.blocks[key] = (block, copies, spec)
        total = self.totals.setdefault(spec.id, [0, 0])
        total[0] += block.estimate * copies
        total[1] += 1
        self.by_id.setdefault(key[0], set()).add(key)
        if spec.compactable:
            self.compactable.add(key)

    def drop(self, keys: Iterable[Key]) -> None:
        for key in keys:
            block, copies, spec = self.blocks.pop(key)
            total = self.totals[spec.id]
            total[0] -= block.estimate * copies
            total[1] -= 1
            self.by_id[key[0]].discard(key)
            self.compactable.discard(key)


class Aggregator:
    """Feed records in time order (`add`), then `report()`. Records before `since` only
    build session state; they are not counted."""

    def __init__(self, registry: Registry, *, since: float = float("-inf"), max_entries: int = MAX_ENTRIES) -> None:
        self.registry = registry
        self.since = since
        self.max_entries = max_entries
        self.entries: dict[str, _Entry] = {}
        self.sessions: dict[str, _Carried] = {}  # session → the blocks it carries across its calls
        self.specs: dict[str, BlockSpec] = {}  # block id → its resolved spec, for this pass
        self.carry_dropped = 0  # blocks a session could not carry (MAX_CARRIED)
        self.chains: dict[str, _Chain] = {}  # session → what its carried blocks stand for
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

    def _spec(self, block_id: str) -> BlockSpec:
        """`registry.resolve`, once per block id a pass meets."""
        spec = self.specs.get(block_id)
        if spec is None:
            spec = self.specs[block_id] = self.registry.resolve(block_id)
        return spec

    def _carry(self, record: Record, specs: list[BlockSpec], chained: bool) -> dict[str, list[int]]:
        """The session's active blocks before this record, after this record's compaction
        and replacements; then updated, in place, with what it materialises (with the copies
        of each it holds). Returns what the carried set held for this invocation beyond the
        blocks the request repeats: per spec id, [tokens of every copy, blocks]. A
        continuation of another state than the session's (`chained` false) carries nothing
        in: the session then holds only what it materialised. A call costs its own blocks and
        the compactable or replaced ones it ends, never a pass over all its session carries."""
        carried = self.sessions.get(record.session) if record.session is not None and chained else None
        if carried is None:
            carried = _Carried()
            if record.session is not None:
                self.sessions[record.session] = carried
        here = Counter((b.block_id, b.instance) for b in record.blocks)
        if carried.blocks:
            if any(
                s.compacts and (b.block_id, b.instance) not in carried.blocks
                for s, b in zip(specs, record.blocks, strict=True)
            ):
                carried.drop(list(carried.compactable))
            elif record.full_context:
                # The request shows the whole context: compactable material it no longer holds was compacted away.
                carried.drop([k for k in carried.compactable if k not in here])
            for spec, block in zip(specs, record.blocks, strict=True):
                if spec.singleton and spec.lifetime == "until_replaced":
                    carried.drop([k for k in carried.by_id.get(block.block_id, ()) if k[1] != block.instance])
        view = {spec_id: list(total) for spec_id, total in carried.totals.items()}
        for key in here:
            held = carried.blocks.get(key)
            if held is not None:
                got = view[held[2].id]
                got[0] -= held[0].estimate * held[1]
                got[1] -= 1
        for spec, block in zip(specs, record.blocks, strict=True):
            if spec.lifetime in ("session_persistent", "until_replaced"):
                key = (block.block_id, block.instance)
                if key not in carried.blocks and len(carried.blocks) >= MAX_CARRIED:
                    self.carry_dropped += 1
                else:
                    carried.put(key, block, here[key], spec)
        return view

    def _evidence(self, record: Record, specs: list[BlockSpec], repeat: bool) -> tuple[bool, bool]:
        """(chained, complete) for this record, and its session's chain moved on. Chained:
        the session's carried blocks belong to the state it continues (they are carried
        into it). Complete: its active set is whole — a full-context request always; a
        continuation only when it continues the session's last correlated call (its parent,
        or that call's conversation), in a chain a full-context request began and no
        unknown-lifetime material entered since."""
        if record.session is None or record.invocation is None:
            # Without a session nothing is carried; an uncorrelated call (no response id: the
            # provider kept no state a continuation could name) leaves the chain where it was.
            return True, record.full_context
        unknown = any(spec.lifetime == "unknown" for spec in specs)
        chain = self.chains.get(record.session)
        if repeat:
            # The same invocation recorded again: the state it stands for is not new.
            if chain is not None and chain.head == record.invocation:
                chain.opaque = chain.opaque or unknown
                return True, chain.complete
            return True, record.full_context  # an older call again: its evidence was not kept
        if record.full_context:
            self.chains[record.session] = _Chain(record.invocation, None, True, unknown, True)
            return True, True
        if chain is None or not _continues(record, chain):
            # Another state than the one the session's blocks stand for (or none seen):
            # incomplete, and from here on the session holds only what this call brought.
            self.chains[record.session] = _Chain(record.invocation, record.conversation, False, unknown, False)
            return False, False
        complete = chain.whole and not chain.opaque
        self.chains[record.session] = _Chain(
            record.invocation, record.conversation, chain.whole, chain.opaque or unknown, complete
        )
        return True, complete

    def add(self, record: Record) -> None:
        counted = record.ts >= self.since
        fresh = list(record.blocks)
        replay = repeat = False
        if record.invocation is not None:
            seen = self.seen.get(record.invocation)
            repeat = seen is not None
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
            if counted and not replay:
                # Its first sighting in the window: what it holds, whatever a sighting before
                # the window held (that one was never counted, so it decides nothing here).
                self.seen[record.invocation] = {(b.block_id, b.instance) for b in fresh}
                self.counted.add(record.invocation)
            else:
                self.seen.setdefault(record.invocation, set()).update((b.block_id, b.instance) for b in fresh)
        specs = [self._spec(b.block_id) for b in record.blocks]
        chained, complete = self._evidence(record, specs, repeat)
        carried = self._carry(record, specs, chained)  # per spec id: [tokens, blocks] it carries in
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
        per_block: dict[str, int] = {}
        if not replay:
            per_block = {spec_id: tokens for spec_id, (tokens, blocks) in carried.items() if blocks}
        for block in fresh:
            spec_id = self._spec(block.block_id).id
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
        return any(self._spec(k[0]).id == spec_id for k in self.seen[invocation] - fresh_keys)

    # --- the report -----------------------------------------------------------------------

    def exposure_status(self) -> str:
        if self.correlated == 0:
            return "unsupported"
        if self.correlated == self.boundaries and self.incomplete == 0:
            return "supported"
        return "limited"

    def report(self, *, limited_scan: bool = False, top_n: int = TOP_N, dropped: bool = False) -> dict[str, Any]:
        """`limited_scan`: the read stopped at a bound; `dropped`: this process dropped
        records before they were written. Either leaves calls out of the pass, and a call
        past the blocks-per-call bound was not seen whole: exposure is then not `supported`."""
        status = self.exposure_status()
        if status == "supported" and (limited_scan or self.truncated or dropped or self.carry_dropped):
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
        if dropped:  # this process dropped queued records (the database was away too long)
            reasons.append("records_dropped")
        if self.carry_dropped:  # a session carried MAX_CARRIED blocks: later ones were not carried
            reasons.append("carry_bound")
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


def _continues(record: Record, chain: _Chain) -> bool:
    """Does a continuation continue the state its session's chain stands for: its parent is
    the chain's last call, and/or its conversation the one that call continued?"""
    if UNKNOWN_PARENT in (record.parent, record.conversation):
        return False
    if record.parent is None and record.conversation is None:
        return True  # a record that does not name its parent: the session's last call
    return (record.parent is None or record.parent == chain.head) and (
        record.conversation is None or record.conversation == chain.conversation
    )


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
