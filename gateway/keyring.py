"""The binding key ring: one active key, older keys still accepted, retired keys that
grant nothing; loaded from its file and rotated without downtime. Beside the keys, the
digest secret: what keys every content-free digest (logs, attribution, pace), which must
not change when the binding keys rotate (a scope's or an invocation's digest names the
same thing for as long as the records that hold it live).

Owns: `KeyRing`, `RingKey`, reading and rotating the key-ring file. Sealing and opening
bindings with it is `gateway.checks.bindings`.
Must not: log or print a key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from gateway import secretfile


class KeyRingError(ValueError):
    pass


@dataclass(frozen=True)
class RingKey:
    id: str
    secret: bytes  # never logged
    state: str  # "active" | "accepted" | "retired"
    cipher: ChaCha20Poly1305 = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cipher", ChaCha20Poly1305(self.secret))  # built once per load

    def __repr__(self) -> str:
        return f"RingKey(id={self.id!r}, state={self.state!r})"


# A key id travels in every binding token ("wgb1.<id>.<…>"): token-safe characters only.
KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
LOG_DIGEST_LABEL = b"wiregate.log-digest.v1"


@dataclass(frozen=True)
class KeyRing:
    active: RingKey
    keys: Mapping[str, RingKey]
    digest_secret: bytes | None = field(default=None, repr=False)  # absent in rings written before it

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KeyRing:
        try:
            keys: dict[str, RingKey] = {}
            for item in data["keys"]:
                key_id = item["id"]
                if not isinstance(key_id, str) or KEY_ID.fullmatch(key_id) is None:
                    raise KeyRingError("a key id must be 1-64 characters of A-Z a-z 0-9 _ -")
                if key_id in keys:
                    raise KeyRingError(f"key {key_id}: listed twice")
                secret = base64.b64decode(item["secret"], validate=True)
                if len(secret) != 32:
                    raise KeyRingError(f"key {key_id}: secret must be 32 bytes")
                if item["state"] not in ("active", "accepted", "retired"):
                    raise KeyRingError(f"key {key_id}: unknown state")
                keys[key_id] = RingKey(key_id, secret, item["state"])
            active = keys[str(data["active"])]
            digest_secret = None
            if data.get("digest_secret") is not None:
                digest_secret = base64.b64decode(data["digest_secret"], validate=True)
                if len(digest_secret) != 32:
                    raise KeyRingError("the digest secret must be 32 bytes")
        except KeyRingError:
            raise
        except (KeyError, TypeError, ValueError):
            raise KeyRingError("not a key ring (version, active, keys[id, secret, state])") from None
        if active.state != "active":
            raise KeyRingError("the active key is not in state 'active'")
        return cls(active, keys, digest_secret)

    def log_key(self) -> bytes:
        """What keys the content-free digests: the ring's digest secret; for a ring written
        before it existed, derived from the active key (and written down as the digest
        secret by the next rotation, so digests stay what they were)."""
        if self.digest_secret is not None:
            return self.digest_secret
        return hmac.new(self.active.secret, LOG_DIGEST_LABEL, hashlib.sha256).digest()

    def usable(self, key_id: str) -> RingKey | None:
        key = self.keys.get(key_id)
        if key is None or key.state == "retired":
            return None
        return key


def load_keyring(path: Path) -> KeyRing:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KeyRingError(f"{path}: cannot be read ({exc.strerror})") from None
    except (ValueError, RecursionError):
        raise KeyRingError(f"{path}: not JSON") from None
    try:
        return KeyRing.from_json(data)
    except KeyRingError as exc:
        raise KeyRingError(f"{path}: {exc}") from None


def _read_ring_file(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        KeyRing.from_json(data)
    except (OSError, ValueError, RecursionError) as exc:
        raise KeyRingError(f"{path}: {exc}") from None
    return data


def _write_ring_file(path: Path, data: Mapping[str, Any]) -> None:
    try:
        secretfile.write_private(path, (json.dumps(data, indent=2) + "\n").encode(), keep_group=True)
    except OSError as exc:
        raise KeyRingError(f"{path}: cannot be written ({exc.strerror})") from None


def rotate_keyring_file(path: Path, *, retire_after: bool = False, stage: bool = False) -> str:
    """Add a new active key; the previous active key stays accepted (bindings it sealed
    keep verifying until they expire). With `retire_after`, keys that were only accepted
    are retired and grant nothing from the next reload on.

    With `stage`, the new key is only accepted: every gateway that loads the ring opens
    bindings sealed with it, none seals with it yet. Replicas that share a ring reload it
    at different moments; staging first (and `activate_keyring_key` once every replica has
    loaded the staged ring) means no replica ever sees a binding sealed with a key it does
    not know yet."""
    data = _read_ring_file(path)
    ring = KeyRing.from_json(data)
    if ring.digest_secret is None:  # digests keep their key: the one the active key gave them
        data["digest_secret"] = base64.b64encode(ring.log_key()).decode()
    for item in data["keys"]:
        if item["state"] == "accepted" and retire_after:
            item["state"] = "retired"
        if item["state"] == "active" and not stage:
            item["state"] = "accepted"
    new_id = "k-" + secrets.token_hex(4)
    while new_id in ring.keys:
        new_id = "k-" + secrets.token_hex(4)
    data["keys"].append(
        {
            "id": new_id,
            "secret": base64.b64encode(secrets.token_bytes(32)).decode(),
            "state": "accepted" if stage else "active",
            "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    if not stage:
        data["active"] = new_id
    _write_ring_file(path, data)
    return new_id


def activate_keyring_key(path: Path, key_id: str) -> None:
    """Make an accepted key (one staged by `rotate_keyring_file(stage=True)`) the active
    one; the previous active key stays accepted. A retired or unknown key is refused: a
    retired key grants nothing and must never seal again."""
    data = _read_ring_file(path)
    ring = KeyRing.from_json(data)
    key = ring.keys.get(key_id)
    if key is None:
        named = f" {key_id}" if KEY_ID.fullmatch(key_id) else ""
        raise KeyRingError(f"{path}: no key{named} in the ring")
    if key.state == "retired":
        raise KeyRingError(f"{path}: key {key_id} is retired and cannot be activated")
    if key.state == "active":
        return
    if ring.digest_secret is None:
        data["digest_secret"] = base64.b64encode(ring.log_key()).decode()
    for item in data["keys"]:
        if item["state"] == "active":
            item["state"] = "accepted"
        if item["id"] == key_id:
            item["state"] = "active"
    data["active"] = key_id
    _write_ring_file(path, data)
