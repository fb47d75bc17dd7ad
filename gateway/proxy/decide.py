"""The CPU-bound half of a provider call, as plain functions of the runtime: read the
request, plan it for a profile, admit it, check it before send; read the response and
check it before release. No sockets, no event loop: the same functions run in the
gateway's loop for ordinary bodies and in a worker process for large ones (see
`offload`), so both paths decide identically.

Owns: `parse_request`, `prepare_send` (steps 4-6 for one profile) and `read_response`
(step 9 without the send binding and the release ledger, which need the gateway's own state).
Must not: do network I/O or touch app state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import admission, caching, errors
from gateway.cachepace import SessionPace
from gateway.carriers import jsonspan, sse
from gateway.carriers.base import Carrier, FoldedResponse, ParsedRequest
from gateway.carriers.jsonraw import JsonError
from gateway.checks import prepared, runner
from gateway.checks.destination import Target
from gateway.checks.inspect import header_units, inspect, relevant_headers
from gateway.checks.prepared import Replay
from gateway.checks.runner import CheckOutcome, Party
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.errors import ClientError
from gateway.inspection.engine import Subject
from gateway.inspection.verdict import Verdict
from gateway.obs import logging as log
from gateway.proxy import release
from gateway.vocab import Decision, Mode, Phase, ReasonCode


def parse_request(carrier: Carrier, raw: bytes, runtime: Runtime) -> ParsedRequest:
    """Step 3. A body the carrier cannot read is never sent."""
    try:
        return carrier.parse_request(raw, runtime.carrier_limits)
    except JsonError as exc:
        raise errors.unreadable_request(exc.reason) from None


@dataclass(frozen=True, slots=True)
class Plan:
    body: bytes  # the final upstream body: what before_send checks and what leaves
    parsed: ParsedRequest  # that body as the carrier reads it
    cache: caching.CachePlan
    usage_injected: bool  # the stream was asked for usage the client did not ask for


def plan(
    carrier: Carrier,
    parsed: ParsedRequest,
    raw: bytes,
    party: Party,
    session: str | None,
    runtime: Runtime,
    pace: SessionPace | None = None,
    route: str | None = None,
) -> Plan:
    """Step 4: native cache markers for this profile, and usage for streams that would
    otherwise not report it (only where the answer is released by its checks, which take
    the extra usage out again: observe and off pass the stream through as it comes). The
    received bytes are never mutated; when planning changes the body, the new bytes are
    parsed again so that before_send sees exactly what leaves. A plan that cannot be made
    leaves the body as sent (an optimisation that fails never turns a check off)."""
    profile = party.profile.profile
    estimator = admission.ESTIMATORS[profile.estimator.name]
    unchanged = Plan(raw, parsed, caching.NOTHING, False)
    if parsed.duplicate_keys:
        return unchanged  # withheld by before_send anyway; never edit an ambiguous body
    try:
        text = raw.decode("utf-8")
        ctx = caching.CacheContext(
            party.principal, party.scope, profile.id, session, account=profile.account, region=profile.region
        )
        cache = caching.plan(
            carrier, text, parsed.doc, profile.cache, ctx, estimator.count, pace=pace, prices=profile.cache_prices
        )
        usage_edits: list[jsonspan.Edit] = []
        injected = False
        if runtime.policy.mode(Phase.BEFORE_RELEASE, profile=profile.id, route=route) is Mode.ENFORCE:
            usage_edits, injected = carrier.usage_edits(text, parsed.doc)
        edits = [*cache.edits, *usage_edits]
        if not edits:
            return dataclasses.replace(unchanged, cache=cache)  # its evidence says why nothing was placed
        body = jsonspan.apply(text, edits).encode("utf-8")
        return Plan(body, carrier.parse_request(body, runtime.carrier_limits), cache, injected)
    except Exception as exc:  # an optimisation: whatever breaks it, the body leaves as sent, checked
        log.warning("cache_plan_skipped", profile=profile.id, error_class=type(exc).__name__)
        return unchanged


def window(parsed: ParsedRequest, carrier: Carrier, loaded: LoadedProfile) -> admission.Admission:
    """Whether the request fits the profile's context window (the proxy's step 5, and the
    check API's reading of the same rule)."""
    profile = loaded.profile
    return admission.admit(
        parsed.units,
        requested=carrier.requested_output(parsed.doc),
        estimator=admission.ESTIMATORS[profile.estimator.name],
        margin=profile.estimator.safety_margin,
        context_window=profile.context_window,
        default_output=profile.max_output_tokens,
    )


def admit(parsed: ParsedRequest, carrier: Carrier, loaded: LoadedProfile) -> int:
    """Step 5: the request must fit the profile's context window, or it is withheld.
    Returns the input estimate (usage records use it where the provider says nothing)."""
    decision = window(parsed, carrier, loaded)
    if not decision.admitted:
        raise ClientError(422, "request_withheld", (ReasonCode.WINDOW_EXCEEDED,))
    return decision.estimated_input


