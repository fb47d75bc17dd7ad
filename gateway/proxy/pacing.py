"""A session's cache pace around one provider call: read before planning, appended after.

Owns: naming the call's session for a profile — the caller's `x-wiregate-session` within the
planner's stable cache key (scope, principal, profile, account), else that key alone —
stored only as a keyed digest; reading its record for the planner (`lookup`); and, from
the call's usage record, appending this request's event and counting the bets the previous
request's writes made, won or lost per profile and TTL (`record`).
Must not: fail a request; a record that cannot be read plans as a session without history.
"""

from __future__ import annotations

from aiohttp import web

from gateway import cachepace, caching, usage
from gateway.cachepace import PaceEvent, SessionPace
from gateway.checks.runner import Party
from gateway.ledgers.pace import StoredPaceLedger, session_digest
from gateway.obs import logging as log
from gateway.proxy.exchange import Exchange, Paced, Planned, Trail
from gateway.state import METRICS, PACE_LEDGER


def _ledger(app: web.Application) -> StoredPaceLedger | None:
    return app.get(PACE_LEDGER)


async def lookup(app: web.Application, ex: Exchange, party: Party) -> Paced | None:
    """The session's record for this profile (None: the profile does not pace)."""
    profile = party.profile.profile
    ledger = _ledger(app)
    settings = profile.cache
    if ledger is None or settings.mode == "none" or not settings.pace or ex.carrier.cache_style is None:
        return None
    if ex.carrier.cache_style == "key" and not (settings.extended_retention and settings.retention is None):
        return None  # nothing the pace could change: spare the call a database read
    ctx = caching.CacheContext(
        party.principal, party.scope, profile.id, ex.session, account=profile.account, region=profile.region
    )
    digest = session_digest(ex.runtime.log_key, caching.cache_key(ctx, "principal"))  # survives key rotation
    now = ledger.clock()
    try:
        events = await ledger.get(digest)
    except Exception as exc:  # an optimisation that fails plans without history
        log.error("pace_read_failed", request_id=ex.request_id, error_class=type(exc).__name__)
        events = ()
    return Paced(profile.id, digest, SessionPace(events, now))


def _value(count: usage.Count) -> int | None:
    return count.value if count.provenance == "known" else None


def event_of(paced: Paced, record: usage.UsageRecord, planned: Planned | None) -> PaceEvent:
    """This request's event: its start and what the provider said it read and wrote. A
    write the provider did not split by TTL is the plan's TTL (1 h only if it placed only 1 h)."""
    counts = record.counts
    w5, w1h = _value(counts["cache_write_5m"]), _value(counts["cache_write_1h"])
    write = _value(counts["cache_write"])
    if w5 is None and w1h is None and write is not None:
        ttls = {ttl for _, ttl in planned.cache.breakpoints} if planned is not None else set()
        w5, w1h = (0, write) if ttls == {"1h"} else (write, 0)
    return PaceEvent(paced.pace.now, _value(counts["cache_read"]), w5, w1h)


async def record(app: web.Application, ex: Exchange, trail: Trail, last: usage.UsageRecord) -> None:
    """Append the final attempt's event to its session and settle the previous one's bets."""
    ledger = _ledger(app)
    paced = next((p for p in reversed(list(trail.of(Paced))) if p.profile_id == last.profile), None)
    if ledger is None or paced is None or last.status is None:
        return  # the profile does not pace, or nothing reached the provider
    planned = next((p for p in reversed(list(trail.of(Planned))) if p.profile_id == last.profile), None)
    event = event_of(paced, last, planned)
    try:
        await ledger.add(paced.session, event)
    except Exception as exc:
        log.error("pace_write_failed", request_id=ex.request_id, error_class=type(exc).__name__)
    previous = paced.pace.events[-1] if paced.pace.events else None
    bets = app[METRICS].cache_bets
    for bet in cachepace.settle(previous, event):
        bets.labels(last.profile, bet.ttl, "won" if bet.won else "lost").inc()
