"""The bottom layer: the words every other module speaks, and nothing else.

Owns: `Decision`, `Phase`, `Mode`, `Outcome`, and `ReasonCode` — the closed, content-free
vocabulary of reasons, with its parametrised forms (`secret_format:<rule_id>`,
`pii:<kind>`), whose parameters come from configuration (rule ids, detector kinds), never
from content.
Must not: import anything from the gateway (every package may import this one).
"""

from __future__ import annotations

import re
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


class Outcome(StrEnum):
    """How one call ended, for the access log, metrics and usage records."""

    OK = "ok"  # a route that is not a provider call answered
    RELEASED = "released"  # a checked response went to the client
    UPSTREAM_ERROR_RELEASED = "upstream_error_released"  # the provider's own (checked) error went back
    OBSERVED = "observed"  # observe/off mode: streamed through, checked after
    REFUSED = "refused"  # refused before anything reached the client (any GatewayError)
    REFUSED_IN_STREAM = "refused_in_stream"  # refused as the protocol's error event after heartbeats
    BLOCKED = "blocked"  # the response was blocked by a rule
    WITHHELD = "withheld"  # the response could not be fully checked
    INCOMPLETE = "incomplete"  # the response broke off
    TIMEOUT = "timeout"  # the response did not finish in time
    CLIENT_DISCONNECTED = "client_disconnected"
    ERROR = "error"  # a failure of ours


class Dialect(StrEnum):
    """How errors are written to a caller: in its provider's shape, or the gateway's own."""

    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    CONTEXT = "context"  # the gateway's own routes: {"error": {code, message, details}}


class AttemptOutcome(StrEnum):
    """How one upstream attempt went."""

    RESPONSE = "response"  # headers came back (any status)
    RETRY = "retry"  # a retryable status, retried
    CONNECTION_ERROR = "connection_error"
    TIMEOUT = "timeout"


class ReasonCode(StrEnum):
    SECRET_VALUE = "secret_value"
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
    PREPARED_CONTEXT_UNBOUND = "prepared_context_unbound"
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
    UPSTREAM_RESET = "upstream_reset"  # the connection broke after the request was sent
    UPSTREAM_INVALID_RESPONSE = "upstream_invalid_response"
    RESPONSE_TOO_LARGE = "response_too_large"
    BUFFER_TIMEOUT = "buffer_timeout"
    CAPACITY_EXCEEDED = "capacity_exceeded"
    RETENTION_NOT_ALLOWED = "retention_not_allowed"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_REQUEST = "invalid_request"
    REQUEST_TIMEOUT = "request_timeout"
    TOO_MANY_CONNECTIONS = "too_many_connections"


SECRET_FORMAT_PREFIX = "secret_format:"
PII_PREFIX = "pii:"
_PARAM = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")


def secret_format(rule_id: str) -> str:
    """`secret_format:<rule_id>` (the id comes from the catalogue or configuration)."""
    return SECRET_FORMAT_PREFIX + rule_id


def pii(kind: str) -> str:
    """`pii:<kind>` (the kind comes from the detector registry)."""
    return PII_PREFIX + kind


def is_reason_code(code: str) -> bool:
    """True for a member of the closed vocabulary (parametrised codes by shape)."""
    if code in ReasonCode._value2member_map_:
        return True
    for prefix in (SECRET_FORMAT_PREFIX, PII_PREFIX):
        if code.startswith(prefix):
            return _PARAM.fullmatch(code[len(prefix) :]) is not None
    return False
