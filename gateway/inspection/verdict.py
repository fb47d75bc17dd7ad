"""Verdicts: the one result type every check returns, and the closed set of reason codes.

Owns: `Decision`, `Coverage`, `Finding`, `Verdict`, and the reason-code vocabulary.
Must not: hold content. A Verdict names *where* (JSON pointers) and *why* (reason codes),
never *what* matched; it is safe to log, serialise and return to a client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum


class Decision(StrEnum):
    ALLOW = "allow"
    BLOCK = "block"  # a rule forbids it
    WITHHOLD = "withhold"  # coverage incomplete, unknown, unavailable, expired or unverifiable


class Phase(StrEnum):
    BEFORE_SEND = "before_send"
    BEFORE_RELEASE = "before_release"


class Mode(StrEnum):
    ENFORCE = "enforce"
    OBSERVE = "observe"
    OFF = "off"


# The closed, content-free vocabulary. Parametrised codes (`secret_format:<rule_id>`,
# `pii:<kind>`) take their parameter from configuration (rule ids, detector kinds), never
# from content.
SECRET_VALUE = "secret_value"
SECRET_FORMAT_PREFIX = "secret_format:"
PII_PREFIX = "pii:"
DESTINATION_NOT_APPROVED = "destination_not_approved"
TARGET_MISMATCH = "target_mismatch"
DUPLICATE_KEY = "duplicate_key"
JSON_INVALID = "json_invalid"
TOO_DEEP = "too_deep"
PAYLOAD_TOO_LARGE = "payload_too_large"
OPAQUE_CONTENT = "opaque_content"
UNSUPPORTED_CARRIER = "unsupported_carrier"
WINDOW_EXCEEDED = "window_exceeded"
DETECTOR_UNAVAILABLE = "detector_unavailable"
RESPONSE_INCOMPLETE = "response_incomplete"
BINDING_INVALID = "binding_invalid"
BINDING_EXPIRED = "binding_expired"
BINDING_PHASE = "binding_phase"
BINDING_MISMATCH = "binding_mismatch"
PREPARED_CONTEXT_MISMATCH = "prepared_context_mismatch"
PREPARED_CONTEXT_STALE = "prepared_context_stale"
POLICY_UNAVAILABLE = "policy_unavailable"
INSPECTION_ERROR = "inspection_error"
MATCH_LIMIT = "match_limit"
DECODE_LIMIT = "decode_limit"
# Transport, identity and capacity outcomes (never about content).
UNSUPPORTED_ENCODING = "unsupported_encoding"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
UNAUTHENTICATED = "unauthenticated"
FORBIDDEN_PROFILE = "forbidden_profile"
FORBIDDEN_MODEL = "forbidden_model"
FORBIDDEN_ACTION = "forbidden_action"
NO_PROFILE = "no_profile"
CREDENTIAL_UNAVAILABLE = "credential_unavailable"
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
UPSTREAM_TIMEOUT = "upstream_timeout"
UPSTREAM_INVALID_RESPONSE = "upstream_invalid_response"
RESPONSE_TOO_LARGE = "response_too_large"
BUFFER_TIMEOUT = "buffer_timeout"
CAPACITY_EXCEEDED = "capacity_exceeded"
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
INVALID_REQUEST = "invalid_request"
REQUEST_TIMEOUT = "request_timeout"
TOO_MANY_CONNECTIONS = "too_many_connections"

FIXED_REASON_CODES: frozenset[str] = frozenset(
    {
        SECRET_VALUE,
        DESTINATION_NOT_APPROVED,
        TARGET_MISMATCH,
        DUPLICATE_KEY,
        JSON_INVALID,
        TOO_DEEP,
        PAYLOAD_TOO_LARGE,
        OPAQUE_CONTENT,
        UNSUPPORTED_CARRIER,
        WINDOW_EXCEEDED,
        DETECTOR_UNAVAILABLE,
        RESPONSE_INCOMPLETE,
        BINDING_INVALID,
        BINDING_EXPIRED,
        BINDING_PHASE,
        BINDING_MISMATCH,
        PREPARED_CONTEXT_MISMATCH,
        PREPARED_CONTEXT_STALE,
        POLICY_UNAVAILABLE,
        INSPECTION_ERROR,
        MATCH_LIMIT,
        DECODE_LIMIT,
        UNSUPPORTED_ENCODING,
        UNSUPPORTED_MEDIA_TYPE,
        UNAUTHENTICATED,
        FORBIDDEN_PROFILE,
        FORBIDDEN_MODEL,
        FORBIDDEN_ACTION,
        NO_PROFILE,
        CREDENTIAL_UNAVAILABLE,
        UPSTREAM_UNAVAILABLE,
        UPSTREAM_TIMEOUT,
        UPSTREAM_INVALID_RESPONSE,
        RESPONSE_TOO_LARGE,
        BUFFER_TIMEOUT,
        CAPACITY_EXCEEDED,
        NOT_FOUND,
        METHOD_NOT_ALLOWED,
        INVALID_REQUEST,
        REQUEST_TIMEOUT,
        TOO_MANY_CONNECTIONS,
    }
)
_PARAM = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def is_reason_code(code: str) -> bool:
    """True for a member of the closed vocabulary (parametrised codes by shape)."""
    if code in FIXED_REASON_CODES:
        return True
    for prefix in (SECRET_FORMAT_PREFIX, PII_PREFIX):
        if code.startswith(prefix):
            return _PARAM.fullmatch(code[len(prefix) :]) is not None
    return False


@dataclass(frozen=True, slots=True)
class Coverage:
    profile: str
    complete: bool

    def as_json(self) -> dict[str, object]:
        return {"profile": self.profile, "complete": self.complete}


COVERAGE_PROFILE = "text-and-tools.v1"


# Object keys of the wire schemas wiregate knows (compile-time constants). A logged
# location keeps a key segment only when it is one of these; any other key — client or
# model text, which can be a secret itself — is written as `*`. Array indexes stay.
SCHEMA_KEYS: frozenset[str] = frozenset(
    {
        "~events", "~headers", "model", "messages", "role", "content", "text", "type", "name",
        "tool_calls", "function", "function_call", "arguments", "tools", "parameters", "description",
        "properties", "items", "system", "input", "instructions", "metadata", "user", "output",
        "delta", "choices", "message", "input_schema", "tool_result", "tool_use", "tool_use_id",
        "tool_call_id", "id", "source", "data", "media_type", "partial_json", "thinking",
        "reasoning", "reasoning_content", "refusal", "response", "item", "summary", "error",
        "custom", "audio", "transcript", "content_block", "usage", "embedding", "object",
        "call_id", "output_text", "prompt", "stop", "logit_bias", "response_format", "json_schema",
        "schema", "required", "enum", "title", "default", "examples", "anyOf", "oneOf", "allOf",
    }
)


def location(path: tuple[str | int, ...]) -> str:
    """A JSON pointer safe to log: schema keys and array indexes only, other keys `*`."""
    parts = [str(p) if type(p) is int or p in SCHEMA_KEYS else "*" for p in path]
    return "/" + "/".join(parts) if parts else ""


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason a unit failed, located by its path in the document (never the matched
    text). The path can hold object keys, which are content: `pointer` is for the
    process that holds the content anyway; `location` is what may be logged."""

    reason: str
    path: tuple[str | int, ...] | None = None
    advisory: bool = False

    @property
    def pointer(self) -> str | None:
        if self.path is None:
            return None
        parts = [str(p).replace("~", "~0").replace("/", "~1") for p in self.path]
        return "/" + "/".join(parts) if parts else ""

    @property
    def location(self) -> str | None:
        return None if self.path is None else location(self.path)


