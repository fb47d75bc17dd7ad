"""check_context: both phases, one service for the proxy and the HTTP API alike (SPEC §6-7).

Owns: assembling what the engine inspects for each phase (the final request bytes, decoded
units, forwarded headers and the actual target for `before_send`; the complete raw
response, every event and the folded content for `before_release`), the destination check,
phase modes (enforce / observe / off — the HTTP API always enforces), sealing the send and
release bindings and opening a release's send binding, and the fail-closed rule: any
exception inside inspection is `withhold`, never `allow`.
Must not: do network I/O, sequence the wire path (flow.py does) or expose content.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway import bindings
from gateway.bindings import BindingError
from gateway.carriers.base import FoldedResponse, ParsedRequest, TextUnit
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.inspection import verdict as rc
from gateway.inspection.detectors import DetectorFailure
from gateway.inspection.engine import Subject
from gateway.inspection.verdict import (
    COVERAGE_PROFILE,
    Coverage,
    Decision,
    Finding,
    Mode,
    Phase,
    Verdict,
    with_withholds,
    withhold,
)
from gateway.obs import logging as log
from gateway.proxy.upstream import Target

# Forwarded request headers that change what the provider does with a body: bound into the
# send binding and inspected like any other text.
RELEVANT_HEADERS = ("content-type", "anthropic-version", "anthropic-beta")


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


class ReleaseLedger:
    """Each send binding admits exactly one released payload: re-checking the same payload
    is idempotent, a different payload under the same send binding is refused. Bounded
    and per-process (replicas do not share it; see the README)."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._capacity = capacity

    def admit(self, jti: str, payload_digest: str, until: float, now: float) -> bool:
        known = self._seen.get(jti)
        if known is not None:
            return known[0] == payload_digest
        while self._seen and (len(self._seen) >= self._capacity or next(iter(self._seen.values()))[1] < now):
            self._seen.popitem(last=False)
        self._seen[jti] = (payload_digest, until)
        return True


def digest_headers(headers: Mapping[str, str]) -> str:
    canon = "\n".join(f"{k.lower()}:{v}" for k, v in sorted(headers.items()))
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()


def relevant_headers(headers: Mapping[str, str], profile: LoadedProfile) -> dict[str, str]:
    names = (*RELEVANT_HEADERS, *profile.profile.passthrough_headers)
    lower = {k.lower(): v for k, v in headers.items()}
    return {n: lower[n] for n in names if n in lower}


def header_units(headers: Mapping[str, str]) -> list[TextUnit]:
    """Header names and values, inspected like any other text (a name is content too)."""
    units: list[TextUnit] = []
    for name, value in headers.items():
        units.append(TextUnit(("~headers",), name, "key"))
        units.append(TextUnit(("~headers", name), value, "string"))
    return units


def destination_ok(target: Target, loaded: LoadedProfile, runtime: Runtime) -> bool:
    """The target URL must be the profile's approved base_url, and the profile must be the
    one currently loaded (same digest)."""
    current = runtime.profiles.get(target.profile_id)
    if current is None or current.digest != target.profile_digest or current is not loaded:
        return False
    approved = urlsplit(loaded.profile.base_url)
    actual = urlsplit(target.url)
    if (actual.scheme, actual.hostname, actual.port) != (approved.scheme, approved.hostname, approved.port):
        return False
    return actual.path.startswith(approved.path.rstrip("/") + "/") and not actual.query


def _inspect(runtime: Runtime, subject: Subject, profile_id: str) -> Verdict:
    policy = runtime.policy
    try:
        return policy.engine.inspect(subject, allow_opaque=profile_id in policy.allow_opaque_profiles)
    except DetectorFailure as exc:
        log.error("detector_failed", reason=exc.kind, profile=profile_id)
        return withhold(rc.DETECTOR_UNAVAILABLE, policy.version)
    except Exception as exc:  # fail closed: an inspector that breaks never allows
        log.error("inspection_failed", error_class=type(exc).__name__, profile=profile_id)
        return withhold(rc.INSPECTION_ERROR, policy.version)


def _not_checked(policy_version: str) -> Verdict:
    return Verdict(Decision.ALLOW, (), Coverage(COVERAGE_PROFILE, False), policy_version)


