"""The wire path for one provider request (SPEC §5). This module alone orders the steps.

Theory of operation
-------------------
A provider call arrives on the TLS or Unix-socket listener and reaches `handle`:

  1  authenticate the gateway key, then read the whole body (size limit; identity or gzip)
  2  resolve principal, scope and the profile chain (primary + usable fallbacks)
  3  parse the body with the route's carrier: every text unit, opaque parts, duplicates
  4  plan native cache markers for the target profile → the final upstream body
  5  token-window admission for that profile
  6  before_send on the final bytes, forwarded headers and the actual target; an allow
     seals a send binding naming that payload, target, principal and scope
  7  send with the profile's retries; on failure move to the next profile in the chain
     and go back to 4 (a new target is planned and checked again)
  8  strict: buffer the complete raw response (bytes, time and concurrency limits),
     optionally sending SSE comment heartbeats to a streaming client meanwhile
  9  before_release on the complete response; it opens the send binding of step 6 first
 10  release the original bytes (non-stream) or the re-framed events (stream), or refuse
     (once heartbeats are out, a refusal is the protocol's own error event)
 11  record usage (never changes or delays the decision)

Observe mode (per route or profile, per phase) lets a non-allow decision through and
records it; for the release phase it streams the response through unchanged and checks a
copy. A client disconnect cancels the handler task: the upstream request is closed by the
`finally` blocks below and nothing keeps running. Every refusal is a `GatewayError`, which
the middleware renders in the caller's provider dialect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from aiohttp import web

from gateway import admission, auth, caching, checks, errors, usage
from gateway.carriers import SHORT_NAMES, jsonspan, sse
from gateway.carriers.base import Carrier, CarrierLimits, FoldedResponse, ParsedRequest
from gateway.bindings import BindingError
from gateway.carriers.jsonraw import JsonError
from gateway.checks import CheckOutcome, Party
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.errors import GatewayError
from gateway.http.body import read_body
from gateway.inspection import verdict as rc
from gateway.inspection.verdict import Decision, Mode, Phase
from gateway.obs import logging as log
from gateway.proxy import release, routing
from gateway.proxy.upstream import Sent, Target, upstream_headers
from gateway.state import CALL, SERVICES, Call, Services

_SHORT_OF = {full: short for short, full in SHORT_NAMES.items()}


async def handle(request: web.Request, carrier: Carrier) -> web.StreamResponse:
    services = request.app[SERVICES]
    call: Call = request[CALL]
    runtime = services.holder.current  # one configuration for the whole call
    limits = runtime.config.limits
    call.carrier = carrier.name

    identity = auth.identify(runtime, request.headers, "proxy")  # 1 (before reading a byte)
    call.principal, call.scope = identity.principal.id, identity.scope_for_log(runtime)
    call.delegate_for = identity.on_behalf_of
    if not services.principal_calls.try_acquire(identity.principal.id, limits.per_principal_concurrent):
        raise GatewayError(429, "rate_limited", (rc.CAPACITY_EXCEEDED,), headers={"retry-after": "1"}, retryable=True)
    try:
        return await _handle(request, services, runtime, carrier, call, identity)
    finally:
        services.principal_calls.release(identity.principal.id)


async def _handle(
    request: web.Request, services: Services, runtime: Runtime, carrier: Carrier, call: Call, identity: auth.Identity
) -> web.StreamResponse:
    limits = runtime.config.limits
    raw = await read_body(request, limits)  # 1
    call.bytes_in = len(raw)

    parsed = parse_request(carrier, raw, runtime)  # 3
    call.stream = parsed.stream  # the model name is logged only once a check has passed it

    now = datetime.now(UTC)  # 2: the profile chain
    short = _SHORT_OF[carrier.name]
    requested = request.headers.get(routing.PROFILE_HEADER)
    first = routing.primary(runtime, identity.principal, short, parsed.model, requested, now)
    chain = [first, *routing.fallbacks(runtime, identity.principal, first, short, parsed.model, now)]

    if not services.capacity.try_acquire(limits.concurrent_buffered_responses):
        raise GatewayError(503, "gateway_busy", (rc.CAPACITY_EXCEEDED,), retryable=True)
    try:
        deadline = time.monotonic() + limits.buffer_seconds
        parties = [Party(identity.principal.id, identity.on_behalf_of, identity.scope, lp) for lp in chain]
        sent, target, party, send = await _send_along_chain(  # 4-7
            request, services, runtime, carrier, parsed, raw, parties, deadline
        )
        return await _receive(request, services, runtime, carrier, sent, target, party, send, deadline)  # 8-10
    finally:
        services.capacity.release()
        _record_usage(services, call)  # 11


# --- 1 and 3 ---------------------------------------------------------------------------


def parse_request(carrier: Carrier, raw: bytes, runtime: Runtime) -> ParsedRequest:
    try:
        return carrier.parse_request(raw, runtime.carrier_limits)
    except JsonError as exc:
        status = 422 if exc.reason in (rc.UNSUPPORTED_CARRIER, rc.TOO_DEEP) else 400
        raise GatewayError(status, "request_withheld", (exc.reason,)) from None


# --- 4 to 7 ----------------------------------------------------------------------------


async def _send_along_chain(
    request: web.Request,
    services: Services,
    runtime: Runtime,
    carrier: Carrier,
    parsed: ParsedRequest,
    raw: bytes,
    parties: list[Party],
    deadline: float,
) -> tuple[Sent, Target, Party, CheckOutcome]:
    call: Call = request[CALL]
    assert services.upstream is not None
    for index, party in enumerate(parties):
        loaded = party.profile
        more = index + 1 < len(parties)
        target = Target.for_profile(loaded, carrier.name, carrier.path)
        call.profile = loaded.profile.id
        planned = plan(carrier, parsed, raw, party, request.headers.get(SESSION_HEADER), runtime.carrier_limits)  # 4
        call.input_estimate = admit(planned.parsed, carrier, loaded)  # 5
        body = planned.body
        call.usage_injected = planned.usage_injected
        headers = upstream_headers(loaded.profile, loaded.credential, request.headers)
        bound = checks.relevant_headers(headers, loaded)
        send = checks.before_send(  # 6
            runtime,
            party=party,
            parsed=[planned.parsed],
            body=body,
            headers=bound,
            carrier=carrier.name,
            target=target,
            route=request.path,
        )
        _note_check(services, call, send, loaded.profile.id)
        if not send.proceed or send.binding is None:
            raise _refusal(send)
        if send.verdict.allowed:
            call.model = parsed.model  # checked text: safe for the access log
        if loaded.credential_error is not None:
            log.error("credential_unavailable", request_id=call.request_id, profile=loaded.profile.id)
            if more:
                continue
            raise GatewayError(503, "upstream_unavailable", (rc.CREDENTIAL_UNAVAILABLE,), retryable=True)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GatewayError(503, "upstream_timeout", (rc.UPSTREAM_TIMEOUT,), retryable=True)
        try:
            async with asyncio.timeout(min(remaining, loaded.profile.timeouts.total_s)):
                sent = await services.upstream.send(target, loaded, body, headers, deadline=deadline)  # 7
        except TimeoutError:
            sent = Sent(response=None, failure=rc.UPSTREAM_TIMEOUT)
        call.attempts.extend(sent.attempts)
        for attempt in sent.attempts:
            services.metrics.upstream_attempts.labels(loaded.profile.id, attempt.outcome).inc()
        failed = sent.response is None or sent.response.status in loaded.profile.retry.statuses
        if failed and more:
            status = sent.response.status if sent.response is not None else None
            if sent.response is not None:
                sent.response.close()
            log.warning(
                "fallback",
                request_id=call.request_id,
                profile=loaded.profile.id,
                upstream_status=status,
                reason=sent.failure,
            )
            continue
        if sent.response is None:
            failure = sent.failure or rc.UPSTREAM_UNAVAILABLE
            code = "upstream_timeout" if failure == rc.UPSTREAM_TIMEOUT else "upstream_unavailable"
            raise GatewayError(503, code, (failure,), retryable=True)
        return sent, target, party, send
    raise GatewayError(503, "upstream_unavailable", (rc.NO_PROFILE,), retryable=True)


SESSION_HEADER = "x-wiregate-session"


@dataclass(frozen=True, slots=True)
class Planned:
    body: bytes  # the final upstream body: what before_send checks and what leaves
    parsed: ParsedRequest  # that body as the carrier reads it
    usage_injected: bool  # the stream was asked for usage the client did not ask for


def plan(
    carrier: Carrier,
    parsed: ParsedRequest,
    raw: bytes,
    party: Party,
    session: str | None,
    limits: CarrierLimits,
) -> Planned:
    """Step 4: native cache markers for this profile, and usage for streams that would
    otherwise not report it. The received bytes are never mutated; when planning changes
    the body, the new bytes are parsed again so that before_send sees exactly what leaves.
    A plan that cannot be made leaves the body as sent (an optimisation that fails never
    turns a check off)."""
    profile = party.profile.profile
    estimator = admission.ESTIMATORS[profile.estimator.name]
    unchanged = Planned(raw, parsed, False)
    if parsed.duplicate_keys:
        return unchanged  # withheld by before_send anyway; never edit an ambiguous body
    try:
        text = raw.decode("utf-8")
        ctx = caching.CacheContext(party.principal, party.scope, profile.id, session)
        cache = caching.plan(carrier.name, text, parsed.doc, profile.cache, ctx, estimator.count)
        usage_edits, injected = usage.plan_stream_usage(carrier.name, text, parsed.doc)
        edits = [*cache.edits, *usage_edits]
        if not edits:
            return unchanged
        body = jsonspan.apply(text, edits).encode("utf-8")
        return Planned(body, carrier.parse_request(body, limits), injected)
    except (jsonspan.SpanError, JsonError, UnicodeDecodeError) as exc:
        log.warning("cache_plan_skipped", profile=profile.id, error_class=type(exc).__name__)
        return unchanged


def admit(parsed: ParsedRequest, carrier: Carrier, loaded: LoadedProfile) -> int:
    """Step 5: the request must fit the profile's context window, or it is withheld.
    Returns the input estimate (usage records use it where the provider says nothing)."""
    profile = loaded.profile
    decision = admission.admit(
        parsed.units,
        carrier=carrier.name,
        doc=parsed.doc,
        estimator=admission.ESTIMATORS[profile.estimator.name],
        margin=profile.estimator.safety_margin,
        context_window=profile.context_window,
        default_output=profile.max_output_tokens,
    )
    if not decision.admitted:
        raise GatewayError(422, "request_withheld", (rc.WINDOW_EXCEEDED,))
    return decision.estimated_input


def _refusal(outcome: CheckOutcome) -> GatewayError:
    codes = outcome.verdict.reason_codes
    blocked = outcome.verdict.decision is Decision.BLOCK
    if outcome.phase is Phase.BEFORE_SEND:
        return errors.blocked_request(codes) if blocked else errors.withheld_request(codes)
    return errors.blocked_response(codes) if blocked else errors.withheld_response(codes)


# --- 8 to 10 ---------------------------------------------------------------------------


class _TooLarge(Exception):
    pass


Beat = Callable[[], Awaitable[None]]


async def _read_all(
    response: aiohttp.ClientResponse,
    limit: int,
    services: Services,
    beat: Beat | None,
    first_beat_s: float,
    every_s: float,
) -> bytes:
    """The whole body, within `limit` bytes. With `beat`, call it after `first_beat_s` of
    buffering and every `every_s` after that until the body is complete."""
    chunks: list[bytes] = []
    total = 0
    gauge = services.metrics.buffered_bytes
    next_beat = time.monotonic() + first_beat_s
    try:
        while True:
            if beat is None:
                chunk = await response.content.readany()
            else:
                try:
                    async with asyncio.timeout(max(0.0, next_beat - time.monotonic())):
                        chunk = await response.content.readany()
                except TimeoutError:
                    await beat()
                    next_beat = time.monotonic() + every_s
                    continue
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                raise _TooLarge
            gauge.inc(len(chunk))
            chunks.append(chunk)
    finally:
        gauge.dec(sum(len(c) for c in chunks))


class _Heartbeats:
    """SSE comment heartbeats for a strict stream still buffering. Once the first one is
    out, the status line and headers are committed: any later outcome must be written as
    events on the open stream."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.headers = headers
        self.out: web.StreamResponse | None = None

    async def beat(self) -> None:
        if self.out is None:
            self.out = web.StreamResponse(status=200, headers=self.headers)
            self.out.content_type = "text/event-stream"
            self.out.headers["Cache-Control"] = "no-cache"
            await self.out.prepare(self.request)
        await self.out.write(sse.HEARTBEAT)

    async def finish(self, body: bytes) -> web.StreamResponse:
        assert self.out is not None
        await self.out.write(body)
        await self.out.write_eof()
        return self.out


