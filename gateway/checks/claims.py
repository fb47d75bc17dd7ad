"""Typed binding claims and their versioned codec.

Owns: `SendClaims`, `ReleaseClaims` and `ReuseClaims` (frozen), how each is written into a
binding (short wire keys, `v` = 1) and read back (every claim present and of its type, or
the binding is invalid), and opening each kind with the checks every opener needs:
audience, kind, party, deadline — and, for a send binding, that its claims are coherent.
Must not: log claims, or judge anything beyond the claims themselves (policy version and
decision are the runner's).
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from gateway.checks.bindings import BindingError, open_binding, seal
from gateway.keyring import KeyRing
from gateway.vocab import ReasonCode

VERSION = 1


def _wire(key: str) -> Any:
    return field(metadata={"wire": key})


@dataclass(frozen=True, slots=True)
class _Claims:
    """What every binding names: its kind, key, audience, issue and expiry, an id, and the
    party it was issued to."""

    KIND: ClassVar[str] = ""

    key_id: str = _wire("kid")
    audience: str = _wire("aud")
    issued_at: int = _wire("iat")
    expires_at: int = _wire("exp")
    id: str = _wire("jti")
    principal: str = _wire("sub")
    delegate: str | None = _wire("dlg")
    scope: str = _wire("scope")

    def encode(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": VERSION, "kind": self.KIND}
        for name, wire, _ in _LAYOUTS[type(self)]:
            value = getattr(self, name)
            out[wire] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True, slots=True)
class SendClaims(_Claims):
    KIND: ClassVar[str] = "send"

    phase: str = _wire("phase")
    profile_id: str = _wire("tp")
    profile_digest: str = _wire("tpd")
    policy_version: str = _wire("pv")
    decision: str = _wire("dec")
    mode: str = _wire("md")
    carriers: str = _wire("car")
    body_digest: str = _wire("body")
    headers_digest: str = _wire("hdr")
    correlate_until: int = _wire("cu")


@dataclass(frozen=True, slots=True)
class ReleaseClaims(_Claims):
    KIND: ClassVar[str] = "release"

    phase: str = _wire("phase")
    profile_id: str = _wire("tp")
    profile_digest: str = _wire("tpd")
    policy_version: str = _wire("pv")
    decision: str = _wire("dec")
    request_binding_digest: str = _wire("rb")
    body_digest: str = _wire("body")


@dataclass(frozen=True, slots=True)
class ReuseClaims(_Claims):
    """A prepared context's reuse binding: the exact content (digest) and every artifact
    revision it was built from, for the principal and scope it was prepared for."""

    KIND: ClassVar[str] = "reuse"

    content_digest: str = _wire("cd")
    dependencies: tuple[dict[str, Any], ...] = _wire("deps")


C = TypeVar("C", bound=_Claims)

_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "str | None": (str, type(None)),
    "tuple[dict[str, Any], ...]": (list,),
}


# (field name, wire key, accepted types) of each claim, in field order, per kind of claims:
# walking the dataclass fields on every call was most of a binding's encoding and decoding.
_LAYOUTS: dict[type, tuple[tuple[str, str, tuple[type, ...]], ...]] = {
    cls: tuple((f.name, f.metadata["wire"], _TYPES[str(f.type)]) for f in dataclasses.fields(cls))
    for cls in (SendClaims, ReleaseClaims, ReuseClaims)
}


def decode(cls: type[C], data: Mapping[str, Any]) -> C:
    """Claims of `cls` from opened binding data. A missing claim, one of the wrong type or
    another version makes the binding invalid; another kind is the wrong phase."""
    if data.get("v") != VERSION:
        raise BindingError(ReasonCode.BINDING_INVALID)
    if data.get("kind") != cls.KIND:
        raise BindingError(ReasonCode.BINDING_PHASE)
    values: dict[str, Any] = {}
    for name, key, kinds in _LAYOUTS[cls]:
        if key not in data:
            raise BindingError(ReasonCode.BINDING_INVALID)
        value = data[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise BindingError(ReasonCode.BINDING_INVALID)
        if isinstance(value, list):
            if not all(isinstance(item, dict) for item in value):
                raise BindingError(ReasonCode.BINDING_INVALID)
            value = tuple(value)
        values[name] = value
    return cls(**values)


def new(cls: type[C], ring: KeyRing, *, audience: str, now: float, ttl_s: float, **fields: Any) -> C:
    """Fresh claims: key, audience, issue and expiry times and a random id filled in."""
    return cls(
        key_id=ring.active.id,
        audience=audience,
        issued_at=int(now),
        expires_at=int(now + ttl_s),
        id=secrets.token_hex(8),
        **fields,
    )


def seal_claims(ring: KeyRing, claims: _Claims) -> str:
    return seal(ring, claims.encode())


def open_claims(
    cls: type[C],
    ring: KeyRing,
    token: object,
    *,
    audience: str,
    now: float,
    principal: str,
    delegate: str | None,
    scope: str,
) -> C:
    """Open, decode and check the claims every opener checks: audience, kind, the party,
    and the deadline (`correlate_until` for a send binding a release refers to, else the
    expiry). Raises BindingError with the specific reason."""
    data = open_binding(ring, token)
    if data.get("aud") != audience:
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    claims = decode(cls, data)
    deadline = claims.correlate_until if isinstance(claims, SendClaims) else claims.expires_at
    if now >= deadline:
        raise BindingError(ReasonCode.BINDING_EXPIRED)
    if (claims.principal, claims.delegate, claims.scope) != (principal, delegate, scope):
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    if isinstance(claims, SendClaims) and not claims.issued_at <= claims.expires_at <= claims.correlate_until:
        raise BindingError(ReasonCode.BINDING_INVALID)  # incoherent: never ours
    return claims
