"""The wire path for one provider request (SPEC §5). This module alone orders the steps.

Theory of operation
-------------------
A provider call arrives on the TLS or Unix-socket listener and reaches `handle`:

  1  authenticate the gateway key, then read the whole body (size limit; identity or gzip)
  2  resolve principal, scope and the profile chain (primary + usable fallbacks)
  3  parse the body with the route's carrier: every text unit, opaque parts, duplicates
     → the frozen `Exchange`: everything fixed for the call, the runtime pinned
  4  read the session's cache pace for the target profile (proxy/pacing), then plan native
     cache markers from it → the final upstream body
  5  token-window admission for that profile
  6  before_send on the final bytes, forwarded headers and the actual target; an allow
     seals a send binding naming that payload, target, principal and scope
  7  send with the profile's retries; on failure move to the next profile in the chain
     and go back to 4 (a new target is planned and checked again). A retry wait that would
     outlast the caller (the timeout its SDK declares, `patience`) is not slept through:
     the provider's answer (a 429 with its retry-after) goes back at once
  8  buffer: the complete raw response (bytes, time and concurrency limits), optionally
     sending SSE comment heartbeats to a streaming client meanwhile — only while the
     upstream is still sending (`heartbeat_stall_s`)
  9  decide: before_release on the complete response; it opens the send binding first
 10  release the original bytes (non-stream) or the re-framed events (stream), or refuse
     (once heartbeats are out, any refusal is the protocol's own error event)
 11  project the trail: usage records and metrics, the session's pace event, and (when
     collection is on) the attribution record of the prompt's blocks (never changes the
     decision; made in a callback that runs once the response is written)

Every step appends a typed event to the call's `Trail`; nothing else is written. Observe
mode (per route or profile, per phase) lets a non-allow decision through and records it;
for the release phase it streams the response through unchanged and checks a copy. A
client disconnect cancels the handler task: the upstream request is closed by the
`finally` blocks below and nothing keeps running. Every refusal is a `GatewayError`,
which the middleware renders in the caller's provider dialect.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from gateway import auth, errors
from gateway.cachepace import SessionPace
from gateway.carriers import sse
from gateway.carriers.base import Carrier, FoldedResponse
from gateway.checks import runner
from gateway.checks.bindings import BindingError
from gateway.checks.destination import Target
from gateway.checks.runner import CheckOutcome, Party
from gateway.checks.window import WindowedRelease
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.errors import ClientError, GatewayError, ServiceError, UpstreamError
from gateway.http.body import read_body
from gateway.obs import logging as log
from gateway.proxy import decide, pacing, patience, projections, release, replay, routing
from gateway.proxy.exchange import (
    Admitted,
    Attempted,
    Buffered,
    Checked,
    Decoded,
    Exchange,
    Planned,
    Refused,
    Released,
    Trail,
    Windowed,
)
from gateway.proxy.offload import OFFLOAD, Stale, parsed_stub
from gateway.proxy.upstream import UPSTREAM, Sent, upstream_headers
from gateway.state import (
    CALL,
    CAPACITY,
    CONTEXT,
    LOCAL_RELEASE_LEDGER,
    METRICS,
    PRINCIPAL_CALLS,
    RUNTIME,
    TIMELINE,
    Call,
)
from gateway.vocab import Decision, Mode, Outcome, Phase, ReasonCode

SESSION_HEADER = "x-wiregate-session"


async def handle(request: web.Request, carrier: Carrier) -> web.StreamResponse:
    app = request.app
    call: Call = request[CALL]
    runtime = app[RUNTIME].current  # one configuration for the whole call
    limits = runtime.config.limits
    call.carrier = carrier.name
    service = app.get(CONTEXT)
    creator_of = await auth.creators(runtime, request.headers, service.scope_creator if service else None)
    identity = auth.identify(runtime, request.headers, "proxy", creator_of=creator_of)  # 1 (before reading a byte)
    call.identify(identity, runtime)
    principal_calls = app[PRINCIPAL_CALLS]
    if not principal_calls.try_acquire(identity.principal.id, limits.per_principal_concurrent):
        raise ClientError(
            429, "rate_limited", (ReasonCode.CAPACITY_EXCEEDED,), headers={"retry-after": "1"}, retryable=True
        )
    try:
        exchange = call.exchange = await receive(request, runtime, carrier, identity, call)  # 1-3
        trail = call.trail = Trail()
        capacity = app[CAPACITY]
        if not capacity.try_acquire(limits.concurrent_buffered_responses):
            raise ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,), retryable=True)
        try:
            attempt = await send_along_chain(app, exchange, trail)  # 4-7
            return await respond(request, exchange, trail, attempt)  # 8-10
        except GatewayError as err:
            if trail.final is None:
                trail.add(Refused(err.status, err.code, err.reason_codes, Outcome.REFUSED))
            raise
        finally:
            capacity.release()
            records = await projections.record_usage(app, exchange, trail)  # 11
            projections.record_attribution(app, exchange, trail, records)  # 11
    finally:
        principal_calls.release(identity.principal.id)


# --- 1 to 3 --------------------------------------------------------------------------------


async def receive(
    request: web.Request, runtime: Runtime, carrier: Carrier, identity: auth.Identity, call: Call
) -> Exchange:
    limits = runtime.config.limits
    stages = request.app[METRICS].stages
    arrived = time.monotonic()
    started = time.perf_counter()
    raw = await read_body(request, limits)  # 1
    call.bytes_in = len(raw)
    stages["read"].observe(time.perf_counter() - started)
    started = time.perf_counter()
    replays = replay.parse(request.headers.getall(replay.HEADER, []))
    offload = request.app[OFFLOAD]
    offloaded = offload.wanted(runtime, len(raw))
    attributed = None
    if offloaded:  # 3, in a worker: the loop keeps the model, the stream flag and (collecting) the split
        try:
            summary = await offload.parse(runtime, carrier.name, raw, projections.labels_to_split(request))
            parsed, attributed = parsed_stub(carrier.name, summary), summary.attributed
        except Stale:
            offloaded = False
    if not offloaded:
        parsed = decide.parse_request(carrier, raw, runtime)  # 3
    stages["parse"].observe(time.perf_counter() - started)
    deadline = time.monotonic() + limits.buffer_seconds
    now = datetime.now(UTC)  # 2: the profile chain
    requested = request.headers.get(routing.PROFILE_HEADER)
    first = routing.primary(runtime, identity.principal, carrier.short_name, parsed.model, requested, now)
    fallbacks = routing.fallbacks(runtime, identity.principal, first, carrier.short_name, parsed.model, now)
    return Exchange(
        request_id=call.request_id,
        route=request.path,
        carrier=carrier,
        identity=identity,
        runtime=runtime,
        raw=raw,
        parsed=parsed,
        chain=(first, *fallbacks),
        deadline=deadline,
        wait_deadline=patience.waits_until(request.headers, arrived, deadline),
        client_headers=request.headers,
        session=request.headers.get(SESSION_HEADER),
        offloaded=offloaded,
        replays=replays,
        attributed=attributed,
    )


# --- 4 to 7 --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attempt:
    """The profile a call was finally sent to, and what came back (headers only)."""

    party: Party
    target: Target
    send: CheckOutcome
    sent: Sent
    usage_injected: bool

    @property
    def response(self) -> aiohttp.ClientResponse:
        assert self.sent.response is not None
        return self.sent.response


async def send_along_chain(app: web.Application, ex: Exchange, trail: Trail) -> Attempt:
    identity = ex.identity
    stages = app[METRICS].stages
    # Replayed prepared context: the store vouches for its dependencies once, before any check.
    eligible = await replay.eligibility(app.get(CONTEXT), ex.runtime, ex.replays, identity.principal)
    for index, loaded in enumerate(ex.chain):
        more = index + 1 < len(ex.chain)
        party = Party(identity.principal.id, identity.on_behalf_of, identity.scope, loaded)
        target = Target.for_profile(loaded, ex.carrier.name, ex.carrier.path)
        headers = upstream_headers(loaded.profile, loaded.credential, ex.client_headers)
        paced = await pacing.lookup(app, ex, party)  # 4
        if paced is not None:
            trail.add(paced)
        started = time.perf_counter()
        prepared = await prepare(app, ex, party, target, headers, eligible, paced.pace if paced else None)  # 4-6
        spent = time.perf_counter() - started
        stages["check_before_send"].observe(prepared.outcome.seconds)
        stages["plan"].observe(max(0.0, spent - prepared.outcome.seconds))
        trail.add(Planned(loaded.profile.id, len(prepared.body), prepared.cache, prepared.usage_injected))
        trail.add(Admitted(loaded.profile.id, prepared.input_estimate))
        send = prepared.outcome
        trail.add(Checked(loaded.profile.id, send))
        note_check(app, ex.request_id, send, loaded.profile.id, ex.route)
        if not send.proceed or send.binding is None:
            raise refusal(send, loaded.profile.id)
        if loaded.credential_error is not None:
            log.error("credential_unavailable", request_id=ex.request_id, profile=loaded.profile.id)
            if more:
                continue
            raise ServiceError(503, "upstream_unavailable", (ReasonCode.CREDENTIAL_UNAVAILABLE,), retryable=True)
        sent = await _send(app, ex, loaded, target, prepared.body, headers)  # 7
        for record in sent.attempts:
            trail.add(Attempted(record))
        failed = sent.response is None or sent.response.status in loaded.profile.retry.statuses
        # A request that may have reached the provider is not resent to a fallback either.
        resendable = not sent.reached or loaded.profile.retry.resend_after_reset
        if failed and more and resendable:
            status = sent.response.status if sent.response is not None else None
            if sent.response is not None:
                sent.response.close()
            log.warning(
                "fallback",
                request_id=ex.request_id,
                profile=loaded.profile.id,
                upstream_status=status,
                reason=sent.failure,
            )
            continue
        if sent.response is None:
            raise errors.upstream_unavailable(sent.failure or ReasonCode.UPSTREAM_UNAVAILABLE, resendable=resendable)
        return Attempt(party, target, send, sent, prepared.usage_injected)
    raise ServiceError(503, "upstream_unavailable", (ReasonCode.NO_PROFILE,), retryable=True)


def _left(attempt: Attempt) -> float:
    """Seconds left to read the attempt's response: its profile's `total_s` counts from the
    send, the call's deadline from its start (the send set `until` to the sooner)."""
    return max(0.0, attempt.sent.until - time.monotonic())