async def _receive(
    request: web.Request,
    services: Services,
    runtime: Runtime,
    carrier: Carrier,
    sent: Sent,
    target: Target,
    party: Party,
    send: CheckOutcome,
    deadline: float,
) -> web.StreamResponse:
    call: Call = request[CALL]
    response = sent.response
    assert response is not None and send.binding is not None
    call.upstream_status = response.status
    limits = runtime.config.limits
    streaming = runtime.config.streaming
    is_stream = response.content_type == "text/event-stream"
    passed = release.released_headers(response.headers)
    heartbeats: _Heartbeats | None = None
    try:
        mode = runtime.policy.mode(Phase.BEFORE_RELEASE, profile=target.profile_id, route=request.path)
        if mode is not Mode.ENFORCE:
            return await _pass_through(request, services, runtime, carrier, response, party, send, mode)
        if is_stream and streaming.heartbeat_after_s > 0 and 200 <= response.status < 300:
            heartbeats = _Heartbeats(request, passed)
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                body = await _read_all(  # 8
                    response,
                    limits.response_bytes,
                    services,
                    heartbeats.beat if heartbeats else None,
                    streaming.heartbeat_after_s,
                    streaming.heartbeat_every_s,
                )
        except TimeoutError:
            call.final_outcome = "timeout"
            raise GatewayError(503, "upstream_timeout", (rc.BUFFER_TIMEOUT,), retryable=True) from None
        except _TooLarge:
            call.final_outcome = "withheld"
            raise GatewayError(503, "response_withheld", (rc.RESPONSE_TOO_LARGE,)) from None
        except (aiohttp.ClientError, OSError):
            call.final_outcome = "incomplete"
            raise GatewayError(503, "response_incomplete", (rc.RESPONSE_INCOMPLETE,), retryable=True) from None
        folded, released = _decode(carrier, body, is_stream, runtime, call.usage_injected)
        call.final_usage = folded.usage.fields if folded.usage else None
        if party.profile.profile.estimator.fill_missing:  # only then is an estimate ever used
            call.output_estimate = _output_estimate(folded, party)
        if not 200 <= response.status < 300 and not folded.complete:
            # A provider error we cannot read (an HTML page from a proxy, say): say so, without it.
            raise GatewayError(502, "upstream_error", (rc.UPSTREAM_INVALID_RESPONSE,))
        outcome = _check_release(request, services, runtime, party, send, folded, released, passed)  # 9
        if not outcome.proceed:
            call.final_outcome = (
                "blocked"
                if outcome.verdict.decision is Decision.BLOCK
                else ("incomplete" if not folded.complete else "withheld")
            )
            raise _refusal(outcome)
    except Exception as exc:
        if heartbeats is None or heartbeats.out is None:
            raise
        # Headers are out: any refusal, and any failure of ours, becomes the protocol's own
        # error event (never a second status line inside the open stream).
        if isinstance(exc, GatewayError):
            err = exc
        else:
            log.error("internal_error", request_id=call.request_id, error_class=type(exc).__name__, route=call.route)
            err = GatewayError(500, "internal_error", ())
        call.outcome = "refused_in_stream"
        call.reason_codes = err.reason_codes
        event = carrier.stream_error_event(
            err.code, err.reason_codes, err.public_message, errors.error_type(err, call.dialect)
        )
        return await heartbeats.finish(event)
    finally:
        response.close()  # never back to the pool half-read; a no-op once fully read
    call.outcome = "released" if 200 <= response.status < 300 else "upstream_error_released"
    call.final_outcome = "released" if 200 <= response.status < 300 else "upstream_error"
    call.bytes_out = len(released)
    if heartbeats is not None and heartbeats.out is not None:  # 10
        return await heartbeats.finish(released)
    if is_stream:
        return release.release_stream(response.status, passed, released)
    content_type = release.released_content_type(response.headers.get("content-type"))
    return release.release_body(response.status, passed, released, content_type)


