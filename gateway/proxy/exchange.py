"""One provider call: what is fixed once its request is read, and what happened since.

Owns: `Exchange` (frozen: request id, route, carrier, party, the raw and parsed request,
the runtime pinned for the whole call, the profile chain, the deadline, the session) and
`Trail` (append-only typed events: paced, planned, admitted, checked, attempted, buffered,
decoded, released or refused). Usage records, the access log and attribution are
projections of the trail once the call is over; the flow writes nothing else.
Must not: do I/O or decide anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.attribution.blocks import Attributed
from gateway.auth import Identity
from gateway.cachepace import SessionPace
from gateway.caching import CachePlan
from gateway.carriers.base import Carrier, ParsedRequest
from gateway.checks.prepared import Replay
from gateway.checks.runner import CheckOutcome
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.proxy.upstream import AttemptRecord
from gateway.vocab import Outcome, Phase


@dataclass(frozen=True, slots=True)
class Exchange:
    request_id: str
    route: str
    carrier: Carrier
    identity: Identity
    runtime: Runtime  # one configuration for the whole call, usage projection included
    raw: bytes  # the received request bytes, never mutated
    parsed: ParsedRequest  # for an offloaded body only its model and stream flag
    chain: tuple[LoadedProfile, ...]  # the primary profile, then usable fallbacks
    deadline: float  # monotonic: the whole call, buffering included
    wait_deadline: float  # monotonic: retry waits end by then (the client's declared timeout)
    client_headers: Mapping[str, str] = field(repr=False)  # passthrough candidates
    session: str | None = None
    offloaded: bool = False  # a worker process parses and checks this request
    replays: tuple[Replay, ...] = ()  # prepared contexts the request names (x-wiregate-prepared-context)
    attributed: Attributed | None = None  # the attribution split a worker made while it had the document


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Planned:
    profile_id: str
    body_bytes: int  # the final upstream body
    cache: CachePlan
    usage_injected: bool  # a stream was asked for usage the client did not ask for


@dataclass(frozen=True, slots=True)
class Paced:
    """The session's pace record as read before planning for a profile (content-free)."""

    profile_id: str
    session: str  # the keyed digest the ledger stores it under
    pace: SessionPace


@dataclass(frozen=True, slots=True)
class Admitted:
    profile_id: str
    input_estimate: int


@dataclass(frozen=True, slots=True)
class Checked:
    profile_id: str
    outcome: CheckOutcome


@dataclass(frozen=True, slots=True)
class Attempted:
    record: AttemptRecord


@dataclass(frozen=True, slots=True)
class Buffered:
    profile_id: str
    status: int
    stream: bool
    body_bytes: int


@dataclass(frozen=True, slots=True)
class Decoded:
    complete: bool
    usage: Mapping[str, Any] | None  # the provider's usage object, as reported
    response_id: str | None  # the invocation identity
    output_estimate: int | None  # only when the profile asks for estimates


@dataclass(frozen=True, slots=True)
class Released:
    status: int
    body_bytes: int
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    code: str
    reason_codes: tuple[str, ...]
    outcome: Outcome
    in_stream: bool = False  # as the protocol's error event, after heartbeats


@dataclass(frozen=True, slots=True)
class Windowed:
    """A stream released as it arrived (`release = "windowed"`): the window it held back,
    the policy's cap and how many rules can match more than it, the inspections run while
    it streamed, and the bytes released before the end of the stream was checked."""

    window: int
    cap: int
    capped_rules: int
    checks: int
    early_bytes: int


Event = Paced | Planned | Admitted | Checked | Attempted | Buffered | Decoded | Released | Refused | Windowed
E = TypeVar("E", Paced, Planned, Admitted, Checked, Attempted, Buffered, Decoded, Released, Refused, Windowed)


@dataclass(slots=True)
class Trail:
    """Append-only: events are added in the order they happen and never changed."""

    events: list[Event] = field(default_factory=list)

    def add(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: type[E]) -> Iterator[E]:
        return (e for e in self.events if isinstance(e, kind))

    def last(self, kind: type[E]) -> E | None:
        for event in reversed(self.events):
            if isinstance(event, kind):
                return event
        return None

    @property
    def attempts(self) -> list[AttemptRecord]:
        return [e.record for e in self.of(Attempted)]

    @property
    def checks(self) -> list[CheckOutcome]:
        return [e.outcome for e in self.of(Checked)]

    @property
    def profile_id(self) -> str | None:
        planned = self.last(Planned)
        return planned.profile_id if planned is not None else None

    @property
    def send_allowed(self) -> bool:
        """A send check inspected what was asked and allowed it (so its model name is checked
        text). An allow with incomplete coverage (the send checks off) inspected nothing."""
        return any(
            c.phase is Phase.BEFORE_SEND and c.verdict.allowed and c.verdict.coverage.complete for c in self.checks
        )

    @property
    def final(self) -> Released | Refused | None:
        end = self.last(Released) or self.last(Refused)
        return end
