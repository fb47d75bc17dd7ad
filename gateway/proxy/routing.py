"""Which profiles a call may go to: the principal's allowed profiles, in order, that carry
this route's schema and serve the requested model; then their fallbacks.

Must not: do I/O. A client-chosen profile (`x-wiregate-profile`) only selects among what
the principal is allowed; it grants nothing.
"""

from __future__ import annotations

from datetime import datetime
from fnmatch import fnmatchcase

from gateway import errors
from gateway.config.runtime import LoadedProfile, Principal, Runtime
from gateway.vocab import ReasonCode

PROFILE_HEADER = "x-wiregate-profile"


def usable(runtime: Runtime, loaded: LoadedProfile, short: str, model: str, now: datetime) -> bool:
    """May a call of this schema and model go to this profile now (it carries and serves
    them, it is within its validity, and the policy accepts its retention)?"""
    p = loaded.profile
    return p.carries(short) and p.serves(model) and loaded.valid_at(now) and runtime.policy.retention_ok(p)


def primary(
    runtime: Runtime, principal: Principal, short: str, model: str, requested: str | None, now: datetime
) -> LoadedProfile:
    if not any(fnmatchcase(model, pattern) for pattern in principal.models):
        raise errors.forbidden(ReasonCode.FORBIDDEN_MODEL)
    if requested is not None:
        if requested not in principal.profiles or requested not in runtime.profiles:
            raise errors.forbidden(ReasonCode.FORBIDDEN_PROFILE)
        loaded = runtime.profiles[requested]
        if not runtime.policy.retention_ok(loaded.profile):
            raise errors.forbidden(ReasonCode.RETENTION_NOT_ALLOWED)
        if not usable(runtime, loaded, short, model, now):
            raise errors.forbidden(ReasonCode.FORBIDDEN_PROFILE)
        return loaded
    matching = [runtime.profiles[pid] for pid in principal.profiles if pid in runtime.profiles]
    matching = [lp for lp in matching if lp.profile.carries(short) and lp.profile.serves(model)]
    if not matching:
        raise errors.forbidden(ReasonCode.FORBIDDEN_MODEL)
    matching = [lp for lp in matching if runtime.policy.retention_ok(lp.profile)]
    if not matching:
        raise errors.forbidden(ReasonCode.RETENTION_NOT_ALLOWED)
    for loaded in matching:
        if loaded.valid_at(now):
            return loaded
    raise errors.ServiceError(503, "upstream_unavailable", (ReasonCode.NO_PROFILE,), retryable=True)


def fallbacks(
    runtime: Runtime, principal: Principal, first: LoadedProfile, short: str, model: str, now: datetime
) -> list[LoadedProfile]:
    """The fallback chain after `first`, breadth-first, each profile at most once, keeping
    only those this principal may use for this schema and model right now."""
    chain: list[LoadedProfile] = []
    seen = {first.profile.id}
    queue = list(first.profile.fallbacks)
    while queue:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        loaded = runtime.profiles.get(pid)
        if loaded is None:
            continue
        if pid in principal.profiles and usable(runtime, loaded, short, model, now):
            chain.append(loaded)
        queue.extend(loaded.profile.fallbacks)
    return chain