async def _send(
    app: web.Application,
    ex: Exchange,
    loaded: LoadedProfile,
    target: Target,
    body: bytes,
    headers: dict[str, str],
) -> Sent:
    remaining = ex.deadline - time.monotonic()
    if remaining <= 0:
        raise errors.upstream_unavailable(ReasonCode.UPSTREAM_TIMEOUT)
    metrics = app[METRICS]
    started = time.perf_counter()
    budget = min(remaining, loaded.profile.timeouts.total_s)  # the whole attempt, reading its body included
    sent = Sent(response=None, until=time.monotonic() + budget)
    try:
        async with asyncio.timeout(budget):
            # A wait for a retry that would outlast the attempt's budget is not slept through
            # either: the provider's answer (a 429 and its retry-after) goes back at once.
            deadline = min(ex.wait_deadline, sent.until)
            await app[UPSTREAM].send(target, loaded, body, headers, deadline=deadline, into=sent)
    except TimeoutError:
        sent.timed_out()  # what was tried before the deadline still counts (metrics, retry advice)
    metrics.stages["upstream"].observe(time.perf_counter() - started)  # to the response headers
    for attempt in sent.attempts:
        metrics.upstream_attempts.labels(loaded.profile.id, attempt.outcome).inc()
    return sent


async def prepare(
    app: web.Application,
    ex: Exchange,
    party: Party,
    target: Target,
    headers: dict[str, str],
    eligible: Mapping[str, bool],
    pace: SessionPace | None = None,
) -> decide.Prepared:
    """Steps 4-6 for one profile (`decide.prepare_send`), in a worker for a large body."""
    if ex.offloaded:
        try:
            return await app[OFFLOAD].prepare_send(
                ex.runtime,
                ex.carrier.name,
                ex.raw,
                party,
                target,
                headers,
                session=ex.session,
                route=ex.route,
                replays=ex.replays,
                eligible=eligible,
                pace=pace,
            )
        except Stale:
            log.warning("offload_stale", request_id=ex.request_id)
    parsed = ex.parsed if not ex.offloaded else decide.parse_request(ex.carrier, ex.raw, ex.runtime)
    return decide.prepare_send(
        ex.runtime,
        ex.carrier,
        parsed,
        ex.raw,
        party,
        target,
        headers,
        session=ex.session,
        route=ex.route,
        replays=ex.replays,
        eligible=eligible,
        pace=pace,
    )


