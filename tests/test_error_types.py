"""Each refusal's provider error `type`, per dialect: the type says what the reason says
(a provider failure is a server error, never a permission problem; only our own capacity is
an overload), the same in a body and in an in-stream error event."""

from __future__ import annotations

import pytest

from gateway import errors
from gateway.errors import GatewayError, ServiceError, UpstreamError
from gateway.vocab import Dialect, ReasonCode

INCOMPLETE = ReasonCode.RESPONSE_INCOMPLETE

# (the refusal as the flow builds it, Anthropic type, OpenAI type)
CASES: list[tuple[str, GatewayError, str, str]] = [
    ("incomplete", errors.withheld_response((INCOMPLETE,)), "api_error", "server_error"),
    ("incomplete, unparsable", errors.withheld_response((INCOMPLETE, ReasonCode.JSON_INVALID)), "api_error", "server_error"),
    ("incomplete with a finding", errors.blocked_response((ReasonCode.SECRET_VALUE, INCOMPLETE)), "api_error", "server_error"),
    ("incomplete (buffer)", errors.incomplete_response((INCOMPLETE,)), "api_error", "server_error"),
    ("upstream timeout", errors.upstream_unavailable(ReasonCode.UPSTREAM_TIMEOUT), "timeout_error", "server_error"),
    ("buffer timeout", errors.upstream_unavailable(ReasonCode.BUFFER_TIMEOUT), "timeout_error", "server_error"),
    ("unreachable", errors.upstream_unavailable(), "api_error", "server_error"),
    ("reset after send", errors.upstream_unavailable(ReasonCode.UPSTREAM_RESET), "api_error", "server_error"),
    ("no profile", ServiceError(503, "upstream_unavailable", (ReasonCode.NO_PROFILE,)), "api_error", "server_error"),
    ("credential", ServiceError(503, "upstream_unavailable", (ReasonCode.CREDENTIAL_UNAVAILABLE,)), "api_error", "server_error"),
    ("unreadable error", UpstreamError(502, "upstream_error", (ReasonCode.UPSTREAM_INVALID_RESPONSE,)), "api_error", "server_error"),
    ("too large", UpstreamError(503, "response_withheld", (ReasonCode.RESPONSE_TOO_LARGE,)), "api_error", "server_error"),
    ("checker down", errors.withheld_response((ReasonCode.POLICY_UNAVAILABLE,)), "api_error", "server_error"),
    ("gateway busy", ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,)), "overloaded_error", "server_error"),
    ("internal", ServiceError(500, "internal_error", ()), "api_error", "server_error"),
    ("blocked", errors.blocked_response((ReasonCode.SECRET_VALUE,)), "permission_error", "permission_error"),
    ("withheld", errors.withheld_response((ReasonCode.OPAQUE_CONTENT,)), "permission_error", "permission_error"),
    ("request withheld", errors.withheld_request((ReasonCode.OPAQUE_CONTENT,)), "invalid_request_error", "invalid_request_error"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "err", "anthropic", "openai"), CASES, ids=[c[0] for c in CASES])
def test_error_type_matches_the_reason(name: str, err: GatewayError, anthropic: str, openai: str) -> None:
    assert errors.error_type(err, Dialect.ANTHROPIC) == anthropic
    assert errors.error_type(err, Dialect.OPENAI) == openai


def test_an_incomplete_response_is_incomplete_whatever_it_held() -> None:
    err = errors.blocked_response((ReasonCode.SECRET_VALUE, INCOMPLETE))
    assert (err.status, err.code, err.reason_codes) == (
        503,
        "response_incomplete",
        (ReasonCode.SECRET_VALUE, INCOMPLETE),
    )
