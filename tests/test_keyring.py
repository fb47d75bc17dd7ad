"""The binding key ring's file: key ids travel in binding tokens, so only token-safe ids
load (one with a dot loaded, then every binding it sealed failed to open); and the secret
that keys every content-free digest (logs, attribution, pace) survives rotation — a
rotation used to re-key them, so a scope's attribution records vanished from its report
and a retried invocation counted twice."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from gateway import devsetup
from gateway.config.load import load_runtime
from gateway.keyring import LOG_DIGEST_LABEL, KeyRing, KeyRingError, load_keyring, rotate_keyring_file
from tests.harness import build_env, mock_profile


def _ring(*ids: str, digest_secret: str | None = None) -> dict[str, Any]:
    keys = [
        {
            "id": key_id,
            "secret": base64.b64encode(bytes([n]) * 32).decode(),
            "state": "active" if n == 0 else "accepted",
        }
        for n, key_id in enumerate(ids)
    ]
    ring: dict[str, Any] = {"version": 1, "active": ids[0], "keys": keys}
    if digest_secret is not None:
        ring["digest_secret"] = digest_secret
    return ring


@pytest.mark.parametrize("key_id", ["k.1", "k 1", "k/1", "\u00e9", "", "k" * 65, "k\n"])
def test_a_key_id_a_token_cannot_carry_is_refused(key_id: str) -> None:
    with pytest.raises(KeyRingError, match="key id"):
        KeyRing.from_json(_ring(key_id))


def test_a_key_listed_twice_is_refused() -> None:
    with pytest.raises(KeyRingError, match="twice"):
        KeyRing.from_json(_ring("k-1", "k-1"))
    assert KeyRing.from_json(_ring("k-1", "k_2")).active.id == "k-1"


def test_a_digest_secret_must_be_32_bytes() -> None:
    with pytest.raises(KeyRingError, match="digest secret"):
        KeyRing.from_json(_ring("k-1", digest_secret=base64.b64encode(b"short").decode()))
    with pytest.raises(KeyRingError):
        KeyRing.from_json(_ring("k-1", digest_secret="not base64!"))


def test_a_new_ring_has_its_own_digest_secret_and_rotation_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    devsetup.new_keyring(path)
    ring = load_keyring(path)
    assert ring.digest_secret is not None and len(ring.digest_secret) == 32
    assert ring.log_key() == ring.digest_secret
    assert ring.digest_secret not in (key.secret for key in ring.keys.values())
    rotate_keyring_file(path)
    rotate_keyring_file(path, retire_after=True)
    rotated = load_keyring(path)
    assert rotated.active.id != ring.active.id
    assert rotated.log_key() == ring.log_key()


def test_an_older_ring_keeps_its_digests_through_rotation(tmp_path: Path) -> None:
    """A ring written before the digest secret existed keyed digests from its active key;
    its first rotation writes that very key down, so nothing already stored changes."""
    path = tmp_path / "ring.json"
    path.write_text(json.dumps(_ring("k-old")))
    before = load_keyring(path)
    assert before.digest_secret is None
    expected = hmac.new(before.active.secret, LOG_DIGEST_LABEL, hashlib.sha256).digest()
    assert before.log_key() == expected
    rotate_keyring_file(path)
    after = load_keyring(path)
    assert after.active.id != "k-old" and after.digest_secret == expected
    assert after.log_key() == expected
    rotate_keyring_file(path, retire_after=True)
    assert load_keyring(path).log_key() == expected


def test_a_reload_after_rotation_keeps_the_runtime_digest_key(tmp_path: Path) -> None:
    env = build_env(
        tmp_path / "config", "http://127.0.0.1:9", profiles=[mock_profile("p", "openai", "http://127.0.0.1:9")]
    )
    first = load_runtime(env.config)
    rotate_keyring_file(env.dir / "keys" / "bindings-keyring.json")
    second = load_runtime(env.config)
    assert second.keyring.active.id != first.keyring.active.id
    assert second.log_key == first.log_key
    assert second.log_digest("scope\x00team-a") == first.log_digest("scope\x00team-a")
