"""`POST /v1/context/check`: check_context for third-party gateways and adapters (SPEC §7).

Owns: the request DTOs (pydantic, strict per phase: unknown fields and fields of the other
phase are 422; a discriminated union on `phase`; payload schemas
`powercontext.model-json-payload.v1` / `powercontext.model-sse-payload.v1`), turning a DTO
into a call of the same `checks` functions the proxy uses, and the
`powercontext.context-check.v1` result. The API always enforces (observe/off modes are the
proxy's), `completion: "incomplete"` is never allowed, and `before_release` needs a valid
`request_binding`. The check request itself is read strictly: an object key given twice
anywhere in it is 422 `duplicate_key` (parsers keep different values; SPEC §6.2). A
before_send's model is held to the proxy's rules (`routing.primary`, the target profile as
the requested one): a model the principal may not use, or the profile does not serve, is
refused as the proxy refuses it. A check request of at least `limits.offload_bytes` is read,
parsed, folded and inspected in a thread, off the event loop (the proxy's check-worker
interface takes one carrier and plans the body; the API inspects the union of the target's
carriers as written), under the runtime the call is pinned to — the same pure functions,
so the same verdicts.
Must not: echo payload content, bindings' claims, or validation input values.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from gateway import auth, errors, usage
from gateway.carriers import CARRIERS, SHORT_NAMES, sse
from gateway.carriers.base import Carrier, FoldedResponse, ParsedRequest
from gateway.carriers.jsonraw import JsonError
from gateway.checks import prepared, runner
from gateway.checks.bindings import MAX_LENGTH, BindingError
from gateway.checks.claims import SendClaims
from gateway.checks.inspect import relevant_headers
from gateway.checks.runner import Party
from gateway.config.runtime import LoadedProfile, Principal, Runtime
from gateway.http.body import read_body
from gateway.inspection.verdict import Verdict, withhold
from gateway.proxy import decide, projections, replay, routing
from gateway.state import CALL, CONTEXT, RELEASE_LEDGER, RUNTIME
from gateway.vocab import Decision, Mode, Outcome, Phase, ReasonCode

RESULT_SCHEMA = "powercontext.context-check.v1"

T = TypeVar("T")


class _Strict(BaseModel):
    # Members by their wire names only: a field's Python name (`schema_`) is an unknown member.
    model_config = ConfigDict(frozen=True, extra="forbid")


class JsonPayload(_Strict):
    schema_: Literal["powercontext.model-json-payload.v1"] = Field(alias="schema")
    headers: dict[str, str] = Field(default_factory=dict, max_length=64)
    body: str  # the raw UTF-8 JSON text of the complete provider request/response


class SsePayload(_Strict):
    schema_: Literal["powercontext.model-sse-payload.v1"] = Field(alias="schema")
    headers: dict[str, str] = Field(default_factory=dict, max_length=64)
    body: str  # the raw text/event-stream text of the complete response


class Location(_Strict):
    schema_: Literal["powercontext.model-json-text-location.v1"] = Field(alias="schema")
    pointer: str = Field(max_length=1024)
    start_byte: int = Field(ge=0)
    end_byte: int = Field(ge=0)


class PreparedContextRef(_Strict):
    binding: str = Field(max_length=MAX_LENGTH)
    location: Location


class UsageIn(_Strict):
    """Counts as JSON integers only: `true`, `"7"` or `3.0` is refused, never read as a number."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    input_tokens: int | None = Field(None, ge=0, le=usage.MAX_COUNT)
    output_tokens: int | None = Field(None, ge=0, le=usage.MAX_COUNT)
    cache_read_input_tokens: int | None = Field(None, ge=0, le=usage.MAX_COUNT)
    cache_creation_input_tokens: int | None = Field(None, ge=0, le=usage.MAX_COUNT)
    reasoning_tokens: int | None = Field(None, ge=0, le=usage.MAX_COUNT)


class BeforeSendCheck(_Strict):
    scope_id: str = Field(min_length=1, max_length=256)
    phase: Literal["before_send"]
    target_profile: str = Field(min_length=1, max_length=64)
    payload: JsonPayload
    prepared_contexts: list[PreparedContextRef] = Field(default_factory=list, max_length=16)


class BeforeReleaseCheck(_Strict):
    scope_id: str = Field(min_length=1, max_length=256)
    phase: Literal["before_release"]
    target_profile: str = Field(min_length=1, max_length=64)
    request_binding: str = Field(max_length=4 * MAX_LENGTH)  # length itself is checked on open
    payload: Annotated[JsonPayload | SsePayload, Field(discriminator="schema_")]
    completion: Literal["complete", "incomplete"]
    usage: UsageIn | None = None