def refusal(outcome: CheckOutcome, profile: str | None = None) -> GatewayError:
    codes = outcome.verdict.reason_codes
    blocked = outcome.verdict.decision is Decision.BLOCK
    if outcome.phase is Phase.BEFORE_SEND:
        return errors.blocked_request(codes) if blocked else errors.withheld_request(codes, profile=profile)
    return errors.blocked_response(codes) if blocked else errors.withheld_response(codes)


# --- 8 to 10 -------------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


Beat = Callable[[], Awaitable[None]]


class Heartbeats:
    """SSE comment heartbeats for a strict stream still buffering. Once the first one is
    out, the status line and headers are committed: any later outcome must be written as
    events on the open stream."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.headers = headers
        self.out: web.StreamResponse | None = None

    async def beat(self) -> None:
        await self.write(sse.HEARTBEAT)

    async def write(self, data: bytes) -> None:
        if self.out is None:
            self.out = web.StreamResponse(status=200, headers=self.headers)
            self.out.content_type = "text/event-stream"
            self.out.headers["Cache-Control"] = "no-cache"
            await self.out.prepare(self.request)
        await self.out.write(data)

    async def finish(self, body: bytes) -> web.StreamResponse:
        assert self.out is not None
        await self.out.write(body)
        await self.out.write_eof()
        return self.out


@dataclass(frozen=True, slots=True)
class Decided:
    """Step 9's result: what the response says, the exact bytes to release, the verdict."""

    read: decide.Read
    outcome: CheckOutcome

    @property
    def released(self) -> bytes:
        return self.read.released


