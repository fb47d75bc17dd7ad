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

from gateway import cli, devsetup
from gateway.checks.bindings import BindingError, open_binding, seal
from gateway.config.load import load_runtime
from gateway.keyring import (
    LOG_DIGEST_LABEL,
    KeyRing,
    KeyRingError,
    activate_keyring_key,
    load_keyring,
    rotate_keyring_file,
)
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


def _sealed(ring: KeyRing) -> str:
    return seal(ring, {"kid": ring.active.id, "kind": "send"})


def test_a_staged_key_is_opened_everywhere_before_any_replica_seals_with_it(tmp_path: Path) -> None:
    """Two-step rotation for replicas that share a ring and reload it at different moments:
    a staged key is accepted only; once activated, a replica still on the staged ring opens
    what the activated ring seals, while one still on the ring before the stage could not."""
    path = tmp_path / "ring.json"
    devsetup.new_keyring(path)
    before = load_keyring(path)
    staged_id = rotate_keyring_file(path, stage=True)
    staged = load_keyring(path)
    assert staged.active.id == before.active.id and staged.keys[staged_id].state == "accepted"
    assert staged.log_key() == before.log_key()
    assert open_binding(before, _sealed(staged))["kid"] == before.active.id  # nothing new is sealed yet

    activate_keyring_key(path, staged_id)
    activated = load_keyring(path)
    assert activated.active.id == staged_id and activated.keys[before.active.id].state == "accepted"
    assert activated.log_key() == before.log_key()
    token = _sealed(activated)
    assert open_binding(staged, token)["kid"] == staged_id  # a replica on the staged ring opens it
    with pytest.raises(BindingError):
        open_binding(before, token)  # what a one-step rotation risks on a replica not yet reloaded
    assert open_binding(activated, _sealed(before))["kid"] == before.active.id  # old bindings still open


def test_only_an_accepted_key_can_be_activated(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    devsetup.new_keyring(path)
    first = load_keyring(path).active.id
    second = rotate_keyring_file(path)
    rotate_keyring_file(path, retire_after=True)  # `first` was only accepted: now retired
    assert load_keyring(path).keys[first].state == "retired"
    written = path.read_bytes()
    with pytest.raises(KeyRingError, match="retired"):
        activate_keyring_key(path, first)
    with pytest.raises(KeyRingError, match="no key"):
        activate_keyring_key(path, "k-unknown")
    assert path.read_bytes() == written  # a refused activation writes nothing
    activate_keyring_key(path, second)
    assert load_keyring(path).active.id == second


def test_the_cli_stages_and_activates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ring.json"
    devsetup.new_keyring(path)
    active = load_keyring(path).active.id
    assert cli.main(["keys", "rotate", "--keyring", str(path), "--stage"]) == 0
    staged = json.loads(capsys.readouterr().out)["staged"]
    assert load_keyring(path).active.id == active
    assert cli.main(["keys", "activate", "--keyring", str(path), "--id", staged]) == 0
    assert json.loads(capsys.readouterr().out) == {"active": staged}
    assert load_keyring(path).active.id == staged
    assert (path.stat().st_mode & 0o777) == 0o600
    assert cli.main(["keys", "activate", "--keyring", str(path), "--id", "k-nope"]) == 1
    assert "no key" in capsys.readouterr().err
