"""Native prompt-cache planning (SPEC §8). PURE: values in, edits out.

Owns: where wiregate puts Anthropic `cache_control` breakpoints and which OpenAI
`prompt_cache_key` / retention it sets, for one request and one profile.

Anthropic: candidates in priority order — the last stable turn (the message before the
newest user message), the end of the newest user message (so the next turn can read the
whole of this prompt), the end of system, the end of tools, and the end of a PowerContext
prepared-context block — never more than the profile's limit counting the client's own
markers (client markers are never moved, removed or re-TTL'd), never on a prefix below the
profile's minimum, stable items with the profile's stable TTL, and never a 5 min marker
before a 1 h one. OpenAI: a stable `prompt_cache_key` from the sharing boundary (scope,
principal, profile, and a caller session id when given), never overriding the client's;
retention per the profile.

Planning is deterministic and idempotent: the same input gives the same bytes, and a
planned body plans to itself. Every byte outside an inserted member stays as sent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.carriers import jsonspan
from gateway.carriers.jsonspan import Edit
from gateway.profiles.model import CacheSettings

END_MARKER = "END_POWERCONTEXT_PREPARED_CONTEXT_V1"
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})

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


NOTHING = CachePlan(edits=())


@dataclass(frozen=True, slots=True)
class _Block:
    path: tuple[str | int, ...]
    is_string: bool  # a string system/content (becomes one text block when marked)
    markable: bool
    cumulative: int  # estimated tokens of the prefix up to and including this block
    marker: str | None  # TTL of an existing cache_control ("5m" / "1h")
    text: str


def _ttl_of(control: Any) -> str | None:
    if not isinstance(control, dict):
        return None
    return "1h" if control.get("ttl") == "1h" else "5m"


def _block_text(block: Any) -> str:
    if isinstance(block, str):
        return block
    if isinstance(block, dict) and isinstance(block.get("text"), str):
        return str(block["text"])
    stripped = {k: v for k, v in block.items() if k != "cache_control"} if isinstance(block, dict) else block
    return json.dumps(stripped, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _blocks(doc: dict[str, Any], estimate: Estimate) -> tuple[list[_Block], dict[str, list[int]]]:
    """The prompt as Anthropic renders it — tools, system, messages — with running token
    estimates, and where each region's blocks are (by index into the list)."""
    out: list[_Block] = []
    regions: dict[str, list[int]] = {"tools": [], "system": []}
    total = 0

    def add(path: tuple[str | int, ...], value: Any, region: str | None) -> None:
        nonlocal total
        text = _block_text(value)
        total += estimate(text)
        is_string = isinstance(value, str)
        kind = value.get("type") if isinstance(value, dict) else "text"
        markable = kind not in _UNMARKABLE and not (kind == "text" and not text)
        marker = None if is_string else _ttl_of(value.get("cache_control"))
        if region is not None:
            regions.setdefault(region, []).append(len(out))
        out.append(_Block(path, is_string, markable, total, marker, text))

    for i, tool in enumerate(doc.get("tools") or ()):
        add(("tools", i), tool, "tools")
    system = doc.get("system")
    if isinstance(system, str) and system:
        add(("system",), system, "system")
    elif isinstance(system, list):
        for i, block in enumerate(system):
            add(("system", i), block, "system")
    for m, msg in enumerate(doc.get("messages") or ()):
        content = msg.get("content") if isinstance(msg, dict) else None
        region = f"message:{m}"
        if isinstance(content, str):
            add(("messages", m, "content"), content, region)
        elif isinstance(content, list):
            for j, block in enumerate(content):
                add(("messages", m, "content", j), block, region)
    return out, regions


def _candidates(doc: dict[str, Any], blocks: list[_Block], regions: dict[str, list[int]]) -> list[tuple[str, int]]:
    """(name, block index) in priority order."""
    found: list[tuple[str, int]] = []
    messages = doc.get("messages") or []
    users = [m for m, msg in enumerate(messages) if isinstance(msg, dict) and msg.get("role") == "user"]
    if users:
        newest = users[-1]
        before = regions.get(f"message:{newest - 1}") if newest >= 1 else None
        if before:
            found.append(("last_turn", before[-1]))
        if regions.get(f"message:{newest}"):
            found.append(("tail", regions[f"message:{newest}"][-1]))
    if regions["system"]:
        found.append(("system", regions["system"][-1]))
    if regions["tools"]:
        found.append(("tools", regions["tools"][-1]))
    for index, block in enumerate(blocks):
        if END_MARKER in block.text:
            found.append(("prepared_context", index))
            break
    return found