CheckRequest = TypeAdapter(Annotated[BeforeSendCheck | BeforeReleaseCheck, Field(discriminator="phase")])


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(int(ts), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _result(
    phase: Phase,
    verdict: Verdict,
    valid_until: float,
    *,
    correlate_until: float | None = None,
    binding: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "phase": phase.value,
        "decision": verdict.decision.value,
        "reason_codes": list(verdict.reason_codes),
        "coverage": verdict.coverage.as_json(),
        "policy_version": verdict.policy_version,
        "valid_until": _iso(valid_until),
    }
    if phase is Phase.BEFORE_SEND:
        out["correlate_until"] = _iso(correlate_until if correlate_until is not None else valid_until)
    if binding is not None and verdict.allowed:
        out["binding"] = binding
    return out


def _invalid() -> errors.ClientError:
    # Validation details are not echoed: they can quote the caller's payload.
    return errors.invalid_request("The check request does not match its phase's schema.")


class _Repeated(Exception):
    """An object of the check request named one key twice (which key is not kept)."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Repeated
    return obj


def _read_dto(raw: bytes) -> BeforeSendCheck | BeforeReleaseCheck:
    """The check request as its phase's DTO. pydantic keeps the last of duplicate keys, so
    they are looked for first, in every object of the request (`payload`, `headers`,
    `usage`, ...): one `body` checked while another is what a different parser would keep
    must never earn a binding. Neither the key nor any value is echoed."""
    try:
        json.loads(raw, object_pairs_hook=_unique)
    except _Repeated:
        raise errors.ClientError(
            422, "invalid_request", (ReasonCode.DUPLICATE_KEY,), "The check request repeats an object key."
        ) from None
    except (ValueError, RecursionError):  # not JSON (or too deep to be a check request)
        raise _invalid() from None
    try:
        return CheckRequest.validate_json(raw)
    except ValidationError:
        raise _invalid() from None


async def _work(off_loop: bool, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` — for a large check request in a thread, so that decoding and inspecting
    it never stalls the loop's other connections. `fn` is pure (the runtime it is given is
    the immutable one this call is pinned to; the rule engine keeps its scratch per thread)."""
    if off_loop:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def handle(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    call = request[CALL]
    call.carrier = "context.check"
    auth.require(auth.authenticate(runtime, request.headers), "context.check")  # 401 / 403 before reading a byte
    raw = await read_body(request, runtime.config.limits)
    call.bytes_in = len(raw)
    large = len(raw) >= runtime.config.limits.offload_bytes  # the proxy's threshold for its check workers
    dto = await _work(large, _read_dto, raw)
    service = request.app.get(CONTEXT)
    finder = service.scope_creator if service else None
    creator_of = await auth.creators(runtime, request.headers, finder, body_scope=dto.scope_id)
    identity = auth.identify(runtime, request.headers, "context.check", body_scope=dto.scope_id, creator_of=creator_of)
    call.identify(identity, runtime)
    loaded = runtime.profiles.get(dto.target_profile)
    if loaded is None or dto.target_profile not in identity.principal.profiles:
        raise errors.forbidden(ReasonCode.FORBIDDEN_PROFILE)
    if not runtime.policy.retention_ok(loaded.profile):
        raise errors.forbidden(ReasonCode.RETENTION_NOT_ALLOWED)
    call.profile = loaded.profile.id
    party = Party(identity.principal.id, identity.on_behalf_of, identity.scope, loaded)
    now = time.time()
    if not loaded.valid_at(datetime.fromtimestamp(now, UTC)):
        outcome_verdict = withhold(ReasonCode.POLICY_UNAVAILABLE, runtime.policy.version)
        phase = Phase.BEFORE_SEND if isinstance(dto, BeforeSendCheck) else Phase.BEFORE_RELEASE
        return web.json_response(_result(phase, outcome_verdict, now))
    if isinstance(dto, BeforeSendCheck):
        body = await _before_send(request, runtime, party, identity.principal, dto, now, large)
    else:
        body = await _before_release(request, runtime, party, dto, now, large)
    call.outcome = Outcome.OK
    call.reason_codes = tuple(body["reason_codes"])
    return web.json_response(body)


def _carriers(loaded: LoadedProfile) -> list[Carrier]:
    return [CARRIERS[SHORT_NAMES[c]] for c in loaded.profile.carriers]


def _parse_send(
    runtime: Runtime, loaded: LoadedProfile, payload: JsonPayload
) -> tuple[bytes, list[tuple[Carrier, ParsedRequest]], list[str]]:
    """The payload's exact bytes, as every carrier the target profile speaks reads it (the
    route is not part of the payload: the union is a superset of what any one sees), and
    the reasons of the carriers that could not read it."""
    body = payload.body.encode("utf-8", "surrogatepass")
    parsed: list[tuple[Carrier, ParsedRequest]] = []
    failures: list[str] = []
    for carrier in _carriers(loaded):
        try:
            parsed.append((carrier, carrier.parse_request(body, runtime.carrier_limits)))
        except JsonError as exc:
            failures.append(exc.reason)
    return body, parsed, failures


def _allowed_models(
    runtime: Runtime, principal: Principal, target: str, parsed: list[tuple[Carrier, ParsedRequest]], now: float
) -> None:
    """The proxy's rules for the model each carrier read, with the target profile as the one
    the call asks for (`x-wiregate-profile`): the principal's `models`, then the profile
    carries, serves and may take it. Raises the proxy's 403."""
    when = datetime.fromtimestamp(now, UTC)
    for carrier, request in parsed:
        routing.primary(runtime, principal, carrier.short_name, request.model, target, when)


def _inspect_send(
    runtime: Runtime,
    party: Party,
    body: bytes,
    parsed: list[tuple[Carrier, ParsedRequest]],
    headers: dict[str, str],
    now: float,
    replays: tuple[prepared.Replay, ...],
    eligible: Mapping[str, bool],
) -> runner.CheckOutcome:
    given = runner.SendInput(
        party=party,
        parsed=tuple(p for _, p in parsed),
        body=body,
        bound_headers=relevant_headers(headers, party.profile),
        carriers=",".join(c.name for c, _ in parsed),
        inspect_headers=headers,  # every header the caller supplied, names as written
        replays=replays,
        eligible=eligible,
    )
    return runner.before_send(runtime, given, route=None, mode=Mode.ENFORCE, now=now)


async def _before_send(
    request: web.Request,
    runtime: Runtime,
    party: Party,
    principal: Principal,
    dto: BeforeSendCheck,
    now: float,
    large: bool,
) -> dict[str, Any]:
    body, parsed, failures = await _work(large, _parse_send, runtime, party.profile, dto.payload)
    if not parsed:
        reason = (
            ReasonCode.JSON_INVALID
            if ReasonCode.JSON_INVALID in failures
            else (failures[0] if failures else ReasonCode.UNSUPPORTED_CARRIER)
        )
        return _result(Phase.BEFORE_SEND, withhold(reason, runtime.policy.version, complete=False), now)
    _allowed_models(runtime, principal, dto.target_profile, parsed, now)  # before anything else is looked up
    if not all(decide.window(reading, carrier, party.profile).admitted for carrier, reading in parsed):
        # The proxy withholds what does not fit the target's context window before its checks
        # (it reads the planned body, whose cache markers add a few tokens at most).
        verdict = withhold(ReasonCode.WINDOW_EXCEEDED, runtime.policy.version, complete=False)
        return _result(Phase.BEFORE_SEND, verdict, now)
    replays = tuple(
        prepared.Replay(p.binding, p.location.pointer, p.location.start_byte, p.location.end_byte)
        for p in dto.prepared_contexts
    )
    eligible = await replay.eligibility(request.app.get(CONTEXT), runtime, replays, principal)
    outcome = await _work(
        large, _inspect_send, runtime, party, body, parsed, dto.payload.headers, now, replays, eligible
    )
    cfg = runtime.config.bindings
    return _result(
        Phase.BEFORE_SEND,
        outcome.verdict,
        outcome.valid_until or now + cfg.send_valid_s,
        correlate_until=outcome.correlate_until or now + cfg.correlate_s,
        binding=outcome.binding,
    )


_EVENTS = ("~events",)


def _fold(names: list[str], payload: JsonPayload | SsePayload, limits: Any) -> tuple[FoldedResponse, bytes]:
    """The response as every carrier of the send reads it, and its exact bytes. The units
    are the union (a superset of what any one carrier sees). The response is complete when
    some carrier found it complete and every carrier that recognised it (read an id, text
    or an error in it) did too: a carrier that does not speak its schema has no say, one
    that does is never outvoted (a failed or cut Responses stream that ends in `[DONE]` is
    complete to the chat carrier alone)."""
    raw = payload.body.encode("utf-8", "surrogatepass")
    carriers = [CARRIERS[n] for n in names if n in CARRIERS]
    if not carriers:
        return FoldedResponse.unreadable(ReasonCode.UNSUPPORTED_CARRIER), raw
    if isinstance(payload, JsonPayload):
        results = [c.parse_response(raw, limits) for c in carriers]
        clean = True
    else:
        try:
            events, clean = sse.parse_all(raw)
        except JsonError as exc:
            return FoldedResponse.unreadable(exc.reason), raw
        results = [c.fold_stream(events, limits) for c in carriers]
    # Recognised: an id, an error, or text folded into the carrier's own fields (the units
    # of events read whole, under "~events", say nothing about whose schema they follow).
    recognised = [
        r for r in results if r.response_id is not None or r.is_error or any(u.path[:1] != _EVENTS for u in r.units)
    ]
    complete = clean and any(r.complete for r in results) and all(r.complete for r in recognised)
    return FoldedResponse(
        units=tuple(u for r in results for u in r.units),
        complete=complete,
        incomplete_reason=None
        if complete
        else next((r.incomplete_reason for r in results if r.incomplete_reason), ReasonCode.RESPONSE_INCOMPLETE),
        duplicate_keys=tuple(dict.fromkeys(d for r in results for d in r.duplicate_keys)),
        too_deep=tuple(dict.fromkeys(d for r in results for d in r.too_deep)),
        opaque=tuple(dict.fromkeys(o for r in results for o in r.opaque)),
        raw_scan=all(r.raw_scan for r in results),
    ), raw


def _inspect_release(
    runtime: Runtime, party: Party, names: list[str], payload: JsonPayload | SsePayload, now: float
) -> tuple[bytes, tuple[Verdict, Mode]]:
    folded, raw = _fold(names, payload, runtime.carrier_limits)
    given = runner.ReleaseInput(party, folded, raw, payload.headers)  # header names as written, and values
    return raw, runner.release_verdict(runtime, given, Mode.ENFORCE, now)


async def _before_release(
    request: web.Request, runtime: Runtime, party: Party, dto: BeforeReleaseCheck, now: float, large: bool
) -> dict[str, Any]:
    cfg = runtime.config.bindings
    try:
        claims = runner.open_send_binding(runtime, dto.request_binding, party, now)
    except BindingError as exc:
        return _result(Phase.BEFORE_RELEASE, withhold(exc.reason, runtime.policy.version), now + cfg.release_valid_s)
    if dto.completion != "complete":
        return _result(
            Phase.BEFORE_RELEASE,
            withhold(ReasonCode.RESPONSE_INCOMPLETE, runtime.policy.version),
            now + cfg.release_valid_s,
        )
    names = claims.carriers.split(",")
    raw, verdict = await _work(large, _inspect_release, runtime, party, names, dto.payload, now)
    outcome = await runner.before_release(
        runtime,
        party,
        raw,
        verdict,
        request_binding=dto.request_binding,
        ledger=request.app[RELEASE_LEDGER],
        now=now,
        send_claims=claims,
    )
    if dto.usage is not None and await _first_report(request, claims, now):
        await _record_usage(request, party, claims, dto.usage, outcome.verdict)
    return _result(
        Phase.BEFORE_RELEASE, outcome.verdict, outcome.valid_until or now + cfg.release_valid_s, binding=outcome.binding
    )


async def _first_report(request: web.Request, claims: SendClaims, now: float) -> bool:
    """Is this the first release check to report usage for the provider call its send
    binding stands for? A host that repeats the check (its first answer lost) gets the same
    answer, and the call's usage is counted once — by any replica sharing the release
    ledger: the ledger admits one payload per key, and a fresh token is that payload only
    for the check that stored it."""
    key = "usage:" + claims.id
    return await request.app[RELEASE_LEDGER].admit(key, secrets.token_hex(16), float(claims.correlate_until), now)


async def _record_usage(
    request: web.Request, party: Party, claims: SendClaims, given: UsageIn, verdict: Verdict
) -> None:
    """A caller's typed usage joins the usage ledger like the proxy's own records (its
    parts are disjoint, as Anthropic reports them: input excludes cache reads and writes)."""
    uncached = usage.known(given.input_tokens)
    read = usage.known(given.cache_read_input_tokens)
    write = usage.known(given.cache_creation_input_tokens)
    counts = {
        "input_total": usage.total(uncached, read, write),
        "input_uncached": uncached,
        "cache_read": read,
        "cache_write": write,
        "cache_write_5m": usage.UNKNOWN,
        "cache_write_1h": usage.UNKNOWN,
        "output": usage.known(given.output_tokens),
        "reasoning": usage.known(given.reasoning_tokens),
    }
    outcome = {Decision.ALLOW: Outcome.RELEASED, Decision.BLOCK: Outcome.BLOCKED}.get(
        verdict.decision, Outcome.WITHHELD
    )
    profile = party.profile.profile
    record = usage.UsageRecord(
        request_id=request[CALL].request_id,
        attempt=0,
        profile=profile.id,
        carrier=claims.carriers,
        outcome=outcome.value,
        status=None,
        counts=counts,
        account=profile.account,
        region=profile.region,
    )
    await projections.count_usage(request.app, record)  # the ledger, the metrics and the timeline alike
