"""What the engine inspects in each phase, and the fail-closed call into it.

Owns: the subject of `before_send` (the exact body, the request as each carrier reads it,
header names and values) and of `before_release` (the raw response when it is text, every
event, the folded content, released header names and values), the headers that are bound
into a send binding, and `inspect`: any exception inside inspection is `withhold`, never
`allow`.
Must not: do I/O, or decide modes (the runner does).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from gateway.carriers.base import FoldedResponse, ParsedRequest
from gateway.config.runtime import LoadedProfile, Runtime
from gateway.inspection.detectors import DetectorFailure
from gateway.inspection.engine import Subject
from gateway.inspection.verdict import Verdict, withhold
from gateway.obs import logging as log
from gateway.units import TextUnit
from gateway.vocab import ReasonCode

# Forwarded request headers that change what the provider does with a body: bound into the
# send binding and inspected like any other text.
RELEVANT_HEADERS = ("content-type", "anthropic-version", "anthropic-beta")


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


def request_subject(parsed: Sequence[ParsedRequest], body: bytes, headers: Mapping[str, str]) -> Subject:
    """What before_send inspects: the exact body, and the request as each carrier reads it
    (the proxy has one carrier; the API inspects the union of the profile's)."""
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


def response_subject(folded: FoldedResponse, raw: bytes, headers: Mapping[str, str]) -> Subject:
    """What before_release inspects: the bytes that would be released (when they are text),
    every event and the folded content, and the released headers."""
    reasons: list[str] = []
    if not folded.complete:
        reasons.append(ReasonCode.RESPONSE_INCOMPLETE)
        if folded.incomplete_reason and folded.incomplete_reason != ReasonCode.RESPONSE_INCOMPLETE:
            reasons.append(folded.incomplete_reason)
    return Subject(
        raw=raw if folded.raw_scan else None,
        units=folded.units,
        opaque=folded.opaque,
        duplicate_keys=folded.duplicate_keys,
        too_deep=folded.too_deep,
        complete=folded.complete,
        incomplete_reasons=tuple(reasons),
        extra_units=header_units(headers),
    )


def inspect(runtime: Runtime, subject: Subject, profile_id: str) -> Verdict:
    policy = runtime.policy
    try:
        return policy.engine.inspect(subject, allow_opaque=profile_id in policy.allow_opaque_profiles)
    except DetectorFailure as exc:
        log.error("detector_failed", reason=exc.kind, profile=profile_id)
        return withhold(ReasonCode.DETECTOR_UNAVAILABLE, policy.version)
    except Exception as exc:  # fail closed: an inspector that breaks never allows
        log.error("inspection_failed", error_class=type(exc).__name__, profile=profile_id)
        return withhold(ReasonCode.INSPECTION_ERROR, policy.version)