@dataclass(frozen=True, slots=True)
class Verdict:
    decision: Decision
    reason_codes: tuple[str, ...]
    coverage: Coverage
    policy_version: str
    findings: tuple[Finding, ...] = field(default=())

    @property
    def allowed(self) -> bool:
        return self.decision is Decision.ALLOW

    def locations(self) -> list[str]:
        """Where findings are, safe to log (see `location`)."""
        return sorted({loc for f in self.findings if (loc := f.location) is not None})


def decide(
    findings: list[Finding],
    *,
    withhold_reasons: list[str],
    complete: bool,
    policy_version: str,
) -> Verdict:
    """Fold findings into one Verdict: any blocking finding → block; else any withhold
    reason or incomplete coverage → withhold; else allow. Advisory findings never decide."""
    findings = sorted(findings, key=lambda f: (f.reason, f.pointer or "", f.advisory))
    blocking = [f for f in findings if not f.advisory]
    codes: list[str] = []  # deterministic: finding reasons sorted, then withhold reasons
    for reason in [f.reason for f in blocking] + withhold_reasons:
        if reason not in codes:
            codes.append(reason)
    if blocking:
        decision = Decision.BLOCK
    elif withhold_reasons or not complete:
        decision = Decision.WITHHOLD
    else:
        decision = Decision.ALLOW
    if decision is Decision.WITHHOLD and not codes:
        codes.append(OPAQUE_CONTENT if not complete else POLICY_UNAVAILABLE)
    return Verdict(
        decision=decision,
        reason_codes=tuple(codes),
        coverage=Coverage(COVERAGE_PROFILE, complete),
        policy_version=policy_version,
        findings=tuple(findings),
    )


def withhold(reason: str, policy_version: str, *, complete: bool = False) -> Verdict:
    return Verdict(
        decision=Decision.WITHHOLD,
        reason_codes=(reason,),
        coverage=Coverage(COVERAGE_PROFILE, complete),
        policy_version=policy_version,
    )


def with_withholds(verdict: Verdict, reasons: list[str]) -> Verdict:
    """`verdict` plus further withhold reasons (checks made outside the engine)."""
    if not reasons:
        return verdict
    finding_reasons = {f.reason for f in verdict.findings if not f.advisory}
    earlier = [c for c in verdict.reason_codes if c not in finding_reasons]
    return decide(
        list(verdict.findings),
        withhold_reasons=earlier + reasons,
        complete=verdict.coverage.complete,
        policy_version=verdict.policy_version,
    )
