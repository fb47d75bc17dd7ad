"""What the running app holds: one typed AppKey per resource (no module globals), and the
per-request record the envelope middleware logs and counts.

Owns: the AppKeys (runtime holder, metrics, buffering capacity, calls per principal, the
upstream client, the release, usage, cache pace and attribution ledgers, the pages' timeline
and sessions, the configuration path), the two small admission counters,
and `Call` — the request-scoped access-log record. A provider call keeps its facts on its
`Trail`; other routes note the few they have.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.config.runtime import Runtime, RuntimeHolder
from gateway.context.service import ContextService
from gateway.context.store.database import Database
from gateway.ledgers.attribution import AttributionLedger
from gateway.ledgers.pace import StoredPaceLedger
from gateway.ledgers.release import ReleaseLedger
from gateway.ledgers.ui_sessions import StoredUiSessions
from gateway.ledgers.usage import UsageLedger
from gateway.obs.metrics import Metrics
from gateway.obs.timeline import Timeline
from gateway.vocab import Dialect, Outcome

if TYPE_CHECKING:
    from gateway.auth import Identity
    from gateway.proxy.exchange import Exchange, Trail


class Capacity:
    """Concurrent buffered responses. Full means refuse now, not queue."""

    def __init__(self, metrics: Metrics) -> None:
        self.in_use = 0
        self._metrics = metrics

    def try_acquire(self, limit: int) -> bool:
        if self.in_use >= limit:
            return False
        self.in_use += 1
        self._metrics.buffered_responses.set(self.in_use)
        return True

    def release(self) -> None:
        self.in_use -= 1
        self._metrics.buffered_responses.set(self.in_use)


class PrincipalCalls:
    """Provider calls in flight per principal: one principal cannot take every slot."""

    def __init__(self) -> None:
        self._in_flight: dict[str, int] = {}

    def try_acquire(self, principal: str, limit: int) -> bool:
        current = self._in_flight.get(principal, 0)
        if current >= limit:
            return False
        self._in_flight[principal] = current + 1
        return True

    def release(self, principal: str) -> None:
        left = self._in_flight.get(principal, 1) - 1
        if left <= 0:
            self._in_flight.pop(principal, None)
        else:
            self._in_flight[principal] = left


RUNTIME = web.AppKey("wiregate_runtime", RuntimeHolder)
METRICS = web.AppKey("wiregate_metrics", Metrics)
CAPACITY = web.AppKey("wiregate_capacity", Capacity)
PRINCIPAL_CALLS = web.AppKey("wiregate_principal_calls", PrincipalCalls)
RELEASE_LEDGER = web.AppKey("wiregate_release_ledger", ReleaseLedger)
LOCAL_RELEASE_LEDGER = web.AppKey("wiregate_local_release_ledger", ReleaseLedger)


class Draining:
    """Set once a stop has begun: readiness answers 503 from then on."""

    def __init__(self) -> None:
        self.on = False


DRAINING = web.AppKey("wiregate_draining", Draining)
# Under `wiregate serve --workers N`: this process's worker index (absent: the only process).
WORKER = web.AppKey("wiregate_worker", int)
USAGE_LEDGER = web.AppKey("wiregate_usage_ledger", UsageLedger)
PACE_LEDGER = web.AppKey("wiregate_pace_ledger", StoredPaceLedger)  # sessions' cache pace, shared database
ATTRIBUTION = web.AppKey("wiregate_attribution", AttributionLedger)
UI_SESSIONS = web.AppKey("wiregate_ui_sessions", StoredUiSessions)  # shared database
TIMELINE = web.AppKey("wiregate_timeline", Timeline)  # the /ui/ pages' recent history (per process)
CONFIG_PATH = web.AppKey("wiregate_config_path", Path)
DATABASE = web.AppKey("wiregate_database", Database)  # the one store: context, shared ledgers
CONTEXT = web.AppKey("wiregate_context", ContextService)


@dataclass(slots=True)
class Call:
    """Content-free facts about one request, for the access log and metrics. A provider
    call's facts are read from its trail; other routes note theirs directly."""

    request_id: str
    route: str
    dialect: Dialect
    started: float
    carrier: str | None = None
    principal: str | None = None
    delegate_for: str | None = None
    scope: str | None = None  # as it may be logged (see Identity.scope_for_log)
    profile: str | None = None
    outcome: Outcome | None = None
    reason_codes: tuple[str, ...] = ()
    bytes_in: int = 0
    exchange: Exchange | None = None  # a provider call, once its request is read
    trail: Trail | None = None

    @classmethod
    def start(cls, request_id: str, route: str, dialect: Dialect) -> Call:
        return cls(request_id, route, dialect, time.perf_counter())

    def identify(self, identity: Identity, runtime: Runtime) -> None:
        self.principal = identity.principal.id
        self.scope = identity.scope_for_log(runtime)
        self.delegate_for = identity.on_behalf_of


CALL = web.RequestKey("wiregate_call", Call)  # request-scoped