def _check_release(
    request: web.Request,
    services: Services,
    runtime: Runtime,
    party: Party,
    send: CheckOutcome,
    folded: FoldedResponse,
    released: bytes,
    headers: dict[str, str],
    mode: Mode | None = None,
) -> CheckOutcome:
    """Step 9: before_release on what would be released, tied to this call's send binding."""
    assert send.binding is not None
    outcome = checks.before_release(
        runtime,
        party=party,
        request_binding=send.binding,
        folded=folded,
        raw=released,
        released_headers=headers,
        route=request.path,
        ledger=services.ledger,
        mode=mode,
    )
    _note_check(services, request[CALL], outcome, party.profile.profile.id)
    return outcome


def _decode(
    carrier: Carrier, body: bytes, is_stream: bool, runtime: Runtime, strip_usage: bool = False
) -> tuple[FoldedResponse, bytes]:
    """The folded response and the exact bytes that would be released (for a stream whose
    usage wiregate asked for, without the usage the client did not ask for)."""
    limits = runtime.carrier_limits
    if not is_stream:
        return carrier.parse_response(body, limits), body
    try:
        events, clean = sse.parse_all(body)
    except JsonError as exc:
        return FoldedResponse(units=(), complete=False, incomplete_reason=exc.reason), b""
    folded = carrier.fold_stream(events, limits)
    if not clean and folded.complete:
        folded = dataclasses.replace(folded, complete=False, incomplete_reason=rc.RESPONSE_INCOMPLETE)
    released = folded.events or events
    if strip_usage:
        released = usage.strip_injected_usage(released)
    return folded, release.reframe(released)


