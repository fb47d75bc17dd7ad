"""Prompt-cache emulation: the provider rules as pure functions, plus the entry store.

The mock reports cache hits the way the providers do (WIRE-FORMATS §2.6, §3.7), so a
gateway's cache planning can be measured against it.  A prompt is a sequence of
*units* (Anthropic blocks, OpenAI segments; see `prompt`), each with a token count;
the cache key of the prefix ending at unit ``i`` is a SHA-256 chain over the units'
canonical bytes (`prefix_hashes`).

Anthropic (explicit breakpoints):

* `resolve_breakpoints` -- explicit ``cache_control`` markers plus the automatic one
  (top-level ``cache_control`` = the last block); at most `MAX_BREAKPOINTS`, and no
  1 h breakpoint after a 5 min one (`BreakpointError` = HTTP 400 otherwise).
* `plan_anthropic` -- breakpoints whose prefix is below the minimum are ignored; each
  remaining breakpoint looks back `LOOKBACK_BLOCKS` positions (itself included) for a
  live entry, and the furthest hit A is read; every breakpoint after A is written.
  Billing per the mixed-TTL rule: B = last 1 h breakpoint written, C = last breakpoint
  written; 1 h writes = tokens(B) - tokens(A), 5 min writes = tokens(C) - tokens(max(A, B)).

OpenAI (implicit prefix caching):

* `openai_cached_tokens` -- the longest stored prefix, if it reaches the minimum, is
  reported rounded down to a multiple of `OPENAI_CACHE_GRANULARITY`.

`CacheStore` holds entries (key -> expiry) and is *not* thread-safe: `MockState`
drives it under its lock.  Nothing here reads a clock; callers pass ``now``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Ttl = Literal["5m", "1h"]

TTL_SECONDS: Mapping[Ttl, float] = MappingProxyType({"5m": 300.0, "1h": 3600.0})
MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20
DEFAULT_CACHE_MIN_TOKENS = 1024
"""Anthropic minimum cacheable prefix (the 1,024-token model class)."""
DEFAULT_OPENAI_CACHE_MIN_TOKENS = 1024
DEFAULT_OPENAI_CACHE_TTL_S = 600.0
OPENAI_CACHE_GRANULARITY = 128


class BreakpointError(ValueError):
    """The request's ``cache_control`` markers are invalid (the API answers 400)."""


@dataclass(frozen=True)
class CacheUsage:
    """Cached input tokens of one request: read, and written per TTL."""

    read_tokens: int = 0
    write_5m_tokens: int = 0
    write_1h_tokens: int = 0

    @property
    def write_tokens(self) -> int:
        return self.write_5m_tokens + self.write_1h_tokens


NO_CACHE = CacheUsage()


@dataclass(frozen=True)
class Breakpoint:
    """A cache breakpoint on the unit at `position` (0-based)."""

    position: int
    ttl: Ttl


@dataclass(frozen=True)
class PromptPrefixes:
    """Per unit ``i``: the cache key and the token total of the prefix ``0..i``."""

    hashes: tuple[bytes, ...]
    tokens: tuple[int, ...]

    @property
    def total_tokens(self) -> int:
        return self.tokens[-1] if self.tokens else 0


@dataclass(frozen=True)
class AnthropicCacheQuery:
    """What the cache needs to know about one Anthropic request."""

    prefixes: PromptPrefixes
    breakpoints: tuple[Breakpoint, ...]


@dataclass(frozen=True)
class AnthropicCachePlan:
    """Outcome of `plan_anthropic`: the position read (None = miss), what to write,
    and the usage to report."""

    read_position: int | None
    writes: tuple[Breakpoint, ...]
    usage: CacheUsage


# -- prefixes -------------------------------------------------------------------------


def prefix_hashes(namespace: bytes, units: Iterable[bytes]) -> tuple[bytes, ...]:
    """``h[i] = SHA-256(h[i-1] || SHA-256(unit[i]))`` with ``h[-1] = SHA-256(namespace)``."""
    hashes: list[bytes] = []
    current = hashlib.sha256(namespace).digest()
    for unit in units:
        current = hashlib.sha256(current + hashlib.sha256(unit).digest()).digest()
        hashes.append(current)
    return tuple(hashes)


def prefix_totals(unit_tokens: Iterable[int]) -> tuple[int, ...]:
    """Running sums: the token total of each prefix."""
    totals: list[int] = []
    running = 0
    for tokens in unit_tokens:
        running += tokens
        totals.append(running)
    return tuple(totals)


# -- Anthropic ------------------------------------------------------------------------


def resolve_breakpoints(
    explicit: Sequence[Breakpoint],
    automatic: Ttl | None,
    unit_count: int,
    nested: Sequence[tuple[float, Ttl]] = (),
) -> tuple[Breakpoint, ...]:
    """All breakpoints of a request in prompt order, validated like the API does.

    `explicit` are the blocks' own markers (at most one per position); `automatic` is
    the TTL of a top-level ``cache_control``, which puts a breakpoint on the last block
    -- a no-op when that block already carries a marker with the same TTL. `nested`:
    markers on blocks inside a block (a tool result's content), at a position just before
    their block's; they count towards the limit and the TTL order like the others (this
    mock caches at whole blocks, so they are not returned as breakpoints).
    """
    by_position = {bp.position: bp for bp in explicit}
    if automatic is not None and unit_count > 0:
        last = unit_count - 1
        existing = by_position.get(last)
        if existing is not None and existing.ttl != automatic:
            raise BreakpointError(
                "the top-level cache_control TTL differs from the cache_control TTL already on the last block"
            )
        by_position[last] = Breakpoint(last, automatic)
    breakpoints = tuple(sorted(by_position.values(), key=lambda bp: bp.position))
    every = sorted([(float(bp.position), bp.ttl) for bp in breakpoints] + list(nested))
    if len(every) > MAX_BREAKPOINTS:
        raise BreakpointError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {len(every)}."
        )
    seen_5m = False
    for _, ttl in every:
        if ttl == "5m":
            seen_5m = True
        elif seen_5m:
            raise BreakpointError(
                "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control "
                "block (blocks are processed in the order tools, system, messages)"
            )
    return breakpoints