async def respond(request: web.Request, ex: Exchange, trail: Trail, attempt: Attempt) -> web.StreamResponse:
    runtime = ex.runtime
    response = attempt.response
    mode = runtime.policy.mode(Phase.BEFORE_RELEASE, profile=attempt.target.profile_id, route=ex.route)
    passed = release.released_headers(response.headers)
    # a stream only to a client that asked for one (an answer framed otherwise is refused in step 9)
    is_stream = _is_stream(response) and ex.parsed.stream
    heartbeats: Heartbeats | None = None
    streaming = runtime.config.streaming
    stages = request.app[METRICS].stages
    try:
        if mode is not Mode.ENFORCE:
            return await pass_through(request, ex, trail, attempt, mode)
        if is_stream and 200 <= response.status < 300 and attempt.party.profile.profile.release == "windowed":
            return await release_windowed(request, ex, trail, attempt, passed)
        if is_stream and streaming.heartbeat_after_s > 0 and 200 <= response.status < 300:
            clean = decide.headers_pass(runtime, passed, attempt.target.profile_id)
            heartbeats = Heartbeats(request, passed if clean else {})
        started = time.perf_counter()
        body = await buffer(request.app, ex, trail, attempt, heartbeats)  # 8
        stages["buffer"].observe(time.perf_counter() - started)
        started = time.perf_counter()
        decided = await check_response(request.app, ex, trail, attempt, body, passed)  # 9
        stages["check_before_release"].observe(time.perf_counter() - started)
    except Exception as exc:
        if heartbeats is None or heartbeats.out is None:
            raise
        return await _error_event(request, ex, trail, heartbeats, exc)
    finally:
        response.close()  # never back to the pool half-read; a no-op once fully read
    started = time.perf_counter()
    try:
        return await release_decided(ex, trail, attempt, decided, passed, heartbeats)  # 10
    finally:
        stages["release"].observe(time.perf_counter() - started)


