"""The checks of each phase, in order, folded into one outcome that fails closed.

Owns: `Party` and `CheckOutcome`; the ordered checks of `before_send` (destination,
inspection, prepared-context replay) and `before_release` (inspection, after the send
binding it refers to is opened); which checks obey the phase's mode (inspection) and which
never do (destination, bindings, replay); the fold — an exception in any check is
`withhold`, never `allow`, and a failing check that no mode governs ends the list; and
sealing the send and release bindings. The proxy and `POST /v1/context/check` both run
these lists.
Must not: do network I/O, sequence the wire path (proxy/flow.py does) or expose content.
"""

from __future__ import annotations

import bisect
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gateway.carriers import CARRIERS
from gateway.carriers.base import FoldedResponse, ParsedRequest
from gateway.checks import claims as claims_
from gateway.checks import inspect, prepared
from gateway.checks.bindings import BindingError
from gateway.checks.claims import ReleaseClaims, SendClaims
from gateway.checks.destination import Target, destination_ok
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.inspection.engine import joinable
from gateway.inspection.verdict import COVERAGE_PROFILE, Coverage, Finding, Verdict, decide, withhold
from gateway.ledgers.release import ReleaseLedger
from gateway.obs import logging as log
from gateway.units import Path, TextUnit, pointer
from gateway.vocab import Decision, Mode, Phase, ReasonCode

# Re-exported for callers that assemble check inputs.
relevant_headers = inspect.relevant_headers


@dataclass(frozen=True, slots=True)
class Party:
    """Who a check is for: the identities and target a binding names."""

    principal: str
    delegate: str | None
    scope: str
    profile: LoadedProfile


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    phase: Phase
    verdict: Verdict
    mode: Mode
    seconds: float
    binding: str | None = None
    valid_until: float | None = None
    correlate_until: float | None = None

    @property
    def proceed(self) -> bool:
        """May the call go on? Only an enforced non-allow stops it."""
        return self.mode is not Mode.ENFORCE or self.verdict.allowed

    @property
    def observed_only(self) -> bool:
        return self.mode is Mode.OBSERVE and not self.verdict.allowed


@dataclass(frozen=True, slots=True)
class SendInput:
    """Everything before_send looks at. `parsed`: the request as each applicable carrier
    reads it (the proxy has exactly one; the API may not know the route and inspects the
    union). `bound_headers` are sealed into the binding; `inspect_headers` (default: the
    same) are inspected — the API inspects every header a caller supplies. `target` is the
    exact URL the proxy will use (None for the API, whose target is the profile itself)."""

    party: Party
    parsed: Sequence[ParsedRequest]
    body: bytes
    bound_headers: Mapping[str, str]
    carriers: str
    target: Target | None = None
    inspect_headers: Mapping[str, str] | None = None
    replays: Sequence[prepared.Replay] = ()
    eligible: Mapping[str, bool] | None = None  # the store's answer per dependency (prepared.dependency_key)


@dataclass(frozen=True, slots=True)
class ReleaseInput:
    party: Party
    folded: FoldedResponse
    raw: bytes  # the exact bytes that would be released
    headers: Mapping[str, str]  # released (or supplied) response headers


In = TypeVar("In", SendInput, ReleaseInput)


@dataclass(frozen=True, slots=True)
class Check(Generic[In]):
    """One check: a name (logged when it breaks), whether it obeys the phase's mode
    (otherwise it is always enforced), and the function that returns its verdict."""

    name: str
    modal: bool
    run: Callable[[Runtime, In, float], Verdict] = field(repr=False)

    def __call__(self, runtime: Runtime, given: In, now: float) -> Verdict:
        return self.run(runtime, given, now)


def _allow(runtime: Runtime) -> Verdict:
    return Verdict(Decision.ALLOW, (), Coverage(COVERAGE_PROFILE, True), runtime.policy.version)


def _destination(runtime: Runtime, given: SendInput, now: float) -> Verdict:
    if given.target is None or destination_ok(given.target, given.party.profile, runtime):
        return _allow(runtime)
    finding = Finding(ReasonCode.DESTINATION_NOT_APPROVED)
    return decide([finding], withhold_reasons=[], complete=True, policy_version=runtime.policy.version)