def eligible_breakpoints(
    prefix_tokens: Sequence[int], breakpoints: Iterable[Breakpoint], min_tokens: int
) -> tuple[Breakpoint, ...]:
    """Breakpoints whose prefix reaches the minimum; the others are silently inert."""
    return tuple(bp for bp in breakpoints if prefix_tokens[bp.position] >= min_tokens)


def lookback_window(position: int, lookback: int = LOOKBACK_BLOCKS) -> range:
    """Positions a breakpoint at `position` checks, nearest first (itself included)."""
    return range(position, max(-1, position - lookback), -1)


def lookback_positions(breakpoints: Iterable[Breakpoint], lookback: int = LOOKBACK_BLOCKS) -> frozenset[int]:
    """Every position some breakpoint's lookback reaches (what a caller must probe)."""
    return frozenset(pos for bp in breakpoints for pos in lookback_window(bp.position, lookback))


def read_position(breakpoints: Iterable[Breakpoint], live: Set[int], lookback: int = LOOKBACK_BLOCKS) -> int | None:
    """The furthest position any breakpoint's lookback finds in `live` (None = miss)."""
    hits = (next((pos for pos in lookback_window(bp.position, lookback) if pos in live), None) for bp in breakpoints)
    return max((hit for hit in hits if hit is not None), default=None)


def bill_anthropic(prefix_tokens: Sequence[int], read_at: int | None, writes: Sequence[Breakpoint]) -> CacheUsage:
    """Mixed-TTL billing with A = `read_at`, B = last 1 h write, C = last write.

    `writes` must be in prompt order and all after A.
    """

    def tokens(position: int | None) -> int:
        return 0 if position is None else prefix_tokens[position]

    read = tokens(read_at)
    if not writes:
        return CacheUsage(read_tokens=read)
    last_1h = max((bp.position for bp in writes if bp.ttl == "1h"), default=None)
    last = writes[-1].position
    write_1h = tokens(last_1h) - read if last_1h is not None else 0
    write_5m = tokens(last) - max(read, tokens(last_1h))
    return CacheUsage(read_tokens=read, write_5m_tokens=write_5m, write_1h_tokens=write_1h)


def plan_anthropic(
    prefix_tokens: Sequence[int],
    breakpoints: Sequence[Breakpoint],
    live: Set[int],
    min_tokens: int,
    lookback: int = LOOKBACK_BLOCKS,
) -> AnthropicCachePlan:
    """Read and write decisions for one request.

    `live` holds the positions whose prefix is stored and unexpired (only those in
    `lookback_positions` matter).  Breakpoints below `min_tokens` neither read nor
    write; every other breakpoint after the read position A is written.
    """
    eligible = eligible_breakpoints(prefix_tokens, breakpoints, min_tokens)
    read_at = read_position(eligible, live, lookback)
    writes = tuple(bp for bp in eligible if read_at is None or bp.position > read_at)
    return AnthropicCachePlan(read_at, writes, bill_anthropic(prefix_tokens, read_at, writes))


# -- OpenAI ---------------------------------------------------------------------------


def openai_cached_tokens(
    hit_tokens: int,
    min_tokens: int = DEFAULT_OPENAI_CACHE_MIN_TOKENS,
    granularity: int = OPENAI_CACHE_GRANULARITY,
) -> int:
    """Reported ``cached_tokens`` for a stored prefix of `hit_tokens` (0 = no hit)."""
    if hit_tokens < max(1, min_tokens):
        return 0
    return hit_tokens - hit_tokens % granularity


# -- store ----------------------------------------------------------------------------


@dataclass
class _Entry:
    expires_at: float
    ttl_s: float


class CacheStore:
    """Cache entries keyed by prefix hash.  Not thread-safe (`MockState` locks it).

    An entry is live while ``now < expires_at``; refreshing a live entry pushes its
    expiry to ``now + ttl`` (never earlier than it was).
    """

    def __init__(self) -> None:
        self._entries: dict[bytes, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def is_live(self, key: bytes, now: float) -> bool:
        entry = self._entries.get(key)
        return entry is not None and now < entry.expires_at

    def put(self, key: bytes, ttl_s: float, now: float) -> None:
        """Store (or replace) `key`, expiring at ``now + ttl_s``."""
        self._entries[key] = _Entry(now + ttl_s, ttl_s)

    def refresh(self, key: bytes, now: float) -> None:
        """Extend a live entry by its own TTL from `now` (no-op if absent or expired)."""
        entry = self._entries.get(key)
        if entry is not None and now < entry.expires_at:
            entry.expires_at = max(entry.expires_at, now + entry.ttl_s)

    def sweep(self, now: float) -> int:
        """Drop expired entries; return how many."""
        expired = [key for key, entry in self._entries.items() if now >= entry.expires_at]
        for key in expired:
            del self._entries[key]
        return len(expired)

    def clear(self) -> int:
        count = len(self._entries)
        self._entries.clear()
        return count