async def _pass_through(
    request: web.Request,
    services: Services,
    runtime: Runtime,
    carrier: Carrier,
    response: aiohttp.ClientResponse,
    party: Party,
    send: CheckOutcome,
    mode: Mode,
) -> web.StreamResponse:
    """Observe/off: stream the response through unchanged; check a bounded copy after.
    The send binding is verified first whatever the mode: binding checks are never modes."""
    call: Call = request[CALL]
    assert send.binding is not None
    try:
        checks.open_send_binding(runtime, send.binding, party, time.time())
    except BindingError as exc:
        raise errors.withheld_response((exc.reason,)) from None
    limit = runtime.config.limits.response_bytes
    passed = release.released_headers(response.headers)
    out = web.StreamResponse(status=response.status, headers=passed)
    out.content_type = response.content_type
    await out.prepare(request)
    copy: list[bytes] = []
    size = 0
    broken = False
    try:
        async for chunk in response.content.iter_any():
            await out.write(chunk)
            size += len(chunk)
            if size <= limit:
                copy.append(chunk)
    except (aiohttp.ClientError, OSError):
        broken = True
    call.bytes_out = size
    call.outcome = "observed"
    call.final_outcome = "incomplete" if broken else "released"
    if mode is Mode.OBSERVE and send.binding is not None:
        is_stream = response.content_type == "text/event-stream"
        folded, released = _decode(carrier, b"".join(copy), is_stream, runtime, call.usage_injected)
        call.final_usage = folded.usage.fields if folded.usage else None
        if broken or size > limit:
            folded = dataclasses.replace(folded, complete=False, incomplete_reason=rc.RESPONSE_INCOMPLETE)
        _check_release(request, services, runtime, party, send, folded, released, passed, Mode.OBSERVE)
    if broken:
        # Do not end the stream cleanly: the client must see that it was cut.
        if request.transport is not None:
            request.transport.close()
        return out
    await out.write_eof()
    return out