def _inspect_request(runtime: Runtime, given: SendInput, now: float) -> Verdict:
    headers = given.bound_headers if given.inspect_headers is None else given.inspect_headers
    subject = inspect.request_subject(given.parsed, given.body, headers)
    return inspect.inspect(runtime, subject, given.party.profile.profile.id)


def _replayed_context(runtime: Runtime, given: SendInput, now: float) -> Verdict:
    party = given.party
    require = runtime.policy.prepared_context == "require_binding"
    marked = _marked(given.parsed) if require else []
    if (given.replays or marked) and any(p.duplicate_keys for p in given.parsed):
        # A replay is verified against the value a pointer resolves to: the last of duplicate
        # keys. An earlier one the provider may read instead is vouched for by nothing, and
        # this check holds in every mode (the inspection's own duplicate-key refusal does not
        # in observe or off).
        reasons: list[str] = [ReasonCode.PREPARED_CONTEXT_UNBOUND, ReasonCode.DUPLICATE_KEY]
        return decide([], withhold_reasons=reasons, complete=True, policy_version=runtime.policy.version)
    reasons = prepared.verify(
        given.replays,
        body=given.body,
        ring=runtime.keyring,
        audience=runtime.config.deployment_id,
        principal=party.principal,
        delegate=party.delegate,
        scope=party.scope,
        now=now,
        max_depth=runtime.carrier_limits.max_depth,
        eligible=given.eligible,
        marked=marked,
        require_binding=require,
    )
    if not reasons:
        return _allow(runtime)
    return decide([], withhold_reasons=reasons, complete=True, policy_version=runtime.policy.version)


UNBOUND_POINTER = "~unbound"  # resolves to nothing: no replay can ever cover what it names


def _marked(parsed: Sequence[ParsedRequest]) -> list[tuple[str, bytes]]:
    """Every request string that carries a prepared-context marker (`prepared.MARKERS`: the
    begin and end markers of both renders), by pointer; and
    under `UNBOUND_POINTER`, a marker no replay can cover: one in an object key, one that
    only appears once strings are decoded (JSON held in a string: a prepared block, with
    its line breaks and quotes, can never stand verbatim in a string that parses as JSON,
    so every marker read there is unbound), one that only appears once the text parts of a
    message are joined (split over two parts), and one that only appears once the request's
    text strings are read one after another (split over parts nested in a tool result, a
    document or a function call's output). A replay covers bytes of one string, and the
    model reads all of these.

    One pass per request for all the markers: a text none of them is in does not hold
    `prepared.MARKER_CORE` (each marker's own part), so the markers are looked for only in
    the texts that do, and each joined reading is made once."""
    out: list[tuple[str, bytes]] = []
    for p in parsed:
        units = [unit for unit in p.units if prepared.MARKER_CORE in unit.text]
        if not units and not _may_span(p):
            continue
        lists = _text_parts(p)
        readings = _readings(p, lists)
        for marker in prepared.MARKERS:
            out.extend(_marked_in(p, units, lists, readings, marker))
    return out


def _may_span(p: ParsedRequest) -> bool:
    """Could a marker be split over two of the request's strings? Only when one string ends
    in the start of `prepared.MARKER_CORE`: the string where the core begins holds it whole
    (found by `_marked`'s filter) or ends in a proper prefix of it."""
    return any(u.kind == "string" and _ends_in_core_start(u.text) for u in p.units)


def _ends_in_core_start(text: str) -> bool:
    core = prepared.MARKER_CORE
    tail = text[1 - len(core) :]
    at = tail.find(core[0])
    while at != -1:
        if core.startswith(tail[at:]):
            return True
        at = tail.find(core[0], at + 1)
    return False