@contextlib.asynccontextmanager
async def _reading(trail: Trail) -> AsyncIterator[None]:
    """A failed read of the upstream response, as the refusal it is: past the call's
    deadline, over the response limit (`_TooLarge`), or a broken connection."""
    try:
        yield
    except TimeoutError:
        raise _refused(trail, errors.upstream_unavailable(ReasonCode.BUFFER_TIMEOUT), Outcome.TIMEOUT) from None
    except _TooLarge:
        err = UpstreamError(503, "response_withheld", (ReasonCode.RESPONSE_TOO_LARGE,))
        raise _refused(trail, err, Outcome.WITHHELD) from None
    except (aiohttp.ClientError, OSError):
        err = errors.incomplete_response((ReasonCode.RESPONSE_INCOMPLETE,))
        raise _refused(trail, err, Outcome.INCOMPLETE) from None


async def buffer(
    app: web.Application, ex: Exchange, trail: Trail, attempt: Attempt, heartbeats: Heartbeats | None
) -> bytes:
    """Step 8: the whole body, within the response limits and the call's deadline; with
    heartbeats, a comment after `heartbeat_after_s` of buffering and every
    `heartbeat_every_s` after that — but only while the upstream makes progress: after
    `heartbeat_stall_s` without a new upstream byte none is sent until bytes arrive again,
    so the client's read timeout can fire on a stalled upstream."""
    limits = ex.runtime.config.limits
    streaming = ex.runtime.config.streaming
    response = attempt.response
    chunks: list[bytes] = []
    total = 0
    gauge = app[METRICS].buffered_bytes
    progress = time.monotonic()  # the headers, then each chunk
    next_beat = progress + streaming.heartbeat_after_s
    try:
        async with _reading(trail), asyncio.timeout(_left(attempt)):
            while True:
                stalled = time.monotonic() - progress >= streaming.heartbeat_stall_s
                if heartbeats is None or stalled:
                    chunk = await response.content.readany()
                else:
                    try:
                        async with asyncio.timeout(max(0.0, next_beat - time.monotonic())):
                            chunk = await response.content.readany()
                    except TimeoutError:
                        if time.monotonic() - progress < streaming.heartbeat_stall_s:
                            await heartbeats.beat()
                        next_beat = time.monotonic() + streaming.heartbeat_every_s
                        continue
                progress = time.monotonic()
                if not chunk:
                    break
                total += len(chunk)
                if total > limits.response_bytes:
                    raise _TooLarge
                gauge.inc(len(chunk))
                chunks.append(chunk)
    except BaseException:
        # Ended before the whole response was read (cut, too slow, too large, the client
        # gone): what a stream reported so far is usage the provider bills, as on a windowed
        # release (the input and cache figures of Anthropic's first event).
        if chunks and _is_stream(response):
            usage, response_id = decide.reported_so_far(ex.carrier, b"".join(chunks), ex.runtime)
            trail.add(Decoded(False, usage, response_id, None))
        raise
    finally:
        gauge.dec(sum(len(c) for c in chunks))
    body = b"".join(chunks)
    trail.add(Buffered(attempt.target.profile_id, response.status, _is_stream(response), len(body)))
    return body


async def check_response(
    app: web.Application,
    ex: Exchange,
    trail: Trail,
    attempt: Attempt,
    body: bytes,
    passed: dict[str, str],
    *,
    folded: tuple[FoldedResponse, bytes] | None = None,
) -> Decided:
    """Step 9: read the response as its carrier does and run before_release on the exact
    bytes that would be released, tied to this call's send binding. `folded`: the response
    already folded, with the bytes a release sends (a windowed stream)."""
    response = attempt.response
    read, outcome = await read_and_check(app, ex, attempt, body, passed, Mode.ENFORCE, folded=folded)
    trail.add(Decoded(read.complete, read.usage, read.response_id, read.output_estimate))
    status = response.status
    success = 200 <= status < 300
    if (
        (not success and not read.complete)
        or not (success or 400 <= status < 600)
        or (success and read.complete and _is_stream(response) != ex.parsed.stream)
    ):
        # A provider error we cannot read (an HTML page from a proxy, say), a redirect (never
        # followed: the call and its credential stay with the profile's upstream, and a client
        # must not be sent elsewhere either), a status HTTP does not define (600 and up), or a
        # whole success framed other than the client asked (an event stream to a call that
        # did not ask for one, a body to one that did: no client could read it as its answer;
        # one that cannot be read at all is withheld as such, below): say so, without it.
        err = UpstreamError(502, "upstream_error", (ReasonCode.UPSTREAM_INVALID_RESPONSE,))
        raise _refused(trail, err, Outcome.WITHHELD)
    trail.add(Checked(attempt.target.profile_id, outcome))
    if not outcome.proceed:
        end = (
            Outcome.INCOMPLETE
            if not read.complete
            else (Outcome.BLOCKED if outcome.verdict.decision is Decision.BLOCK else Outcome.WITHHELD)
        )
        raise _refused(trail, refusal(outcome), end)
    return Decided(read, outcome)


