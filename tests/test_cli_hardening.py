"""CLI commands an operator runs by hand: `principals add` writes an entry only when the file
with it still loads (a bad id, an unknown profile or a duplicate id used to be appended, then
every reload and the next start failed and the printed key never worked); an encrypted or
odd signing key is a clear error, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.config.load import load_runtime


def _wiregate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cli") / "wg"
    made = _wiregate("init", "--dir", str(directory))
    assert made.returncode == 0, made.stderr
    return directory


@pytest.mark.parametrize(
    "extra",
    [
        ["--id", "bad id!", "--profiles", "mock-openai"],
        ["--id", "fine", "--profiles", "no-such-profile"],
    ],
)
def test_an_entry_the_gateway_would_refuse_is_never_written(work: Path, extra: list[str]) -> None:
    principals = work / "principals.toml"
    before = principals.read_bytes()
    done = _wiregate("principals", "add", *extra, "--config", str(work / "wiregate.toml"))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "gateway key" not in done.stdout  # no key is handed out for an entry that cannot work
    assert principals.read_bytes() == before
    load_runtime(work / "wiregate.toml")  # still loads


def test_a_duplicate_id_is_refused_and_a_good_entry_loads(work: Path) -> None:
    config = str(work / "wiregate.toml")
    first = _wiregate("principals", "add", "--id", "ops-bot", "--profiles", "mock-openai", "--config", config)
    assert first.returncode == 0, first.stderr
    before = (work / "principals.toml").read_bytes()
    again = _wiregate("principals", "add", "--id", "ops-bot", "--profiles", "mock-openai", "--config", config)
    assert again.returncode == 1 and "duplicate principal id" in again.stderr
    assert (work / "principals.toml").read_bytes() == before
    runtime = load_runtime(work / "wiregate.toml")
    assert "ops-bot" in {principal.id for _, principal in runtime.principals}


def test_a_new_principals_file_is_private(tmp_path: Path) -> None:
    target = tmp_path / "principals.toml"
    done = _wiregate("principals", "add", "--id", "solo", "--profiles", "any", "--file", str(target))
    assert done.returncode == 0, done.stderr
    assert target.stat().st_mode & 0o077 == 0


def test_an_encrypted_signing_key_is_a_clear_error(work: Path, tmp_path: Path) -> None:
    key = tmp_path / "encrypted.pem"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    profile = next((work / "profiles").glob("*.json"))
    copy = tmp_path / profile.name
    copy.write_bytes(profile.read_bytes())
    done = _wiregate("profiles", "sign", str(copy), "--key", str(key))
    assert done.returncode == 1 and "Traceback" not in done.stderr and "encrypted" in done.stderr