def _marked_in(
    p: ParsedRequest,
    units: Sequence[TextUnit],
    lists: Mapping[Path, list[str]],
    readings: Sequence[tuple[str, list[str]]],
    marker: str,
) -> list[tuple[str, bytes]]:
    """`_marked` for one request and one marker (`units`: its units that may hold a marker;
    `lists`: its `_text_parts`; `readings`: its `_readings`)."""
    found: list[tuple[str, bytes]] = []
    for unit in (unit for unit in units if marker in unit.text):
        if unit.kind == "string":
            found.append((pointer(unit.path), unit.text.encode("utf-8", "surrogatepass")))
        elif unit.kind == "joined" and _markers_within(unit.text, lists.get(unit.path, ()), marker):
            continue  # each marker is one of its parts' own, marked there
        elif unit.path == RENDER_PATH and _markers_within(unit.text, _rendered_pieces(p), marker):
            continue  # the prompt in the provider's order: each marker is one of its texts' own
        else:
            found.append((UNBOUND_POINTER, unit.text.encode("utf-8", "surrogatepass")))
    if all(where != UNBOUND_POINTER for where, _ in found):
        for joined, pieces in readings:  # a split no unit holds whole
            if marker in joined and not _markers_within(joined, pieces, marker):
                found.append((UNBOUND_POINTER, joined.encode("utf-8", "surrogatepass")))
                break
    return found


def _text_parts(p: ParsedRequest) -> dict[Path, list[str]]:
    """The text parts of every list in the request, at any depth (`path`/N/text strings), in
    index order: what a message's joined unit, a tool result's content or a function call's
    output reads one after another."""
    lists: dict[Path, list[tuple[int, str]]] = {}
    for u in p.units:
        if u.kind == "string" and len(u.path) >= 2 and u.path[-1] == "text" and type(u.path[-2]) is int:
            lists.setdefault(u.path[:-2], []).append((u.path[-2], u.text))
    return {path: [text for _, text in sorted(parts)] for path, parts in lists.items()}


def _readings(p: ParsedRequest, lists: Mapping[Path, list[str]]) -> list[tuple[str, list[str]]]:
    """The readings of a request no unit holds whole, each as (joined text, its pieces), for
    a marker split over two pieces: the request's text strings in document order with no
    boundary (as the joined read of configured values takes them, once with names and once
    without), and each list's text parts one after another, whatever sits between them in
    the document. Only those that hold `prepared.MARKER_CORE` (no marker is in the others)."""
    texts = [u for u in p.units if u.kind == "string" and joinable(u)]
    readings = [[u.text for u in texts], [u.text for u in texts if u.path[-1:] != ("name",)]]
    readings += [parts for parts in lists.values() if len(parts) > 1]
    joined = (("".join(pieces), pieces) for pieces in readings)
    return [(text, pieces) for text, pieces in joined if prepared.MARKER_CORE in text]


RENDER_PATH: Path = ("~render",)  # carriers.common.render_order's unit: the prompt's texts in reading order


def _rendered_pieces(p: ParsedRequest) -> list[str]:
    """The texts `render_order` joined (the prompt's parts but the tool schemas, in the
    order the provider reads them), each a string or a part's own text."""
    carrier = CARRIERS.get(p.carrier)
    if carrier is None:
        return []
    return [part.text for part in carrier.prompt_layout(p.doc).parts if part.region != "tools"]


def _markers_within(text: str, pieces: Sequence[str], marker: str) -> bool:
    """Does every marker in `text`, the concatenation of `pieces`, lie wholly inside one of
    them? False when the pieces do not make up `text` exactly: unproven is unbound."""
    if "".join(pieces) != text:
        return False
    ends: list[int] = []
    end = 0
    for value in pieces:
        end += len(value)
        ends.append(end)
    at = text.find(marker)
    while at != -1:
        if at + len(marker) > ends[bisect.bisect_right(ends, at)]:  # past the end of the part it starts in
            return False
        at = text.find(marker, at + 1)
    return True


def _inspect_response(runtime: Runtime, given: ReleaseInput, now: float) -> Verdict:
    subject = inspect.response_subject(given.folded, given.raw, given.headers)
    return inspect.inspect(runtime, subject, given.party.profile.profile.id)


def default_send_checks(runtime: Runtime) -> tuple[Check[SendInput], ...]:
    """before_send, in order: the destination (never a mode; a wrong one ends the list),
    the inspection of what leaves (the phase's mode), replayed prepared context (never a
    mode)."""
    return (
        Check("destination", False, _destination),
        Check("inspection", True, _inspect_request),
        Check("prepared_context", False, _replayed_context),
    )