async def read_and_check(
    app: web.Application,
    ex: Exchange,
    attempt: Attempt,
    body: bytes,
    headers: dict[str, str],
    mode: Mode,
    *,
    incomplete: bool = False,
    folded: tuple[FoldedResponse, bytes] | None = None,
) -> tuple[decide.Read, CheckOutcome]:
    """`decide.read_response` (in a worker for a large body), then the gateway's own half
    of before_release: the send binding and the release ledger (no release binding: the
    gateway releases the bytes itself, so no one would receive one)."""
    assert attempt.send.binding is not None
    runtime = ex.runtime
    is_stream = _is_stream(attempt.response)
    started = time.perf_counter()
    offload = app[OFFLOAD]
    read: decide.Read | None = None
    if folded is not None:
        read = decide.read_folded(
            runtime, folded[0], folded[1], party=attempt.party, headers=headers, mode=mode, now=time.time()
        )
    elif offload.wanted(runtime, len(body)):
        try:
            read = await offload.read_response(
                runtime, ex.carrier.name, body, is_stream=is_stream, usage_injected=attempt.usage_injected,
                party=attempt.party, headers=headers, mode=mode, incomplete=incomplete,
            )  # fmt: skip
        except Stale:
            log.warning("offload_stale", request_id=ex.request_id)
    if read is None:
        read = decide.read_response(
            runtime, ex.carrier, body, is_stream=is_stream, usage_injected=attempt.usage_injected,
            party=attempt.party, headers=headers, mode=mode, now=time.time(), incomplete=incomplete,
        )  # fmt: skip
    outcome = await runner.before_release(
        runtime,
        attempt.party,
        read.released,
        (read.verdict, read.mode),
        request_binding=attempt.send.binding,
        ledger=app[LOCAL_RELEASE_LEDGER],
        seconds=time.perf_counter() - started,
        seal=False,
    )
    note_check(app, ex.request_id, outcome, attempt.party.profile.profile.id, ex.route)
    return read, outcome


async def release_decided(
    ex: Exchange,
    trail: Trail,
    attempt: Attempt,
    decided: Decided,
    passed: dict[str, str],
    heartbeats: Heartbeats | None,
) -> web.StreamResponse:
    """Step 10: the original bytes (non-stream) or the re-framed, checked events (stream)."""
    response = attempt.response
    ok = 200 <= response.status < 300
    trail.add(
        Released(response.status, len(decided.released), Outcome.RELEASED if ok else Outcome.UPSTREAM_ERROR_RELEASED)
    )
    if heartbeats is not None and heartbeats.out is not None:
        return await heartbeats.finish(decided.released)
    if _is_stream(response):
        return release.release_stream(response.status, passed, decided.released)
    content_type = release.released_content_type(response.headers.get("content-type"))
    return release.release_body(response.status, passed, decided.released, content_type)


