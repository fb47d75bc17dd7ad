"""check_context: both phases, one service for the proxy and the HTTP API alike (SPEC §6-7).

Owns: assembling what the engine inspects for each phase (final request bytes, decoded
units, forwarded headers and the actual target for `before_send`; the complete raw
response, every event and the folded content for `before_release`), the destination
check, applying the phase mode (enforce / observe / off), and the fail-closed rule: any
exception inside inspection is `withhold`, never `allow`.
Must not: do network I/O, sequence the wire path (flow.py does) or expose content.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.carriers.base import FoldedResponse, ParsedRequest, TextUnit
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.inspection import verdict as rc
from gateway.inspection.engine import Subject
from gateway.inspection.verdict import (
    COVERAGE_PROFILE,
    Coverage,
    Decision,
    Finding,
    Mode,
    Phase,
    Verdict,
    withhold,
)
from gateway.obs import logging as log
from gateway.proxy.upstream import Target


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    phase: Phase
    verdict: Verdict
    mode: Mode
    seconds: float

    @property
    def proceed(self) -> bool:
        """May the call go on? Only an enforced non-allow stops it."""
        return self.mode is not Mode.ENFORCE or self.verdict.allowed

    @property
    def observed_only(self) -> bool:
        return self.mode is Mode.OBSERVE and not self.verdict.allowed


@dataclass(frozen=True, slots=True)
class SendAdmission:
    """What an allowed `before_send` admitted: the exact payload to the exact target.
    A release must refer to it (the binding format itself is check_context's)."""

    target: Target
    body_sha256: str
    headers_sha256: str
    policy_version: str


def _digest_headers(headers: Mapping[str, str]) -> str:
    canon = "\n".join(f"{k.lower()}:{v}" for k, v in sorted(headers.items()))
    return hashlib.sha256(canon.encode("utf-8", "surrogatepass")).hexdigest()


def header_units(headers: Mapping[str, str]) -> list[TextUnit]:
    return [TextUnit(("~headers", k), v, "string") for k, v in headers.items()]


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
        return policy.engine.inspect(
            subject, allow_opaque=profile_id in policy.allow_opaque_profiles
        )
    except Exception as exc:  # fail closed: an inspector that breaks never allows
        log.error("inspection_failed", error_class=type(exc).__name__, profile=profile_id)
        return withhold(rc.INSPECTION_ERROR, policy.version)


def _off(policy_version: str) -> Verdict:
    return Verdict(Decision.ALLOW, (), Coverage(COVERAGE_PROFILE, False), policy_version)


def before_send(
    runtime: Runtime,
    *,
    parsed: ParsedRequest,
    body: bytes,
    headers: Mapping[str, str],
    target: Target,
    loaded: LoadedProfile,
    route: str | None,
) -> tuple[CheckOutcome, SendAdmission | None]:
    started = time.perf_counter()
    policy = runtime.policy
    mode = policy.mode(Phase.BEFORE_SEND, profile=target.profile_id, route=route)
    if not destination_ok(target, loaded, runtime):
        # The destination is never a matter of mode: an unapproved target is not sent to.
        verdict = Verdict(
            Decision.BLOCK, (rc.DESTINATION_NOT_APPROVED,), Coverage(COVERAGE_PROFILE, True),
            policy.version, (Finding(rc.DESTINATION_NOT_APPROVED),),
        )
        return CheckOutcome(Phase.BEFORE_SEND, verdict, Mode.ENFORCE, time.perf_counter() - started), None
    if mode is Mode.OFF:
        verdict = _off(policy.version)
    else:
        subject = Subject(
            raw=body,
            units=parsed.units,
            opaque=parsed.opaque,
            duplicate_keys=parsed.duplicate_keys,
            extra_units=header_units(headers),
        )
        verdict = _inspect(runtime, subject, target.profile_id)
    outcome = CheckOutcome(Phase.BEFORE_SEND, verdict, mode, time.perf_counter() - started)
    admission = None
    if outcome.proceed:
        admission = SendAdmission(
            target=target,
            body_sha256=hashlib.sha256(body).hexdigest(),
            headers_sha256=_digest_headers(headers),
            policy_version=policy.version,
        )
    return outcome, admission


def before_release(
    runtime: Runtime,
    *,
    folded: FoldedResponse,
    raw: bytes,
    released_headers: Mapping[str, str],
    admission: SendAdmission,
    route: str | None,
) -> CheckOutcome:
    started = time.perf_counter()
    policy = runtime.policy
    target = admission.target
    mode = policy.mode(Phase.BEFORE_RELEASE, profile=target.profile_id, route=route)
    if mode is Mode.OFF:
        verdict = _off(policy.version)
    elif admission.policy_version != policy.version:
        # The policy changed between send and release: this release is not covered by the
        # decision that admitted the send.
        verdict = withhold(rc.BINDING_MISMATCH, policy.version)
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
            complete=folded.complete,
            incomplete_reasons=tuple(reasons),
            extra_units=header_units(released_headers),
        )
        verdict = _inspect(runtime, subject, target.profile_id)
    return CheckOutcome(Phase.BEFORE_RELEASE, verdict, mode, time.perf_counter() - started)
