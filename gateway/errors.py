"""Errors that may reach a client, whose fault each is, and how each dialect renders them.

Owns: `GatewayError` (HTTP status, public code, content-free reason codes, a fixed public
message) and its four kinds — `ClientError` (the request is at fault: auth, limits,
malformed or unsupported content), `PolicyRefusal` (a check refused it), `UpstreamError`
(the provider failed, or could not be reached or understood), `ServiceError` (the
gateway's own state: capacity, configuration, a failure of ours) — and the three renderers
(OpenAI, Anthropic, context/ops API).
Must not: put request or response content, secrets, credentials or library exception text
into a message. Messages here are fixed strings chosen by us; reason codes are from the
closed vocabulary in `gateway.vocab`.
"""

from __future__ import annotations

import json
from typing import Any

from gateway import vocab
from gateway.vocab import Dialect, ReasonCode


class GatewayError(Exception):
    """A refusal with a status, a public code and reason codes — nothing else is shown."""

    def __init__(
        self,
        status: int,
        code: str,
        reason_codes: tuple[str, ...] | list[str] = (),
        message: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        retryable: bool = False,
    ) -> None:
        for reason in reason_codes:
            if not vocab.is_reason_code(reason):  # a programming error, never user input
                raise ValueError(f"unknown reason code {reason!r}")
        self.status = status
        self.code = code
        self.reason_codes = tuple(reason_codes)
        self.public_message = message or _DEFAULT_MESSAGES.get(code, "Request refused by wiregate.")
        self.headers = dict(headers or {})
        self.retryable = retryable
        super().__init__(f"{status} {code} {','.join(self.reason_codes)}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Rebuilt whole on the far side of a pickle (a check worker's answer): the default
        would call the constructor with the message alone, which fails there — and an
        exception a process pool cannot unpickle breaks the pool for every call in it."""
        return (
            _rebuilt,
            (type(self), self.status, self.code, self.reason_codes, self.public_message, self.headers, self.retryable),
        )


def _rebuilt(
    kind: type[GatewayError],
    status: int,
    code: str,
    reason_codes: tuple[str, ...],
    message: str,
    headers: dict[str, str],
    retryable: bool,
) -> GatewayError:
    return kind(status, code, reason_codes, message, headers=headers, retryable=retryable)


class ClientError(GatewayError):
    """The request is at fault: authentication, permission, limits, its own content."""


class PolicyRefusal(GatewayError):
    """A check refused to send the request or release the response."""


class UpstreamError(GatewayError):
    """The provider failed, or could not be reached, or answered what cannot be released."""


class ServiceError(GatewayError):
    """The gateway's own state: capacity, a credential it cannot read, a failure of ours."""


_DEFAULT_MESSAGES: dict[str, str] = {
    "request_blocked": "wiregate blocked this request: a configured rule forbids sending it.",
    "request_withheld": "wiregate withheld this request: it could not be fully checked.",
    "response_blocked": "wiregate blocked the provider's response: a configured rule forbids releasing it.",
    "response_withheld": "wiregate withheld the provider's response: it could not be fully checked.",
    "response_incomplete": "The provider's response was incomplete; nothing was released.",
    "payload_too_large": "The request body exceeds wiregate's size limit.",
    "unsupported_encoding": "Only identity and gzip request encodings are accepted.",
    "unsupported_media_type": "Requests must be JSON (application/json).",
    "invalid_request": "The request is not valid for this route.",
    "authentication_error": "A valid wiregate key is required (Authorization: Bearer or x-api-key).",
    "permission_denied": "This wiregate key may not perform this request.",
    "not_found": "No such route.",
    "method_not_allowed": "Method not allowed on this route.",
    "upstream_unavailable": "The upstream provider could not be reached.",
    "upstream_timeout": "The upstream provider did not answer in time.",
    "gateway_busy": "wiregate is at its limit of concurrently buffered responses.",
    "rate_limited": "This wiregate key has too many calls in flight; retry shortly.",
    "request_timeout": "The request body did not arrive in time.",
    "internal_error": "wiregate failed to process the request; nothing was sent or released.",
}

# The error `type` each status maps to, per dialect (WIRE-FORMATS §1.8, §3.6).
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# Where the code says more than the status, the code decides: the provider failing (an
# incomplete, unreadable or unreachable answer) is the provider's server error, never a
# permission problem, and only our own capacity is an overload (SDKs and operators treat
# `overloaded_error` as "back off and retry the same call"). These hold for a body and for
# an in-stream error event alike (there the status is 200, so the type is all they say).
_ANTHROPIC_BY_CODE = {
    "gateway_busy": "overloaded_error",
    "upstream_timeout": "timeout_error",
    "response_incomplete": "api_error",
    "upstream_unavailable": "api_error",
    "upstream_error": "api_error",
    "internal_error": "api_error",
}
_OPENAI_BY_CODE = {
    "response_incomplete": "server_error",
    "upstream_timeout": "server_error",
    "upstream_unavailable": "server_error",
    "upstream_error": "server_error",
    "internal_error": "server_error",
}


def error_type(err: GatewayError, dialect: Dialect) -> str:
    """The provider's own error `type` for this refusal, in bodies and in-stream events."""
    if dialect is Dialect.ANTHROPIC:
        by_code = _ANTHROPIC_BY_CODE.get(err.code)
        if by_code is not None:
            return by_code
        return _ANTHROPIC_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    by_code = _OPENAI_BY_CODE.get(err.code)
    if by_code is not None:
        return by_code
    return _OPENAI_TYPES.get(err.status, "server_error" if err.status >= 500 else "invalid_request_error")


def render_body(err: GatewayError, dialect: Dialect, request_id: str) -> bytes:
    body: dict[str, Any]
    if dialect is Dialect.OPENAI:
        body = {
            "error": {
                "message": err.public_message,
                "type": error_type(err, dialect),
                "param": None,
                "code": err.code,
                "reason_codes": list(err.reason_codes),
            }
        }
    elif dialect is Dialect.ANTHROPIC:
        body = {
            "type": "error",
            "error": {
                "type": error_type(err, dialect),
                "message": err.public_message,
                "code": err.code,
                "reason_codes": list(err.reason_codes),
            },
            "request_id": request_id,
        }
    else:
        body = {
            "error": {
                "code": err.code,
                "message": err.public_message,
                "details": {"reason_codes": list(err.reason_codes)},
            }
        }
    return json.dumps(body, separators=(",", ":")).encode()


def response_headers(err: GatewayError) -> dict[str, str]:
    """Headers for a refusal. Refusals a retry cannot fix tell SDKs not to retry."""
    headers = {"content-type": "application/json"}
    if not err.retryable:
        headers["x-should-retry"] = "false"
    headers.update(err.headers)
    return headers


# Constructors for the common refusals, so call sites read as intent.


def blocked_request(reasons: tuple[str, ...]) -> GatewayError:
    return PolicyRefusal(403, "request_blocked", reasons)


# Withholds that mean "the checker could not decide" rather than "this content is refused".
_UNAVAILABLE = frozenset({ReasonCode.INSPECTION_ERROR, ReasonCode.POLICY_UNAVAILABLE, ReasonCode.DETECTOR_UNAVAILABLE})


def opaque_content_message(profile: str) -> str:
    """How an operator allows uninspectable content for one profile. Names the profile id
    (signed configuration) and the policy setting — never anything the request holds."""
    return (
        "wiregate withheld this request (opaque_content): it holds content that cannot be "
        "inspected (an image, file, audio, token array or encrypted reasoning), which is "
        f'refused by default. To allow it for profile "{profile}", add "{profile}" to '
        "allow_opaque_profiles in policy.toml and reload (SIGHUP)."
    )


def withheld_request(reasons: tuple[str, ...], *, profile: str | None = None) -> GatewayError:
    """`profile`: the profile the request was checked for (names the opt-in for opaque
    content)."""
    if _UNAVAILABLE.intersection(reasons):
        return PolicyRefusal(503, "request_withheld", reasons, retryable=True)
    message = opaque_content_message(profile) if profile and ReasonCode.OPAQUE_CONTENT in reasons else None
    return PolicyRefusal(422, "request_withheld", reasons, message)


def incomplete_response(reasons: tuple[str, ...]) -> UpstreamError:
    """The provider did not finish its answer. This says so whatever the fragment held (a
    finding in it does not make the refusal a policy one): nothing was released either way,
    and the reason codes still name every finding."""
    return UpstreamError(503, "response_incomplete", reasons, retryable=True)


def blocked_response(reasons: tuple[str, ...]) -> GatewayError:
    if ReasonCode.RESPONSE_INCOMPLETE in reasons:
        return incomplete_response(reasons)
    return PolicyRefusal(403, "response_blocked", reasons)


def withheld_response(reasons: tuple[str, ...]) -> GatewayError:
    if ReasonCode.RESPONSE_INCOMPLETE in reasons:
        return incomplete_response(reasons)
    if _UNAVAILABLE.intersection(reasons):
        return PolicyRefusal(503, "response_withheld", reasons, retryable=True)
    return PolicyRefusal(403, "response_withheld", reasons)


def unreadable_request(reason: str) -> ClientError:
    """A body the carrier cannot read as its schema (malformed, too deep, unsupported)."""
    status = 422 if reason in (ReasonCode.UNSUPPORTED_CARRIER, ReasonCode.TOO_DEEP) else 400
    return ClientError(status, "request_withheld", (reason,))


def forbidden(reason: str) -> ClientError:
    return ClientError(403, "permission_denied", (reason,))


def invalid_request(message: str | None = None) -> ClientError:
    return ClientError(422, "invalid_request", (ReasonCode.INVALID_REQUEST,), message)


def upstream_unavailable(reason: str = ReasonCode.UPSTREAM_UNAVAILABLE, *, resendable: bool = True) -> UpstreamError:
    """`resendable`: false when the provider may have the request already (a connection
    that broke, or timed out, once the request was written) and its profile does not allow
    resending it: then neither we nor the SDK resend it."""
    if reason == ReasonCode.UPSTREAM_RESET:
        return UpstreamError(502, "upstream_unavailable", (reason,), retryable=resendable)
    code = (
        "upstream_timeout"
        if reason in (ReasonCode.UPSTREAM_TIMEOUT, ReasonCode.BUFFER_TIMEOUT)
        else "upstream_unavailable"
    )
    return UpstreamError(503, code, (reason,), retryable=resendable)