# --- bookkeeping -----------------------------------------------------------------------


def _note_check(services: Services, call: Call, outcome: CheckOutcome, profile: str) -> None:
    call.checks.append(outcome)
    verdict = outcome.verdict
    services.metrics.check_seconds.labels(outcome.phase.value).observe(outcome.seconds)
    for reason in verdict.reason_codes or ("none",):
        services.metrics.decisions.labels(outcome.phase.value, verdict.decision.value, reason, outcome.mode.value).inc()
    if not verdict.allowed or outcome.mode is not Mode.ENFORCE:
        log.info(
            "decision",
            request_id=call.request_id,
            phase=outcome.phase.value,
            decision=verdict.decision.value,
            mode=outcome.mode.value,
            reason_codes=verdict.reason_codes,
            locations=verdict.locations()[:16],
            profile=profile,
            policy_version=verdict.policy_version,
            observed=outcome.observed_only,
        )
    if not verdict.allowed:
        call.reason_codes = verdict.reason_codes
    advisory = sorted({f.reason for f in verdict.findings if f.advisory})
    if advisory:
        for reason in advisory:
            services.metrics.advisory_findings.labels(outcome.phase.value, reason).inc()
        log.info(
            "advisory_findings",
            request_id=call.request_id,
            phase=outcome.phase.value,
            reason_codes=advisory,
            profile=profile,
        )