def _subject(parsed: Sequence[ParsedRequest], body: bytes, headers: Mapping[str, str]) -> Subject:
    """What before_send inspects: the exact body, and the request as each carrier reads it."""
    units: list[TextUnit] = []
    opaque: list[str] = []
    dups: list[str] = []
    deep: list[str] = []
    for p in parsed:
        units.extend(p.units)
        opaque.extend(o for o in p.opaque if o not in opaque)
        dups.extend(d for d in p.duplicate_keys if d not in dups)
        deep.extend(d for d in p.too_deep if d not in deep)
    return Subject(
        raw=body, units=units, opaque=opaque, duplicate_keys=dups, too_deep=deep, extra_units=header_units(headers)
    )


def before_send(
    runtime: Runtime,
    *,
    party: Party,
    parsed: Sequence[ParsedRequest],
    body: bytes,
    headers: Mapping[str, str],
    carrier: str,
    target: Target | None,
    route: str | None,
    extra_withhold: Sequence[str] = (),
    mode: Mode | None = None,
    now: float | None = None,
    inspect_headers: Mapping[str, str] | None = None,
) -> CheckOutcome:
    """`parsed`: the request as each applicable carrier reads it (the proxy has exactly
    one; the API may not know the route and inspects the union). `headers` are the ones
    bound into the binding; `inspect_headers` (default: the same) are the ones inspected —
    the API inspects every header a caller supplies. `target` is the exact URL the proxy
    will use (None for the API, whose target is the profile itself). `mode` forces a mode
    (the API always enforces)."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    policy = runtime.policy
    profile_id = party.profile.profile.id
    if mode is None:
        mode = policy.mode(Phase.BEFORE_SEND, profile=profile_id, route=route)
    if target is not None and not destination_ok(target, party.profile, runtime):
        # An unapproved destination is never a matter of mode.
        verdict = Verdict(
            Decision.BLOCK,
            (rc.DESTINATION_NOT_APPROVED,),
            Coverage(COVERAGE_PROFILE, True),
            policy.version,
            (Finding(rc.DESTINATION_NOT_APPROVED),),
        )
        return CheckOutcome(Phase.BEFORE_SEND, verdict, Mode.ENFORCE, time.perf_counter() - started)
    if mode is Mode.OFF:
        verdict = _not_checked(policy.version)
    else:
        subject = _subject(parsed, body, headers if inspect_headers is None else inspect_headers)
        verdict = with_withholds(_inspect(runtime, subject, profile_id), list(extra_withhold))
    outcome = CheckOutcome(Phase.BEFORE_SEND, verdict, mode, time.perf_counter() - started)
    if not outcome.proceed:
        return outcome
    cfg = runtime.config.bindings
    valid_until, correlate_until = now + cfg.send_valid_s, now + cfg.correlate_s
    token = _seal(
        runtime,
        party,
        Phase.BEFORE_SEND,
        verdict,
        now,
        cfg.send_valid_s,
        car=carrier,
        body=hashlib.sha256(body).hexdigest(),
        hdr=digest_headers(headers),
        cu=int(correlate_until),
        md=mode.value,
    )
    return CheckOutcome(
        Phase.BEFORE_SEND,
        verdict,
        mode,
        time.perf_counter() - started,
        binding=token,
        valid_until=float(int(valid_until)),
        correlate_until=float(int(correlate_until)),
    )


def _seal(
    runtime: Runtime, party: Party, phase: Phase, verdict: Verdict, now: float, ttl_s: float, **claims: object
) -> str:
    """A binding naming the deployment, the party (principal, delegation, scope, target
    profile and its digest), the phase, the policy version and the decision."""
    kind = "send" if phase is Phase.BEFORE_SEND else "release"
    sealed = bindings.new_claims(
        runtime.keyring,
        kind=kind,
        audience=runtime.config.deployment_id,
        now=now,
        ttl_s=ttl_s,
        phase=phase.value,
        sub=party.principal,
        dlg=party.delegate,
        scope=party.scope,
        tp=party.profile.profile.id,
        tpd=party.profile.digest,
        pv=runtime.policy.version,
        dec=verdict.decision.value,
        **claims,
    )
    return bindings.seal(runtime.keyring, sealed)


def open_send_binding(runtime: Runtime, token: str, party: Party, now: float) -> dict[str, object]:
    """The claims of a send binding a release refers to. Raises BindingError(reason).

    Besides audience, kind, party and `correlate_until`: the binding must be coherent
    (issued before it expires, expiring no later than its correlation deadline), decided
    under the policy version in force now (a policy change between send and release means
    the send's decision no longer holds), and an allow — unless the send phase was only
    observed, which a release check then may not turn into a claim of enforcement."""
    claims = bindings.open_binding(runtime.keyring, token)
    bindings.check_claims(
        claims,
        now=now,
        kind="send",
        audience=runtime.config.deployment_id,
        expect={
            "sub": party.principal,
            "dlg": party.delegate,
            "scope": party.scope,
            "tp": party.profile.profile.id,
            "tpd": party.profile.digest,
        },
        deadline_claim="cu",
    )
    iat, exp, cu = claims.get("iat"), claims.get("exp"), claims.get("cu")
    if not all(type(v) is int for v in (iat, exp, cu)) or not iat <= exp <= cu:  # type: ignore[operator]
        raise BindingError(rc.BINDING_INVALID)
    if claims.get("pv") != runtime.policy.version:
        raise BindingError(rc.BINDING_MISMATCH)
    if claims.get("dec") != Decision.ALLOW.value and claims.get("md") != Mode.OBSERVE.value:
        raise BindingError(rc.BINDING_MISMATCH)
    return claims


def before_release(
    runtime: Runtime,
    *,
    party: Party,
    request_binding: str,
    folded: FoldedResponse,
    raw: bytes,
    released_headers: Mapping[str, str],
    route: str | None,
    ledger: ReleaseLedger,
    mode: Mode | None = None,
    now: float | None = None,
    send_claims: Mapping[str, object] | None = None,
) -> CheckOutcome:
    """`send_claims`: the request binding as `open_send_binding` already opened it (the API
    needs its carriers first); otherwise it is opened here."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    policy = runtime.policy
    profile_id = party.profile.profile.id
    if mode is None:
        mode = policy.mode(Phase.BEFORE_RELEASE, profile=profile_id, route=route)
    try:
        claims = send_claims if send_claims is not None else open_send_binding(runtime, request_binding, party, now)
    except BindingError as exc:
        # A release not tied to a valid send is never released, whatever the mode.
        return CheckOutcome(
            Phase.BEFORE_RELEASE, withhold(exc.reason, policy.version), Mode.ENFORCE, time.perf_counter() - started
        )
    if mode is Mode.OFF:
        verdict = _not_checked(policy.version)
    else:
        reasons: list[str] = []
        if not folded.complete:
            reasons.append(rc.RESPONSE_INCOMPLETE)
            if folded.incomplete_reason and folded.incomplete_reason != rc.RESPONSE_INCOMPLETE:
                reasons.append(folded.incomplete_reason)
        subject = Subject(
            raw=raw if folded.raw_scan else None,
            units=folded.units,
            opaque=folded.opaque,
            duplicate_keys=folded.duplicate_keys,
            too_deep=folded.too_deep,
            complete=folded.complete,
            incomplete_reasons=tuple(reasons),
            extra_units=header_units(released_headers),
        )
        verdict = _inspect(runtime, subject, profile_id)
    outcome = CheckOutcome(Phase.BEFORE_RELEASE, verdict, mode, time.perf_counter() - started)
    if not outcome.proceed:
        return outcome
    payload_digest = hashlib.sha256(raw).hexdigest()
    if not ledger.admit(str(claims.get("jti")), payload_digest, float(claims.get("cu", now)), now):  # type: ignore[arg-type]
        return CheckOutcome(
            Phase.BEFORE_RELEASE,
            withhold(rc.BINDING_MISMATCH, policy.version),
            Mode.ENFORCE,
            time.perf_counter() - started,
        )
    cfg = runtime.config.bindings
    token = _seal(
        runtime,
        party,
        Phase.BEFORE_RELEASE,
        verdict,
        now,
        cfg.release_valid_s,
        rb=hashlib.sha256(request_binding.encode()).hexdigest(),
        body=payload_digest,
    )
    return CheckOutcome(
        Phase.BEFORE_RELEASE,
        verdict,
        mode,
        time.perf_counter() - started,
        binding=token,
        valid_until=float(int(now + cfg.release_valid_s)),
    )