async def release_windowed(
    request: web.Request, ex: Exchange, trail: Trail, attempt: Attempt, passed: dict[str, str]
) -> web.StreamResponse:
    """Steps 8-10 for a profile with `release = "windowed"` (checks/window): each event
    goes out once it and the window after it are inspected; the end of the stream is then
    checked whole, as a buffered stream is, before the held remainder is released. A refusal
    before the first release is an ordinary error response; after it, the protocol's error
    event, and nothing after the last released event leaves."""
    runtime = ex.runtime
    response = attempt.response
    limits = runtime.config.limits
    stages = request.app[METRICS].stages
    assert attempt.send.binding is not None
    try:
        runner.open_send_binding(runtime, attempt.send.binding, attempt.party, time.time())
    except BindingError as exc:  # nothing is released for a send no one can vouch for
        response.close()
        raise _refused(trail, errors.withheld_response((exc.reason,)), Outcome.WITHHELD) from None
    profile_id = attempt.target.profile_id
    window = WindowedRelease(runtime, ex.carrier, profile_id, passed, attempt.usage_injected)
    spec = runtime.policy.window
    stream = Heartbeats(request, passed)  # holds the open response once the first bytes are out
    total = 0  # the window keeps the stream's events (not its bytes) until the end
    counted = 0  # what the buffered-bytes gauge holds for this call
    inspecting = 0.0
    gauge = request.app[METRICS].buffered_bytes
    started = time.perf_counter()

    def record() -> None:
        trail.add(Windowed(spec.chars, spec.cap, len(spec.capped), window.checks, window.released_bytes))

    try:
        try:
            async with _reading(trail), asyncio.timeout(_left(attempt)):
                while chunk := await response.content.readany():
                    total += len(chunk)
                    if total > limits.response_bytes:
                        raise _TooLarge
                    gauge.inc(len(chunk))
                    counted += len(chunk)
                    step = window.feed(chunk, time.monotonic())
                    inspecting += step.seconds
                    if step.refusal is not None:
                        outcome = CheckOutcome(Phase.BEFORE_RELEASE, step.refusal, Mode.ENFORCE, step.seconds)
                        trail.add(Checked(profile_id, outcome))
                        note_check(request.app, ex.request_id, outcome, profile_id, ex.route)
                        blocked = step.refusal.decision is Decision.BLOCK
                        raise _refused(trail, refusal(outcome), Outcome.BLOCKED if blocked else Outcome.WITHHELD)
                    if step.release:
                        await stream.write(step.release)
        except BaseException:
            # Ended before the whole stream was read (refused, cut, too slow, too large, the
            # client gone): what the provider reported so far is usage it bills (the input and
            # cache figures of Anthropic's first event); its output figure comes at the end.
            usage, response_id = window.reported()
            trail.add(Decoded(False, usage, response_id, None))
            raise
        finally:
            gauge.dec(counted)
            response.close()
        trail.add(Buffered(profile_id, response.status, True, total))
        stages["buffer"].observe(max(0.0, time.perf_counter() - started - inspecting))
        checked_at = time.perf_counter()
        whole = window.close()  # the stream as the window folded it: not read a second time
        decided = await check_response(request.app, ex, trail, attempt, b"", passed, folded=whole)
        stages["check_before_release"].observe(inspecting + time.perf_counter() - checked_at)
    except Exception as exc:
        record()
        if stream.out is None:
            raise
        return await _error_event(request, ex, trail, stream, exc)
    record()
    trail.add(Released(response.status, len(decided.released), Outcome.RELEASED))
    released_at = time.perf_counter()
    try:
        if stream.out is None:  # nothing could go early (a stream that arrived in one read)
            return release.release_stream(response.status, passed, decided.released)
        return await stream.finish(decided.released[window.released_bytes :])
    finally:
        stages["release"].observe(time.perf_counter() - released_at)


async def _error_event(
    request: web.Request, ex: Exchange, trail: Trail, heartbeats: Heartbeats, exc: Exception
) -> web.StreamResponse:
    """Headers are out: any refusal, and any failure of ours, becomes the protocol's own
    error event (never a second status line inside the open stream)."""
    if isinstance(exc, GatewayError):
        err = exc
    else:
        log.error("internal_error", request_id=ex.request_id, error_class=type(exc).__name__, route=ex.route)
        err = ServiceError(500, "internal_error", ())
    final = trail.final  # why it was refused, when the refusal was ours to decide
    outcome = final.outcome if isinstance(final, Refused) else Outcome.ERROR
    trail.add(Refused(err.status, err.code, err.reason_codes, outcome, in_stream=True))  # how it was delivered
    event = ex.carrier.stream_error_event(
        err.code, err.reason_codes, err.public_message, errors.error_type(err, ex.carrier.dialect)
    )
    return await heartbeats.finish(event)