def _output_estimate(folded: FoldedResponse, party: Party) -> int:
    estimator = admission.ESTIMATORS[party.profile.profile.estimator.name]
    kinds = ("folded",) if any(u.kind == "folded" for u in folded.units) else ("string",)
    return sum(estimator.count(u.text) for u in folded.units if u.kind in kinds)


def _record_usage(services: Services, call: Call) -> None:
    """Step 11: one usage record per upstream attempt (failed and withheld ones too). It
    never raises into the request."""
    try:
        services.metrics.stage_seconds.labels("checks").observe(sum(c.seconds for c in call.checks))
        runtime = services.holder.current
        for index, attempt in enumerate(call.attempts):
            final = index == len(call.attempts) - 1 and call.final_outcome is not None
            counts = usage.normalise(call.carrier or "", call.final_usage if final else None)
            outcome = call.final_outcome if final and call.final_outcome else attempt.outcome
            estimator_label = None
            loaded = runtime.profiles.get(attempt.profile_id)
            if final and loaded is not None and loaded.profile.estimator.fill_missing:
                est = admission.ESTIMATORS[loaded.profile.estimator.name]
                counts, estimator_label = usage.with_estimates(
                    counts,
                    input_estimate=call.input_estimate,
                    output_estimate=call.output_estimate,
                    estimator=est.label,
                )
            record = usage.UsageRecord(
                request_id=call.request_id,
                attempt=index,
                profile=attempt.profile_id,
                carrier=call.carrier or "",
                outcome=outcome or "unknown",
                status=attempt.status,
                counts=counts,
                estimator=estimator_label,
            )
            services.usage.add(record)
            for kind, count in counts.items():
                if count.value is not None:
                    services.metrics.usage_tokens.labels(kind, attempt.profile_id, count.provenance).inc(count.value)
                else:
                    services.metrics.usage_unknown.labels(kind, attempt.profile_id).inc()
    except Exception as exc:  # accounting never fails a request
        log.error("usage_record_failed", request_id=call.request_id, error_class=type(exc).__name__)
