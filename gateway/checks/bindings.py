"""Bindings: AEAD-sealed, versioned, short-lived claims that tie a decision to a payload.

Format: ``wgb1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>``; the ``wgb1.<key id>``
header is the associated data, so the version and key id cannot be swapped. The cipher is
ChaCha20-Poly1305 (256-bit keys, 96-bit random nonces): constant-time in software on any
CPU, which matters for replicas without AES instructions; AES-256-GCM would be equally
sound where AES-NI is guaranteed.

Owns: the key ring (one active key, older keys still accepted, retired keys that grant
nothing), sealing claims, and opening with a distinct reason for each failure:
`binding_invalid` (malformed, too long, unknown or retired key, tampered),
`binding_expired`, `binding_phase` (wrong kind or phase) and `binding_mismatch`
(another audience, principal, scope, target or payload).
Must not: log claims or keys.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag

from gateway.keyring import KeyRing
from gateway.vocab import ReasonCode

PREFIX = "wgb1"
# Bindings are bearer-ish strings in JSON bodies and headers; keep them bounded. A reuse binding
# names up to eight dependencies (scope id, artifact id, revision each) beside the principal, its
# delegate and the scope: with ids at their longest it needs about 5.5 KB (2 KB refused ordinary
# prepares); 6 KB still fits one `x-wiregate-prepared-context` header line (8 KB).
MAX_LENGTH = 6144
_NONCE = 12


class BindingTooLarge(ValueError):
    """Claims that would seal into a token longer than MAX_LENGTH (ids at their longest)."""


class BindingError(Exception):
    """Why a binding grants nothing. `reason` is a content-free reason code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def seal(ring: KeyRing, claims: Mapping[str, Any]) -> str:
    key = ring.active
    header = f"{PREFIX}.{key.id}"
    nonce = os.urandom(_NONCE)
    plaintext = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    sealed = key.cipher.encrypt(nonce, plaintext, header.encode())
    token = f"{header}.{_b64(nonce + sealed)}"
    if len(token) > MAX_LENGTH:
        raise BindingTooLarge("binding claims too large")
    return token


def open_binding(ring: KeyRing, token: object) -> dict[str, Any]:
    """Decrypt and authenticate. Raises BindingError(binding_invalid) on any failure."""
    if not isinstance(token, str) or len(token) > MAX_LENGTH or not token.isascii():
        raise BindingError(ReasonCode.BINDING_INVALID)
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise BindingError(ReasonCode.BINDING_INVALID)
    key = ring.usable(parts[1])
    if key is None:
        raise BindingError(ReasonCode.BINDING_INVALID)  # unknown or retired key: grants nothing
    try:
        blob = _unb64(parts[2])
        if _b64(blob) != parts[2]:  # only the canonical encoding is accepted
            raise ValueError
        plaintext = key.cipher.decrypt(blob[:_NONCE], blob[_NONCE:], f"{PREFIX}.{key.id}".encode())
        claims = json.loads(plaintext)
    except (InvalidTag, ValueError):
        raise BindingError(ReasonCode.BINDING_INVALID) from None
    if not isinstance(claims, dict) or claims.get("kid") != key.id:
        raise BindingError(ReasonCode.BINDING_INVALID)
    return claims


def check_claims(
    claims: Mapping[str, Any],
    *,
    now: float,
    kind: str,
    audience: str,
    expect: Mapping[str, Any],
    deadline_claim: str = "exp",
) -> None:
    """Validate opened claims: audience, kind (phase), expiry (`deadline_claim`), then each
    expected claim. Raises BindingError with the specific reason."""
    if claims.get("aud") != audience:
        raise BindingError(ReasonCode.BINDING_MISMATCH)
    if claims.get("kind") != kind:
        raise BindingError(ReasonCode.BINDING_PHASE)
    deadline = claims.get(deadline_claim)
    if not isinstance(deadline, (int, float)) or now >= deadline:
        raise BindingError(ReasonCode.BINDING_EXPIRED)
    for name, value in expect.items():
        if claims.get(name) != value:
            raise BindingError(ReasonCode.BINDING_MISMATCH)


def new_claims(ring: KeyRing, *, kind: str, audience: str, now: float, ttl_s: float, **fields: Any) -> dict[str, Any]:
    claims: dict[str, Any] = {
        "v": 1,
        "kind": kind,
        "kid": ring.active.id,
        "aud": audience,
        "iat": int(now),
        "exp": int(now + ttl_s),
        "jti": secrets.token_hex(8),
    }
    claims.update(fields)
    return claims
