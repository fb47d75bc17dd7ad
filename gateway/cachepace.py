"""Cache pacing: whether a cache write pays for itself in one session (SPEC §8). PURE.

Owns: the content-free record of a session's pace (`PaceEvent`: when one of its requests
started and how many tokens the provider said it read and wrote; `SessionPace`: the last
`MAX_EVENTS` of them and this request's start), the decision rule (`choose`) and the
outcome of the bets earlier writes made (`settle`).
Must not: read a clock, a database or any content; the flow passes the record and the time.

The rule. A write is a bet: a token written for TTL t costs `write_t - 1` more than sending
it uncached, and saves `1 - read` each time a later request reads it. In a session the
tokens written once are read by every later request for as long as each request comes
within t of the one before (a read refreshes the entry, and the next write carries the same
tokens on). With `p_t` the share of observed gaps shorter than t (smoothed), a token is
expected to be read `p_t + p_t² + … + p_t^H` times within a horizon of H requests, so

    value(t) = (1 - read) · Σ_{k=1..H} p_t^k  -  (write_t - 1)

and the TTL with the highest positive value is placed; none when no value is positive. The
stable part (tools, system, prepared context) is read by whatever the session does next: its
horizon is `HORIZON`. The moving tail is credited only with as many future requests as the
session has had (a session that has lasted n requests is expected to last about n more),
so a young session risks less on 1 h. Longer horizons only favour longer TTLs, so the
stable part never gets a shorter TTL than the tail: 1 h markers still come first.
A 1 h candidate after a 5 min marker (the client's) can only be written for 5 min: the
choice says, per class, when 1 h pays but 5 min does not, so the planner then places none.
A session without history gets `None`: the profile's fixed TTLs (today's behaviour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.profiles.model import CachePrices

Ttl = Literal["5m", "1h"]

TTL_SECONDS: dict[Ttl, float] = {"5m": 300.0, "1h": 3600.0}
# Events kept per session: enough gaps to estimate a pace, few enough to read on every call.
MAX_EVENTS = 32
# Most later requests a write is credited with: beyond it the estimate is speculation.
HORIZON = 16
# Smoothing of p_t: (gaps within t + PRIOR) / (gaps + 2·PRIOR). One observation never makes
# a certainty of a pace.
PRIOR = 0.5

# The content-free evidence a plan carries into its usage record (bounded vocabulary).
EVIDENCE = (
    "fixed_ttl",
    "no_history",
    "client_markers",
    "ttl_5m",
    "ttl_1h",
    "skipped_unprofitable",
    "retention_24h",
)


@dataclass(frozen=True, slots=True)
class PaceEvent:
    at: float  # the request's start, wall-clock seconds (replicas compare them)
    read: int | None = None  # tokens read from cache, as the provider reported (None: unknown)
    write_5m: int | None = None  # tokens written for 5 min (OpenAI: in-memory)
    write_1h: int | None = None  # tokens written for 1 h (OpenAI: extended retention)


@dataclass(frozen=True, slots=True)
class SessionPace:
    """A session's recent requests (oldest first, at most MAX_EVENTS) and this one's start."""

    events: tuple[PaceEvent, ...]
    now: float

    def gaps(self) -> tuple[float, ...]:
        times = sorted(e.at for e in self.events)
        times.append(max(self.now, times[-1]) if times else self.now)
        return tuple(b - a for a, b in zip(times, times[1:], strict=False))


@dataclass(frozen=True, slots=True)
class PaceChoice:
    """The TTL each class of breakpoint gets (None: the write does not pay; place none).
    `*_1h_only`: a 1 h write pays for the class but a 5 min one does not, so a candidate
    that a 5 min marker before it keeps from 1 h is not placed at all (False: it is placed
    for 5 min, as with fixed TTLs)."""

    stable: Ttl | None
    tail: Ttl | None
    stable_1h_only: bool = False
    tail_1h_only: bool = False


def within(gaps: tuple[float, ...], ttl: Ttl) -> float:
    """p_t: the smoothed share of gaps shorter than the TTL."""
    hits = sum(1 for g in gaps if g < TTL_SECONDS[ttl])
    return (hits + PRIOR) / (len(gaps) + 2 * PRIOR)


def expected_reads(p: float, horizon: int) -> float:
    return sum(p**k for k in range(1, horizon + 1))


def value(prices: CachePrices, ttl: Ttl, p: float, horizon: int) -> float:
    """Expected saving minus write premium, per token written, in base-input units."""
    premium = (prices.write_5m if ttl == "5m" else prices.write_1h) - 1.0
    return (1.0 - prices.read) * expected_reads(p, horizon) - premium


def best_ttl(gaps: tuple[float, ...], prices: CachePrices, horizon: int) -> Ttl | None:
    """The TTL with the highest positive value; the shorter one on a tie; None if none pays."""
    best: Ttl | None = None
    best_value = 0.0
    for ttl in ("5m", "1h"):
        v = value(prices, ttl, within(gaps, ttl), horizon)
        if v > best_value:
            best, best_value = ttl, v
    return best


def only_1h_pays(gaps: tuple[float, ...], prices: CachePrices, horizon: int) -> bool:
    """1 h is the best TTL and a 5 min write would lose money."""
    return best_ttl(gaps, prices, horizon) == "1h" and value(prices, "5m", within(gaps, "5m"), horizon) <= 0


def choose(pace: SessionPace | None, prices: CachePrices) -> PaceChoice | None:
    """The TTLs for this request of the session (None: no history, use the profile's)."""
    if pace is None or not pace.events:
        return None
    gaps = pace.gaps()
    tail_horizon = min(HORIZON, len(pace.events) + 1)
    return PaceChoice(
        stable=best_ttl(gaps, prices, HORIZON),
        tail=best_ttl(gaps, prices, tail_horizon),
        stable_1h_only=only_1h_pays(gaps, prices, HORIZON),
        tail_1h_only=only_1h_pays(gaps, prices, tail_horizon),
    )


@dataclass(frozen=True, slots=True)
class Bet:
    ttl: Ttl
    won: bool


def settle(previous: PaceEvent | None, current: PaceEvent) -> tuple[Bet, ...]:
    """The bets the previous request's writes made, as this request's reads decide them: a
    1 h write won if this request read beyond what the previous one read; a 5 min write won
    if it read beyond the previous read and its 1 h write too. Unknown figures settle nothing."""
    if previous is None or previous.read is None or current.read is None:
        return ()
    bets: list[Bet] = []
    w1h = previous.write_1h or 0
    if w1h > 0:
        bets.append(Bet("1h", current.read > previous.read))
    if (previous.write_5m or 0) > 0:
        bets.append(Bet("5m", current.read > previous.read + w1h))
    return tuple(bets)
