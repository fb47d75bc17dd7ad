"""Native prompt-cache planning (SPEC §8). PURE: values in, edits out.

Owns: where wiregate puts cache breakpoints (for a carrier that caches at markers:
Anthropic's `cache_control`) and which cache key and retention it sets (for one that caches
by key: OpenAI's `prompt_cache_key`), for one request and one profile. The schema itself —
the prompt's parts in order, how a marker is written — is the carrier's.

Anthropic: candidates in priority order — the last stable turn (the message before the
newest user message), the end of the newest user message (so the next turn can read the
whole of this prompt), the end of system, the end of tools, and the end of a PowerContext
prepared-context block — never more than the profile's limit counting the client's own
markers (client markers are never moved, removed or re-TTL'd), never on the block the
client's request-level (automatic) marker lands on, never on a prefix below the profile's
minimum, stable items with the profile's stable TTL, and never a 5 min marker before a 1 h
one. OpenAI: a stable `prompt_cache_key` from the sharing boundary (scope, principal,
profile, and a caller session id when given), never overriding the client's; retention per
the profile.

Paced (`cachepace`): when the profile asks and the flow passes the session's pace record,
each candidate gets the TTL the session's observed gaps make profitable — 5 min, 1 h, or
no marker at all (`skipped_unprofitable`) — separately for the stable part and the moving
tail; a 1 h candidate that a client's 5 min marker before it keeps from 1 h gets none
unless a 5 min write pays for its class too. OpenAI gets extended retention when the pace
calls for it and the profile allows it. A session without history is planned as before.
The plan says why, in content-free tags (`cachepace.EVIDENCE`), for its usage record.

Planning is deterministic and idempotent: the same input gives the same bytes, and a
planned body plans to itself. Every byte outside an inserted member stays as sent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway import cachepace
from gateway.cachepace import PaceChoice, SessionPace
from gateway.carriers import jsonspan
from gateway.carriers.base import Carrier, PromptLayout, PromptPart
from gateway.carriers.jsonspan import Edit
from gateway.profiles.model import CachePrices, CacheSettings

END_MARKER = "END_POWERCONTEXT_PREPARED_CONTEXT_V1"

Estimate = Callable[[str], int]


@dataclass(frozen=True, slots=True)
class CacheContext:
    principal: str
    scope: str
    profile_id: str
    session: str | None = None
    account: str | None = None  # the provider account the profile's credential belongs to
    region: str | None = None


@dataclass(frozen=True, slots=True)
class CachePlan:
    edits: tuple[Edit, ...]
    breakpoints: tuple[tuple[str, str], ...] = ()  # (where, ttl) wiregate added
    cache_key: str | None = None  # the prompt_cache_key wiregate set
    skipped: tuple[str, ...] = ()  # why candidates were not placed (content-free)
    evidence: tuple[str, ...] = ()  # which plan and why (cachepace.EVIDENCE tags)


NOTHING = CachePlan(edits=())


@dataclass(frozen=True, slots=True)
class _Block:
    part: PromptPart
    cumulative: int  # estimated tokens of the prefix up to and including this part


def _blocks(layout: PromptLayout, estimate: Estimate) -> tuple[list[_Block], dict[str, list[int]]]:
    """The prompt's parts with running token estimates, and where each region's parts are
    (by index into the list)."""
    out: list[_Block] = []
    regions: dict[str, list[int]] = {"tools": [], "system": []}
    total = 0
    for part in layout.parts:
        total += estimate(part.text)
        region = part.region if part.region != "message" else f"message:{part.message}"
        regions.setdefault(region, []).append(len(out))
        out.append(_Block(part, total))
    return out, regions


def _candidates(blocks: list[_Block], regions: dict[str, list[int]]) -> list[tuple[str, int]]:
    """(name, block index) in priority order."""
    found: list[tuple[str, int]] = []
    users = sorted({b.part.message for b in blocks if b.part.role == "user" and b.part.message is not None})
    if users:
        newest = users[-1]
        before = regions.get(f"message:{newest - 1}") if newest >= 1 else None
        if before:
            found.append(("last_turn", before[-1]))
        if regions.get(f"message:{newest}"):
            found.append(("tail", regions[f"message:{newest}"][-1]))
    for region in ("system", "tools"):
        # The region's end: its last block that is, or can be, a breakpoint. A block the
        # client (or a previous plan) already marked is that end — planning it again then
        # adds nothing inside the region — and a tool loaded on demand is not part of it.
        if regions[region]:
            ends = [i for i in regions[region] if blocks[i].part.markable or blocks[i].part.marker is not None]
            found.append((region, (ends or regions[region])[-1]))
    for index, block in enumerate(blocks):
        if END_MARKER in block.part.text:
            found.append(("prepared_context", index))
            break
    return found


def plan_markers(
    carrier: Carrier,
    text: str,
    layout: PromptLayout,
    settings: CacheSettings,
    estimate: Estimate,
    choice: PaceChoice | None = None,
) -> CachePlan:
    """Breakpoints for a provider that caches at explicit markers (Anthropic). `choice`:
    the paced TTLs (None: the profile's own)."""
    if settings.mode != "anthropic-cache-control" or settings.max_breakpoints == 0:
        return NOTHING
    blocks, regions = _blocks(layout, estimate)
    if not blocks:
        return NOTHING
    markers = {i: b.part.marker for i, b in enumerate(blocks) if b.part.marker is not None}
    # The client's markers in prompt order: a block's own at its index, those on blocks
    # nested inside it just before it; the automatic one where the provider puts it.
    fixed = [(float(i), ttl) for i, ttl in markers.items()]
    fixed += [(i - 0.5, ttl) for i, b in enumerate(blocks) for ttl in b.part.inner_markers]
    automatic: int | None = None
    if layout.automatic_marker is not None:
        automatic = _automatic_at(blocks)
        fixed.append((float(automatic), layout.automatic_marker))
    slots = settings.max_breakpoints - len(fixed)
    ttls = _class_ttls(settings, choice)
    skipped: list[str] = []
    chosen: dict[int, tuple[str, str, bool]] = {}  # index: (name, TTL, whether 5 min pays)
    for name, index in _candidates(blocks, regions):
        # Already a breakpoint: the client's, ours from a previous plan, or the client's
        # automatic one. On the automatic one's block a marker of ours adds nothing (same
        # TTL: a no-op there) or is refused (another TTL: a 400), so none is placed and the
        # slot stays free for another candidate.
        if index in markers or index in chosen or index == automatic:
            continue
        ttl, five_min_pays = ttls["stable" if name in _STABLE else "tail"]
        if ttl is None:
            skipped.append("unprofitable")
            continue
        if slots <= 0:
            skipped.append("no_slots")
            break
        block = blocks[index]
        if not block.part.markable:
            skipped.append("unmarkable")
            continue
        if block.cumulative < settings.min_prefix_tokens:
            skipped.append("below_minimum")
            continue
        trial = {**chosen, index: (name, ttl, five_min_pays)}
        _, dropped = _order_ttls(trial, fixed)
        if index in dropped:
            skipped.append(dropped[index])  # the TTL order rules it out: it takes no slot
            continue
        chosen = trial
        slots -= 1
    placed, dropped = _order_ttls(chosen, fixed)
    skipped += dropped.values()
    edits = [carrier.marker_edit(text, blocks[index].part, ttl) for index, (_, ttl) in sorted(placed.items())]
    breakpoints = tuple((name, ttl) for _, (name, ttl) in sorted(placed.items()))
    evidence = [
        *(["client_markers"] if fixed else []),
        *(f"ttl_{ttl}" for ttl in ("1h", "5m") if any(t == ttl for _, t in breakpoints)),
        *(["skipped_unprofitable"] if "unprofitable" in skipped else []),
    ]
    return CachePlan(edits=tuple(edits), breakpoints=breakpoints, skipped=tuple(skipped), evidence=tuple(evidence))


_STABLE = frozenset({"system", "tools", "prepared_context"})


def _automatic_at(blocks: list[_Block]) -> int:
    """The block a request-level marker lands on: the last that can hold a marker (the
    provider walks back past a thinking block or an empty text). A block the client decided
    on without a marker (`cache_control: null`) is walked past too: that only moves the
    block the planner keeps off earlier, never onto the provider's."""
    for index in range(len(blocks) - 1, -1, -1):
        if blocks[index].part.markable or blocks[index].part.marker is not None:
            return index
    return len(blocks) - 1


def _class_ttls(settings: CacheSettings, choice: PaceChoice | None) -> dict[str, tuple[str | None, bool]]:
    """Per class (stable, tail): its TTL (None: place none), and whether a 5 min write still
    pays for it — what a 1 h candidate becomes when a 5 min marker before it rules out 1 h
    (fixed TTLs: it does; paced: unless the pace says 5 min loses money)."""
    if choice is None:
        return {"stable": (settings.stable_ttl or settings.ttl, True), "tail": (settings.ttl, True)}
    return {"stable": (choice.stable, not choice.stable_1h_only), "tail": (choice.tail, not choice.tail_1h_only)}


def _order_ttls(
    chosen: dict[int, tuple[str, str, bool]], fixed: list[tuple[float, str]]
) -> tuple[dict[int, tuple[str, str]], dict[int, str]]:
    """1 h breakpoints must all come before 5 min ones. Ours yield to the client's
    (`fixed`: (position in prompt order, TTL)) and, among ours, a later one to an earlier
    one: a 1 h breakpoint after a 5 min one becomes 5 min when 5 min pays for it, else it is
    dropped (`unprofitable`); a 5 min breakpoint before a client's 1 h one is dropped
    (`ttl_order`). Returns ours placed ((name, TTL) by index) and dropped (why, by index)."""
    placed: dict[int, tuple[str, str]] = {}
    dropped: dict[int, str] = {}
    for index in sorted(chosen):
        name, ttl, five_min_pays = chosen[index]
        before = [t for at, t in fixed if at < index] + [t for _, t in placed.values()]
        if ttl == "1h" and "5m" in before:
            if not five_min_pays:
                dropped[index] = "unprofitable"
                continue
            ttl = "5m"
        if ttl == "5m" and any(t == "1h" for at, t in fixed if at > index):
            dropped[index] = "ttl_order"
            continue
        placed[index] = (name, ttl)
    return placed, dropped


def cache_key(ctx: CacheContext, boundary: str) -> str:
    parts = {
        "principal": (ctx.scope, ctx.principal, ctx.profile_id),
        "scope": (ctx.scope, ctx.profile_id),
        "profile": (ctx.profile_id,),
    }[boundary]
    # A provider's cache is per account (and region): the key says which one it is for, so
    # profiles that share a boundary but not an account never share a key.
    where = [ctx.account or "", ctx.region or ""] if ctx.account or ctx.region else []
    material = "\x1f".join([*parts, ctx.session or "", *where])
    return "wg-" + hashlib.sha256(material.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def plan_key(
    text: str, doc: Mapping[str, Any], settings: CacheSettings, ctx: CacheContext, choice: PaceChoice | None = None
) -> CachePlan:
    """A cache key (and retention) for a provider that caches by prefix and key (OpenAI).
    The client's own key, retention or cache options are never overridden or dropped."""
    if settings.mode != "openai-prompt-cache-key":
        return NOTHING
    top = jsonspan.locate(text, ())
    members: list[str] = []
    evidence: list[str] = []
    key = None
    if "prompt_cache_key" not in doc:
        key = cache_key(ctx, settings.sharing_boundary)
        members.append(f'"prompt_cache_key":{json.dumps(key)}')
    else:
        evidence.append("client_markers")
    retention = settings.retention
    if retention is None and settings.extended_retention and choice is not None and choice.tail == "1h":
        retention = "24h"  # the session's gaps outlast in-memory retention
    if retention and "prompt_cache_retention" not in doc and "prompt_cache_options" not in doc:
        members.append(f'"prompt_cache_retention":{json.dumps(retention)}')
        if retention == "24h":
            evidence.append("retention_24h")
    if not members:
        return CachePlan(edits=(), evidence=tuple(evidence))
    return CachePlan(
        edits=(jsonspan.add_member(text, top, ",".join(members)),), cache_key=key, evidence=tuple(evidence)
    )


def plan(
    carrier: Carrier,
    text: str,
    doc: Mapping[str, Any],
    settings: CacheSettings,
    ctx: CacheContext,
    estimate: Estimate,
    *,
    pace: SessionPace | None = None,
    prices: CachePrices | None = None,
) -> CachePlan:
    """The cache edits for this body and profile (none when the carrier cannot cache).
    `pace` is the session's record as the flow read it; with the profile's `prices` it
    decides each write's TTL when the profile paces (deterministic for the same inputs)."""
    paced = settings.pace and prices is not None
    choice = cachepace.choose(pace, prices) if paced and prices is not None else None
    if carrier.cache_style == "markers":
        planned = plan_markers(carrier, text, carrier.prompt_layout(doc), settings, estimate, choice)
    elif carrier.cache_style == "key":
        planned = plan_key(text, doc, settings, ctx, choice)
    else:
        return NOTHING
    if planned == NOTHING or choice is not None:
        return planned
    basis = "no_history" if paced else "fixed_ttl"  # the profile's own TTLs, and why
    return dataclasses.replace(planned, evidence=(basis, *planned.evidence))