async def pass_through(
    request: web.Request, ex: Exchange, trail: Trail, attempt: Attempt, mode: Mode
) -> web.StreamResponse:
    """Observe/off: stream the response through unchanged; check a bounded copy after.
    The send binding is verified first whatever the mode: binding checks are never modes."""
    response = attempt.response
    assert attempt.send.binding is not None
    try:
        runner.open_send_binding(ex.runtime, attempt.send.binding, attempt.party, time.time())
    except BindingError as exc:
        raise _refused(trail, errors.withheld_response((exc.reason,)), Outcome.WITHHELD) from None
    limit = ex.runtime.config.limits.response_bytes
    passed = release.released_headers(response.headers)
    out = web.StreamResponse(status=response.status, headers=passed)
    out.content_type = response.content_type
    await out.prepare(request)
    copy: list[bytes] = []
    size = 0
    broken = False
    try:
        async with asyncio.timeout(_left(attempt)):  # observe and off have the same deadline as strict
            async for chunk in response.content.iter_any():
                await out.write(chunk)
                size += len(chunk)
                if size <= limit:
                    copy.append(chunk)
    except (aiohttp.ClientError, OSError, TimeoutError):
        broken = True  # cut where it stopped: the client sees the stream end uncleanly
    trail.add(Buffered(attempt.target.profile_id, response.status, _is_stream(response), size))
    if mode is Mode.OBSERVE:
        read, outcome = await read_and_check(
            request.app, ex, attempt, b"".join(copy), passed, Mode.OBSERVE, incomplete=broken or size > limit
        )
        trail.add(Decoded(read.complete, read.usage, read.response_id, None))
        trail.add(Checked(attempt.target.profile_id, outcome))
    elif size <= limit:  # off: nothing is checked, but the provider's usage is still recorded (a cut stream's so far)
        folded, _ = decide.decode(ex.carrier, b"".join(copy), _is_stream(response), ex.runtime)
        usage = dict(folded.usage.fields) if folded.usage else None
        trail.add(Decoded(folded.complete and not broken, usage, folded.response_id, None))
    trail.add(Released(response.status, size, Outcome.INCOMPLETE if broken else Outcome.OBSERVED))
    if broken:
        # Do not end the stream cleanly: the client must see that it was cut.
        if request.transport is not None:
            request.transport.close()
        return out
    await out.write_eof()
    return out


# --- bookkeeping ---------------------------------------------------------------------------


def _is_stream(response: aiohttp.ClientResponse) -> bool:
    return response.content_type == "text/event-stream"


def _refused(trail: Trail, err: GatewayError, outcome: Outcome) -> GatewayError:
    trail.add(Refused(err.status, err.code, err.reason_codes, outcome))
    return err


def note_check(app: web.Application, request_id: str, outcome: CheckOutcome, profile: str, route: str) -> None:
    """Metrics, the pages' timeline and (for anything but a plain enforced allow) a
    content-free decision line."""
    metrics = app[METRICS]
    verdict = outcome.verdict
    timeline = app.get(TIMELINE)
    if timeline is not None:
        timeline.note_decision(
            time.time(), outcome.phase.value, verdict.decision.value, verdict.reason_codes, route, profile
        )
    metrics.check_seconds.labels(outcome.phase.value).observe(outcome.seconds)
    for reason in verdict.reason_codes or ("none",):
        metrics.decisions.labels(outcome.phase.value, verdict.decision.value, reason, outcome.mode.value).inc()
    if not verdict.allowed or outcome.mode is not Mode.ENFORCE:
        log.info(
            "decision",
            request_id=request_id,
            phase=outcome.phase.value,
            decision=verdict.decision.value,
            mode=outcome.mode.value,
            reason_codes=verdict.reason_codes,
            locations=verdict.locations()[:16],
            profile=profile,
            policy_version=verdict.policy_version,
            observed=outcome.observed_only,
        )
    advisory = sorted({f.reason for f in verdict.findings if f.advisory})
    if advisory:
        for reason in advisory:
            metrics.advisory_findings.labels(outcome.phase.value, reason).inc()
        log.info(
            "advisory_findings",
            request_id=request_id,
            phase=outcome.phase.value,
            reason_codes=advisory,
            profile=profile,
        )