@dataclass(frozen=True, slots=True)
class Prepared:
    """Steps 4-6 for one profile: what leaves, and whether it may."""

    body: bytes
    cache: caching.CachePlan
    usage_injected: bool
    input_estimate: int
    outcome: CheckOutcome


def prepare_send(
    runtime: Runtime,
    carrier: Carrier,
    parsed: ParsedRequest,
    raw: bytes,
    party: Party,
    target: Target,
    upstream_headers: Mapping[str, str],
    *,
    session: str | None,
    route: str,
    replays: Sequence[Replay] = (),
    eligible: Mapping[str, bool] | None = None,
    pace: SessionPace | None = None,
) -> Prepared:
    planned = plan(carrier, parsed, raw, party, session, runtime, pace, route)  # 4
    estimate = admit(planned.parsed, carrier, party.profile)  # 5
    if replays and planned.body is not raw:
        replays = prepared.follow_wrapping(replays, parsed.doc, planned.parsed.doc)
    given = runner.SendInput(
        party=party,
        parsed=(planned.parsed,),
        body=planned.body,
        bound_headers=relevant_headers(upstream_headers, party.profile),
        carriers=carrier.name,
        target=target,
        replays=replays,
        eligible=eligible,
    )
    outcome = runner.before_send(runtime, given, route=route)  # 6
    return Prepared(planned.body, planned.cache, planned.usage_injected, estimate, outcome)


def decode(
    carrier: Carrier, body: bytes, is_stream: bool, runtime: Runtime, usage_injected: bool = False
) -> tuple[FoldedResponse, bytes]:
    """The folded response and the exact bytes that would be released (for a stream whose
    usage wiregate asked for, without the usage the client did not ask for)."""
    limits = runtime.carrier_limits
    if not is_stream:
        return carrier.parse_response(body, limits), body
    try:
        events, clean = sse.parse_all(body)
    except JsonError as exc:
        return FoldedResponse.unreadable(exc.reason), b""
    folded = carrier.fold_stream(events, limits).ended(clean)
    released = carrier.released_events(folded.events or events, usage_injected)
    return folded, release.reframe(released)


def reported_so_far(carrier: Carrier, body: bytes, runtime: Runtime) -> tuple[dict[str, Any] | None, str | None]:
    """What a stream cut short had reported by then, from the bytes buffered: the usage the
    provider bills so far (Anthropic's input and cache figures come in its first event) and
    the response's id; (None, None) when they do not read as a stream."""
    try:
        events, _ = sse.parse_all(body)
    except JsonError:
        return None, None
    folder = carrier.stream_folder(runtime.carrier_limits)
    for n, event in enumerate(events):
        folder.add(n, event)
    return (dict(folder.usage) if folder.usage else None), folder.response_id


@dataclass(frozen=True, slots=True)
class Read:
    """Step 9's work on the response, before the send binding and the ledger: what the
    response says (content-free facts), the exact bytes to release, and the verdict."""

    complete: bool
    usage: dict[str, Any] | None
    response_id: str | None
    output_estimate: int | None
    released: bytes
    verdict: Verdict
    mode: Mode


def read_response(
    runtime: Runtime,
    carrier: Carrier,
    body: bytes,
    *,
    is_stream: bool,
    usage_injected: bool,
    party: Party,
    headers: Mapping[str, str],
    mode: Mode,
    now: float,
    incomplete: bool = False,
) -> Read:
    folded, released = decode(carrier, body, is_stream, runtime, usage_injected)
    if incomplete:
        folded = dataclasses.replace(folded, complete=False, incomplete_reason=ReasonCode.RESPONSE_INCOMPLETE)
    return read_folded(runtime, folded, released, party=party, headers=headers, mode=mode, now=now)


def read_folded(
    runtime: Runtime,
    folded: FoldedResponse,
    released: bytes,
    *,
    party: Party,
    headers: Mapping[str, str],
    mode: Mode,
    now: float,
) -> Read:
    """`read_response` for a response already folded (a windowed stream folds as it goes)."""
    profile = party.profile.profile
    estimate = _output_estimate(folded, profile.estimator.name) if profile.estimator.fill_missing else None
    given = runner.ReleaseInput(party, folded, released, headers)
    verdict, effective = runner.release_verdict(runtime, given, mode, now)
    usage = dict(folded.usage.fields) if folded.usage else None
    return Read(folded.complete, usage, folded.response_id, estimate, released, verdict, effective)


def headers_pass(runtime: Runtime, headers: Mapping[str, str], profile_id: str) -> bool:
    """Do the provider headers a response would release pass inspection on their own? For
    heartbeats, which commit the headers before the body is read: headers that do not pass
    are not sent (the whole check then refuses the response on the open stream)."""
    verdict = inspect(runtime, Subject(raw=None, units=(), extra_units=header_units(headers)), profile_id)
    return verdict.decision is Decision.ALLOW


def _output_estimate(folded: FoldedResponse, estimator: str) -> int:
    count = admission.ESTIMATORS[estimator].count
    kinds = ("folded",) if any(u.kind == "folded" for u in folded.units) else ("string",)
    return sum(count(u.text) for u in folded.units if u.kind in kinds)
