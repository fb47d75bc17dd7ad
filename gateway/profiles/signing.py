"""Ed25519 signatures over RFC 8785 canonical JSON, for UpstreamProfiles.

Owns: key generation and serialisation, key ids, signing a profile document, and verifying
one against a trusted-key list with a precise, content-free reason on failure.
Must not: read or write files (callers pass bytes and dicts), or trust anything inside the
document it verifies except the signature member.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import rfc8785
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALG = "ed25519"


class SignatureError(ValueError):
    """Why a profile is refused: unsigned, tampered, unknown key, malformed."""


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public_key: Ed25519PublicKey


def key_id_for(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519-" + hashlib.sha256(raw).hexdigest()[:16]


def public_key_b64(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def new_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_private_key(pem: bytes) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (TypeError, UnsupportedAlgorithm):  # encrypted, or a kind of key this build cannot read
        raise SignatureError("signing key is encrypted or of an unsupported kind") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError("signing key is not an Ed25519 private key")
    return key


def private_key_id(pem: bytes) -> str | None:
    """The key id of an unencrypted Ed25519 private key in PEM form (None for anything
    else: other key types, encrypted keys, non-keys)."""
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    return key_id_for(key.public_key()) if isinstance(key, Ed25519PrivateKey) else None


def trusted_key(key_id: str, public_key: str) -> TrustedKey:
    try:
        raw = base64.b64decode(public_key, validate=True)
        pub = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as exc:
        raise SignatureError(f"trusted key {key_id}: not a base64 Ed25519 public key") from exc
    if key_id_for(pub) != key_id:
        raise SignatureError(f"trusted key {key_id}: key id does not match the public key")
    return TrustedKey(key_id, pub)


def canonical_payload(document: dict[str, Any]) -> bytes:
    """The signed bytes: RFC 8785 canonical JSON of the document without `signature`."""
    unsigned = {k: v for k, v in document.items() if k != "signature"}
    return bytes(rfc8785.dumps(unsigned))


def sign(document: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """A copy of `document` carrying a fresh signature member."""
    value = key.sign(canonical_payload(document))
    signed = {k: v for k, v in document.items() if k != "signature"}
    signed["signature"] = {
        "key_id": key_id_for(key.public_key()),
        "alg": ALG,
        "value": base64.b64encode(value).decode(),
    }
    return signed


def verify(document: dict[str, Any], trusted: dict[str, TrustedKey]) -> str:
    """Check the signature; return the signing key id. Raises SignatureError(reason)."""
    sig = document.get("signature")
    if sig is None:
        raise SignatureError("unsigned (no signature member)")
    if not isinstance(sig, dict) or set(sig) != {"key_id", "alg", "value"}:
        raise SignatureError("malformed signature member")
    if sig["alg"] != ALG:
        raise SignatureError(f"unsupported signature algorithm {str(sig['alg'])[:32]!r}")
    key = trusted.get(sig["key_id"]) if isinstance(sig["key_id"], str) else None
    if key is None:
        raise SignatureError(f"signed by an unknown key {str(sig['key_id'])[:64]!r}")
    try:
        value = base64.b64decode(sig["value"], validate=True)
        key.public_key.verify(value, canonical_payload(document))
    except (InvalidSignature, ValueError, TypeError):
        raise SignatureError("signature does not match the content (tampered or re-signed)") from None
    return key.key_id