def _marker_json(ttl: str) -> str:
    return '{"type":"ephemeral","ttl":"1h"}' if ttl == "1h" else '{"type":"ephemeral"}'


def plan_anthropic(text: str, doc: dict[str, Any], settings: CacheSettings, estimate: Estimate) -> CachePlan:
    if settings.mode != "anthropic-cache-control" or settings.max_breakpoints == 0:
        return NOTHING
    blocks, regions = _blocks(doc, estimate)
    if not blocks:
        return NOTHING
    markers = {i: b.marker for i, b in enumerate(blocks) if b.marker is not None}
    automatic = _ttl_of(doc.get("cache_control"))
    slots = settings.max_breakpoints - len(markers) - (1 if automatic else 0)
    skipped: list[str] = []
    chosen: dict[int, tuple[str, str]] = {}
    stable_ttl = settings.stable_ttl or settings.ttl
    for name, index in _candidates(doc, blocks, regions):
        if index in markers or index in chosen:
            continue  # already a breakpoint (the client's, or ours from a previous plan)
        if name == "tail" and automatic:
            continue  # the client's automatic breakpoint is the tail
        if slots <= 0:
            skipped.append("no_slots")
            break
        block = blocks[index]
        if not block.markable:
            skipped.append("unmarkable")
            continue
        if block.cumulative < settings.min_prefix_tokens:
            skipped.append("below_minimum")
            continue
        chosen[index] = (name, stable_ttl if name in ("system", "tools", "prepared_context") else settings.ttl)
        slots -= 1
    placed = _order_ttls(chosen, markers, automatic, len(blocks), skipped)
    edits: list[Edit] = []
    for index, (_, ttl) in sorted(placed.items()):
        block = blocks[index]
        span = jsonspan.locate(text, block.path)
        if block.is_string:
            literal = text[span[0] : span[1]]
            edits.append(
                (span[0], span[1], f'[{{"type":"text","text":{literal},"cache_control":{_marker_json(ttl)}}}]')
            )
        else:
            edits.append(jsonspan.add_member(text, span, f'"cache_control":{_marker_json(ttl)}'))
    return CachePlan(
        edits=tuple(edits),
        breakpoints=tuple((name, ttl) for _, (name, ttl) in sorted(placed.items())),
        skipped=tuple(skipped),
    )


def _order_ttls(
    chosen: dict[int, tuple[str, str]],
    markers: dict[int, str],
    automatic: str | None,
    n_blocks: int,
    skipped: list[str],
) -> dict[int, tuple[str, str]]:
    """1 h breakpoints must all come before 5 min ones. Ours yield: a 1 h breakpoint after
    a 5 min one becomes 5 min; a 5 min breakpoint before a 1 h one is dropped."""
    fixed = dict(markers)
    if automatic is not None:
        fixed[n_blocks - 1] = automatic
    placed: dict[int, tuple[str, str]] = {}
    for index in sorted(chosen):
        name, ttl = chosen[index]
        everything = {**fixed, **{i: t for i, (_, t) in placed.items()}}
        if ttl == "1h" and any(t == "5m" for i, t in everything.items() if i < index):
            ttl = "5m"
        if ttl == "5m" and any(t == "1h" for i, t in fixed.items() if i > index):
            skipped.append("ttl_order")
            continue
        placed[index] = (name, ttl)
    return placed


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


def plan_openai(text: str, doc: dict[str, Any], settings: CacheSettings, ctx: CacheContext) -> CachePlan:
    if settings.mode != "openai-prompt-cache-key":
        return NOTHING
    top = jsonspan.locate(text, ())
    members: list[str] = []
    key = None
    if "prompt_cache_key" not in doc:
        key = cache_key(ctx, settings.sharing_boundary)
        members.append(f'"prompt_cache_key":{json.dumps(key)}')
    if settings.retention and "prompt_cache_retention" not in doc and "prompt_cache_options" not in doc:
        members.append(f'"prompt_cache_retention":{json.dumps(settings.retention)}')
    if not members:
        return NOTHING
    return CachePlan(edits=(jsonspan.add_member(text, top, ",".join(members)),), cache_key=key)


def plan(
    carrier: str,
    text: str,
    doc: dict[str, Any],
    settings: CacheSettings,
    ctx: CacheContext,
    estimate: Estimate,
) -> CachePlan:
    """The cache edits for this body and profile (none when the profile cannot cache)."""
    if carrier == "anthropic.messages":
        return plan_anthropic(text, doc, settings, estimate)
    if carrier in ("openai.chat", "openai.responses"):
        return plan_openai(text, doc, settings, ctx)
    return NOTHING