def default_release_checks(runtime: Runtime) -> tuple[Check[ReleaseInput], ...]:
    """before_release, after its send binding is opened: the inspection of what would be
    released (the phase's mode)."""
    return (Check("inspection", True, _inspect_response),)


def combine(verdicts: Sequence[Verdict], policy_version: str) -> Verdict:
    """One verdict from several: any block blocks, else any withhold or incomplete
    coverage withholds, else allow; every finding and reason kept."""
    if len(verdicts) == 1:
        return verdicts[0]
    findings = [f for v in verdicts for f in v.findings]
    withholds: list[str] = []
    for v in verdicts:
        found = {f.reason for f in v.findings if not f.advisory}
        withholds.extend(c for c in v.reason_codes if c not in found and c not in withholds)
    complete = all(v.coverage.complete for v in verdicts)
    return decide(findings, withhold_reasons=withholds, complete=complete, policy_version=policy_version)


def run(runtime: Runtime, checks: Sequence[Check[In]], given: In, mode: Mode, now: float) -> tuple[Verdict, Mode]:
    """Run `checks` in order and fold them. Returns the verdict and the mode it is to be
    read under: a failure of a check no mode governs is always enforced."""
    verdicts: list[Verdict] = []
    enforced = False
    for check in checks:
        if check.modal and mode is Mode.OFF:
            continue
        try:
            verdict = check(runtime, given, now)
        except Exception as exc:  # fail closed: a check that breaks never allows
            log.error("check_failed", reason=check.name, error_class=type(exc).__name__)
            verdict = withhold(ReasonCode.INSPECTION_ERROR, runtime.policy.version)
        verdicts.append(verdict)
        if not check.modal and not verdict.allowed:
            enforced = True
            break
    if not verdicts:
        return Verdict(Decision.ALLOW, (), Coverage(COVERAGE_PROFILE, False), runtime.policy.version), mode
    if mode is Mode.OFF and not enforced:
        # only unmodal checks ran, and passed: nothing was inspected
        return Verdict(Decision.ALLOW, (), Coverage(COVERAGE_PROFILE, False), runtime.policy.version), mode
    return combine(verdicts, runtime.policy.version), Mode.ENFORCE if enforced else mode


# --- before_send ---------------------------------------------------------------------------


