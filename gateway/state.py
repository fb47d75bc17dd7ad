"""What the running app holds, under typed AppKeys (no module globals).

Owns: `Services` (runtime holder, upstream client, metrics, buffering capacity) and the
per-request `Call` record that the middleware logs and counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.config.runtime import RuntimeHolder
from gateway.errors import Dialect
from gateway.obs.metrics import Metrics

if TYPE_CHECKING:
    from gateway.checks import CheckOutcome, ReleaseLedger
    from gateway.proxy.upstream import AttemptRecord, Upstream
    from gateway.usage import UsageLedger


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


@dataclass
class Services:
    holder: RuntimeHolder
    metrics: Metrics
    capacity: Capacity
    config_path: Path | None
    ledger: ReleaseLedger
    usage: UsageLedger
    upstream: Upstream | None = None  # set by the client-session cleanup context
    principal_calls: PrincipalCalls = field(default_factory=PrincipalCalls)


SERVICES = web.AppKey("wiregate_services", Services)


@dataclass
class Call:
    """Content-free facts about one request, for the access log and metrics."""

    request_id: str
    route: str
    dialect: Dialect
    started: float
    carrier: str | None = None
    principal: str | None = None
    delegate_for: str | None = None
    scope: str | None = None
    profile: str | None = None
    model: str | None = None
    stream: bool | None = None
    outcome: str = "error"
    reason_codes: tuple[str, ...] = ()
    upstream_status: int | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    attempts: list[AttemptRecord] = field(default_factory=list)
    checks: list[CheckOutcome] = field(default_factory=list)
    # usage accounting of the final attempt
    usage_injected: bool = False
    input_estimate: int | None = None
    output_estimate: int | None = None
    final_usage: dict[str, Any] | None = None
    final_outcome: str | None = None


CALL = web.RequestKey("wiregate_call", Call)  # request-scoped
