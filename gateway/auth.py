"""Identity and authorisation: gateway key → principal, actions, scope, delegation (SPEC §3).

Owns: reading the presented key (`Authorization: Bearer` or `x-api-key`), constant-time
lookup through the runtime, the action check, scope resolution and delegation.
Must not: log or forward the presented key, or trust any client-supplied identity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config.runtime import Principal, Runtime
from gateway.errors import ClientError
from gateway.vocab import ReasonCode

SCOPE_HEADER = "x-wiregate-scope"
ON_BEHALF_HEADER = "x-wiregate-on-behalf-of"
CONTEXT_ACTIONS = frozenset({"context.read", "context.prepare", "context.write"})


@dataclass(frozen=True, slots=True)
class Identity:
    principal: Principal
    scope: str
    on_behalf_of: str | None = None

    def scope_for_log(self, runtime: Runtime) -> str:
        """The scope as a log line may carry it: as written when it is one the principal's
        configuration names, else (a wildcard principal's choice, i.e. client text) a
        keyed digest."""
        return self.scope if self.scope in self.principal.scopes else runtime.log_digest(self.scope)


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
        return None
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


def authenticate(runtime: Runtime, headers: Mapping[str, str]) -> Principal:
    key = presented_key(headers)
    principal = runtime.authenticate(key) if key else None
    if principal is None:
        raise ClientError(401, "authentication_error", (ReasonCode.UNAUTHENTICATED,))
    return principal


def require(principal: Principal, action: str) -> None:
    if not principal.may(action):
        raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))


def identify(
    runtime: Runtime,
    headers: Mapping[str, str],
    action: str,
    *,
    body_scope: str | None = None,
    any_scope: bool = False,
) -> Identity:
    """Authenticate, check the action, resolve scope (body, then header, then the
    principal's default) and delegation. `any_scope`: the route authorises each scope it
    touches itself (the context routes: per scope, creators included)."""
    principal = authenticate(runtime, headers)
    if any_scope:
        if not principal.actions & CONTEXT_ACTIONS and not any(acts for _, acts in principal.scope_actions):
            raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))
        return Identity(principal, principal.default_scope, _delegation(principal, headers))
    require(principal, action)
    header_scope = headers.get(SCOPE_HEADER)
    scope = body_scope or header_scope or principal.default_scope
    if body_scope is not None and header_scope is not None and header_scope != body_scope:
        raise ClientError(422, "invalid_request", (ReasonCode.INVALID_REQUEST,))
    if scope not in principal.scopes and "*" not in principal.scopes:
        raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))
    return Identity(principal, scope, _delegation(principal, headers))


def _delegation(principal: Principal, headers: Mapping[str, str]) -> str | None:
    subject = headers.get(ON_BEHALF_HEADER)
    if subject is not None and (not principal.may("delegate") or subject not in principal.may_act_for):
        raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))
    return subject