def before_send(
    runtime: Runtime, given: SendInput, *, route: str | None, mode: Mode | None = None, now: float | None = None
) -> CheckOutcome:
    """Run the send checks; an outcome that may proceed carries a send binding naming the
    payload, headers, target, party, policy version, decision and mode. `mode` forces a mode
    (the API always enforces)."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    profile_id = given.party.profile.profile.id
    if mode is None:
        mode = runtime.policy.mode(Phase.BEFORE_SEND, profile=profile_id, route=route)
    verdict, effective = run(runtime, default_send_checks(runtime), given, mode, now)
    outcome = CheckOutcome(Phase.BEFORE_SEND, verdict, effective, time.perf_counter() - started)
    if not outcome.proceed:
        return outcome
    cfg = runtime.config.bindings
    party = given.party
    claims = claims_.new(
        SendClaims,
        runtime.keyring,
        audience=runtime.config.deployment_id,
        now=now,
        ttl_s=cfg.send_valid_s,
        principal=party.principal,
        delegate=party.delegate,
        scope=party.scope,
        phase=Phase.BEFORE_SEND.value,
        profile_id=profile_id,
        profile_digest=party.profile.digest,
        policy_version=runtime.policy.version,
        decision=verdict.decision.value,
        mode=effective.value,
        carriers=given.carriers,
        body_digest=hashlib.sha256(given.body).hexdigest(),
        headers_digest=inspect.digest_headers(given.bound_headers),
        correlate_until=int(now + cfg.correlate_s),
    )
    return CheckOutcome(
        Phase.BEFORE_SEND,
        verdict,
        effective,
        time.perf_counter() - started,
        binding=claims_.seal_claims(runtime.keyring, claims),
        valid_until=float(claims.expires_at),
        correlate_until=float(claims.correlate_until),
    )


def open_send_binding(runtime: Runtime, token: str, party: Party, now: float) -> SendClaims:
    """The claims of a send binding a release refers to. Raises BindingError(reason).

    Besides audience, kind, party, coherence and `correlate_until`: the target profile and
    its digest, the policy version in force now (a policy change between send and release
    means the send's decision no longer holds), and an allow — unless the send phase was
    only observed, which a release check then may not turn into a claim of enforcement."""
    claims = claims_.open_claims(
        SendClaims,
        runtime.keyring,
        token,
        audience=runtime.config.deployment_id,
        now=now,
        principal=party.principal,
        delegate=party.delegate,
        scope=party.scope,
    )
    if (claims.profile_id, claims.profile_digest) != (party.profile.profile.id, party.profile.digest):
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    if claims.policy_version != runtime.policy.version:
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    if claims.decision != Decision.ALLOW.value and claims.mode != Mode.OBSERVE.value:
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    return claims


# --- before_release ------------------------------------------------------------------------


def release_verdict(runtime: Runtime, given: ReleaseInput, mode: Mode, now: float) -> tuple[Verdict, Mode]:
    """The release checks on what would be released (pure: may run in a worker)."""
    return run(runtime, default_release_checks(runtime), given, mode, now)


async def before_release(
    runtime: Runtime,
    party: Party,
    raw: bytes,
    verdict: tuple[Verdict, Mode],
    *,
    request_binding: str,
    ledger: ReleaseLedger,
    now: float | None = None,
    send_claims: SendClaims | None = None,
    seconds: float = 0.0,
    seal: bool = True,
) -> CheckOutcome:
    """Open the send binding (whatever the mode), take the release checks' `verdict` (and
    the mode it is to be read under), admit the payload into the release ledger (one
    payload per send binding), and seal a release binding. `send_claims`: the binding as
    `open_send_binding` already opened it (the API needs its carriers first); `seconds`:
    time the checks took elsewhere (a worker); `seal`: False where no one receives the
    release binding (the proxy releases the bytes itself), so none is made."""
    started = time.perf_counter() - seconds
    now = time.time() if now is None else now
    profile_id = party.profile.profile.id

    def refused(reason: str) -> CheckOutcome:
        return CheckOutcome(
            Phase.BEFORE_RELEASE, withhold(reason, runtime.policy.version), Mode.ENFORCE, time.perf_counter() - started
        )

    try:
        send = send_claims if send_claims is not None else open_send_binding(runtime, request_binding, party, now)
    except BindingError as exc:
        return refused(exc.reason)  # a release not tied to a valid send is never released
    checked, effective = verdict
    outcome = CheckOutcome(Phase.BEFORE_RELEASE, checked, effective, time.perf_counter() - started)
    if not outcome.proceed:
        return outcome
    payload_digest = hashlib.sha256(raw).hexdigest()
    if not await ledger.admit(send.id, payload_digest, float(send.correlate_until), now):
        return refused(ReasonCode.BINDING_MISMATCH)
    if not seal:
        return CheckOutcome(Phase.BEFORE_RELEASE, checked, effective, time.perf_counter() - started)
    cfg = runtime.config.bindings
    release = claims_.new(
        ReleaseClaims,
        runtime.keyring,
        audience=runtime.config.deployment_id,
        now=now,
        ttl_s=cfg.release_valid_s,
        principal=party.principal,
        delegate=party.delegate,
        scope=party.scope,
        phase=Phase.BEFORE_RELEASE.value,
        profile_id=profile_id,
        profile_digest=party.profile.digest,
        policy_version=runtime.policy.version,
        decision=checked.decision.value,
        request_binding_digest=hashlib.sha256(request_binding.encode()).hexdigest(),
        body_digest=payload_digest,
    )
    return CheckOutcome(
        Phase.BEFORE_RELEASE,
        checked,
        effective,
        time.perf_counter() - started,
        binding=claims_.seal_claims(runtime.keyring, release),
        valid_until=float(release.expires_at),
    )
