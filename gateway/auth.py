"""Identity and authorisation: gateway key → principal, actions, scope, delegation (SPEC §3).

Owns: reading the presented key (`Authorization: Bearer` or `x-api-key`), constant-time
lookup through the runtime, the action check, scope resolution and delegation.
Must not: log or forward the presented key, or trust any client-supplied identity.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from gateway.config.runtime import Principal, Runtime
from gateway.errors import ClientError
from gateway.vocab import ReasonCode

SCOPE_HEADER = "x-wiregate-scope"
ON_BEHALF_HEADER = "x-wiregate-on-behalf-of"
CONTEXT_ACTIONS = frozenset({"context.read", "context.prepare", "context.write"})
READ_ACTIONS = CONTEXT_ACTIONS  # prepare and write return or change a scope's content: they include reading


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


_OWS = " \t"  # HTTP's optional whitespace: a key is never read through any other (U+00A0, U+3000...)


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request presents: `Authorization: Bearer`, else `x-api-key`. A header
    given twice is ambiguous (intermediaries disagree on which one counts): no key."""
    getall = getattr(headers, "getall", None)
    if getall is not None and (len(getall("authorization", ())) > 1 or len(getall("x-api-key", ())) > 1):
        return None
    auth = headers.get("authorization")
    if auth is not None:
        scheme, _, token = auth.strip(_OWS).partition(" ")
        token = token.strip(_OWS)
        if scheme.lower() == "bearer" and token:
            return token
        return None
    key = (headers.get("x-api-key") or "").strip(_OWS)
    return key or None


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
    creator_of: Callable[[str], str | None] | None = None,
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
    if not reaches(principal, scope) and (creator_of is None or creator_of(scope) != principal.id):
        raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))
    return Identity(principal, scope, _delegation(principal, headers))


def _delegation(principal: Principal, headers: Mapping[str, str]) -> str | None:
    subject = headers.get(ON_BEHALF_HEADER)
    if subject is not None and (not principal.may("delegate") or subject not in principal.may_act_for):
        raise ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))
    return subject


def reaches_every_scope(principal: Principal) -> bool:
    """Does the principal reach every scope (a `*` among its `scopes`)? Only such a
    principal reads a view across scopes (the attribution report without a scope)."""
    return "*" in principal.scopes


def reaches(principal: Principal, scope_id: str) -> bool:
    """Does one of the principal's `scopes` patterns name this scope?"""
    return any(fnmatch.fnmatchcase(scope_id, pattern) for pattern in principal.scopes)


def may_on_scope(principal: Principal, scope_id: str, action: str, created_by: str | None) -> bool:
    """May `principal` take a context `action` on `scope_id`? It must reach the scope (its
    `scopes` patterns, or it created it) and hold the action there (`scope_actions`, first
    matching pattern, else `actions`). Reading is implied by prepare and write."""
    if not (reaches(principal, scope_id) or (created_by is not None and created_by == principal.id)):
        return False
    actions = principal.actions
    for pattern, scoped in principal.scope_actions:
        if fnmatch.fnmatchcase(scope_id, pattern):
            actions = scoped
            break
    if action == "context.read":
        return bool(actions & READ_ACTIONS)
    return action in actions


async def creators(
    runtime: Runtime,
    headers: Mapping[str, str],
    find: Callable[[str], Awaitable[str | None]] | None,
    *,
    body_scope: str | None = None,
) -> Callable[[str], str | None] | None:
    """For `identify`: who created the scope this request names, when the principal's own
    `scopes` do not reach it (a creator may use the scopes it created). Authenticates first:
    an unknown key never causes a lookup."""
    principal = authenticate(runtime, headers)
    scope = body_scope or headers.get(SCOPE_HEADER)
    if find is None or scope is None or reaches(principal, scope) or not 0 < len(scope) <= 256:
        return None
    creator = await find(scope)
    return lambda asked: creator if asked == scope else None
