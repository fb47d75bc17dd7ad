"""Paces and fixed cache policies for the replay bench (bench/replay_bench.py --paces).

Owns: the three inter-turn gap traces (fast, slow, mixed), the fixed marker policies a
client could have used for the whole session (`FIXED`: a TTL or none for the stable part —
tools and system — and for the moving tail — the last stable turn and the newest user
message), how such a policy marks an Anthropic body, and the billed-equivalent input of a
turn from the provider's usage. The best fixed policy in hindsight is the cheapest of
`FIXED` replayed on the same trace.
"""

from __future__ import annotations

import copy
import random
from typing import Any

PACES = ("fast", "slow", "mixed")
TTLS: tuple[str | None, ...] = (None, "5m", "1h")
# (stable, tail): every combination the API accepts (a 1 h marker never after a 5 min one).
FIXED: tuple[tuple[str | None, str | None], ...] = tuple(
    (s, t) for s in TTLS for t in TTLS if (s, t) != (None, None) and not (s == "5m" and t == "1h")
)


def gaps(pace: str, turns: int, seed: int = 11) -> list[float]:
    """Seconds between the starts of consecutive turns."""
    r = random.Random(f"{pace}:{seed}")
    if pace == "fast":
        return [r.uniform(5, 30) for _ in range(turns - 1)]
    if pace == "slow":  # every gap above 5 min and below an hour; the session averaged ~6.7 min
        return [r.uniform(330, 480) for _ in range(turns - 1)]
    out: list[float] = []  # mixed: bursts of 3-7 quick turns separated by 10-45 min pauses
    while len(out) < turns - 1:
        out += [r.uniform(5, 40) for _ in range(r.randint(3, 7) - 1)]
        out.append(r.uniform(600, 2700))
    return out[: turns - 1]


def client_1h_system(body: dict[str, Any]) -> dict[str, Any]:
    """The issue's variant: the client marks its own system prompt for an hour."""
    out = copy.deepcopy(body)
    out["system"] = [{"type": "text", "text": out["system"], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    return out


def name(policy: tuple[str | None, str | None]) -> str:
    stable, tail = policy
    return f"stable {stable or 'none'} / tail {tail or 'none'}"


def _mark(block: dict[str, Any], ttl: str) -> None:
    block["cache_control"] = {"type": "ephemeral", "ttl": ttl}


def _last_block(message: dict[str, Any]) -> dict[str, Any]:
    if isinstance(message["content"], str):
        message["content"] = [{"type": "text", "text": message["content"]}]
    block: dict[str, Any] = message["content"][-1]
    return block


def marked(body: dict[str, Any], policy: tuple[str | None, str | None]) -> dict[str, Any]:
    """The Anthropic body with the policy's markers: the end of tools and of system
    (stable), the last stable turn and the newest user message (tail)."""
    out = copy.deepcopy(body)
    stable, tail = policy
    if stable is not None:
        _mark(out["tools"][-1], stable)
        if isinstance(out["system"], str):
            out["system"] = [{"type": "text", "text": out["system"]}]
        _mark(out["system"][-1], stable)
    if tail is not None:
        messages = out["messages"]
        if len(messages) >= 2:
            _mark(_last_block(messages[-2]), tail)
        _mark(_last_block(messages[-1]), tail)
    return out


def billed(usage: dict[str, Any], read: float = 0.1, write_5m: float = 1.25, write_1h: float = 2.0) -> float:
    """Input tokens billed-equivalent (base-rate tokens) of one Anthropic response."""
    split = usage.get("cache_creation") or {}
    w1h = split.get("ephemeral_1h_input_tokens", 0)
    w5m = usage.get("cache_creation_input_tokens", 0) - w1h
    return float(
        usage["input_tokens"] + read * usage.get("cache_read_input_tokens", 0) + write_5m * w5m + write_1h * w1h
    )
