"""UpstreamProfiles: Ed25519 over RFC 8785, refused precisely at load; the CLI that makes them."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway import devsetup
from gateway.config.load import ConfigError, load_profile, load_runtime, load_trusted_keys
from gateway.profiles import signing
from tests.harness import Env, mock_profile

REPO = Path(__file__).resolve().parent.parent
NOW = datetime.now(UTC)


def _trusted(env: Env) -> dict[str, signing.TrustedKey]:
    return load_trusted_keys(("keys/profile-signing.pub.json",), env.dir)


def test_signed_profile_loads(make_env: Any) -> None:
    env = make_env()
    loaded = load_profile(env.dir / "profiles" / "mock-openai.json", _trusted(env), NOW, env.dir)
    assert loaded.profile.id == "mock-openai" and loaded.digest.startswith("sha256:")
    assert loaded.credential == env.upstream_key and env.upstream_key not in repr(loaded)


def test_every_flipped_byte_is_refused(make_env: Any) -> None:
    env = make_env()
    path = env.dir / "profiles" / "mock-openai.json"
    original = path.read_bytes()
    trusted = _trusted(env)
    refused = 0
    for i in range(len(original)):
        flipped = bytearray(original)
        flipped[i] ^= 0x01
        path.write_bytes(bytes(flipped))
        try:
            load_profile(path, trusted, NOW, env.dir)
        except ConfigError as exc:
            assert "mock-openai.json" in str(exc) and "refused" in str(exc)
            refused += 1
        else:  # only whitespace changes that leave the JSON identical may pass
            assert json.loads(bytes(flipped)) == json.loads(original)
    path.write_bytes(original)
    assert refused > len(original) * 0.9


def _resign(env: Env, doc: dict[str, Any], key: Any) -> Path:
    path = env.dir / "profiles" / "mock-openai.json"
    devsetup.write_profile(path, doc, key)
    return path


@pytest.mark.parametrize(
    "case,needle",
    [
        ("unknown_key", "unknown key"),
        ("expired", "expired"),
        ("not_yet_valid", "not valid before"),
        ("unsigned", "unsigned"),
        ("tampered_field", "does not match"),
        ("http_not_loopback", "loopback"),
        ("extra_field", "Extra inputs"),
        ("naive_not_before", "timezone"),  # beside an `expires` that has one: never compared
        ("naive_expires", "timezone"),
    ],
)
def test_refusals_name_file_and_reason(make_env: Any, case: str, needle: str) -> None:
    env = make_env()
    doc = mock_profile("mock-openai", "openai", env.mock_url)
    key = env.signing_key
    if case == "unknown_key":
        key = signing.new_private_key()
    elif case == "expired":
        doc["expires"] = (NOW - timedelta(minutes=1)).isoformat()
    elif case == "not_yet_valid":
        doc["not_before"] = (NOW + timedelta(days=1)).isoformat()
    elif case == "http_not_loopback":
        doc["base_url"] = "http://example.com/v1"
    elif case == "extra_field":
        doc["surprise"] = 1
    elif case == "naive_not_before":
        doc["not_before"], doc["expires"] = "2020-01-01T00:00:00", "2099-01-01T00:00:00Z"
    elif case == "naive_expires":
        doc["not_before"], doc["expires"] = "2020-01-01T00:00:00Z", "2099-01-01T00:00:00"
    path = _resign(env, doc, key)
    if case == "unsigned":
        data = json.loads(path.read_text())
        del data["signature"]
        path.write_text(json.dumps(data))
    elif case == "tampered_field":
        data = json.loads(path.read_text())
        data["base_url"] = "http://127.0.0.2:1/v1"
        path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        load_runtime(env.config)
    message = str(info.value)
    assert "mock-openai.json" in message and needle in message
    assert env.upstream_key not in message


def test_duplicate_keys_in_profile_refused(make_env: Any) -> None:
    env = make_env()
    path = env.dir / "profiles" / "mock-openai.json"
    text = path.read_text()
    path.write_text(text.replace('"version": 1,', '"version": 1, "version": 2,', 1))
    with pytest.raises(ConfigError, match="mock-openai.json.*duplicate"):
        load_runtime(env.config)


def test_missing_credential_is_reported_not_fatal(make_env: Any) -> None:
    env = make_env()
    doc = mock_profile("mock-openai", "openai", env.mock_url, credential="env:WIREGATE_TEST_UNSET_VAR")
    _resign(env, doc, env.signing_key)
    runtime = load_runtime(env.config)
    loaded = runtime.profiles["mock-openai"]
    assert loaded.credential is None and "WIREGATE_TEST_UNSET_VAR" in (loaded.credential_error or "")


def test_reload_failure_keeps_running_config(make_env: Any, gateway_for: Any, captured_logs: Any) -> None:
    env = make_env()
    gateway = gateway_for(env)
    assert gateway.running is not None
    before = gateway.running.holder.current
    path = env.dir / "profiles" / "mock-openai.json"
    good = path.read_bytes()
    path.write_bytes(good.replace(b"gpt-*", b"gpu-*"))  # tampered
    assert gateway.reload() is False
    assert gateway.running.holder.current is before
    failures = [r for r in captured_logs.records() if r.get("event") == "config_reload_failed"]
    assert failures and "mock-openai.json" in failures[-1]["reason"]
    path.write_bytes(good)
    assert gateway.reload() is True
    assert gateway.running.holder.current.generation == before.generation + 1


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_cli_keys_profiles_principals(tmp_path: Path) -> None:
    out = _cli("keys", "new-signing-key", "--out", "sign.key", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    key_id = json.loads(out.stdout)["key_id"]
    assert (tmp_path / "sign.pub.json").exists() and oct((tmp_path / "sign.key").stat().st_mode)[-3:] == "600"
    out = _cli(
        "profiles",
        "new",
        "--id",
        "p1",
        "--provider",
        "openai",
        "--base-url",
        "https://api.openai.com/v1",
        "--models",
        "gpt-*",
        "--credential",
        "env:OPENAI_API_KEY",
        "--sign-key",
        "sign.key",
        "--out",
        "p1.json",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "p1.json").read_text())["signature"]["key_id"] == key_id
    out = _cli("profiles", "verify", "p1.json", "--trusted", "sign.pub.json", cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stdout + out.stderr
    doc = json.loads((tmp_path / "p1.json").read_text())
    doc["models"] = ["*"]
    (tmp_path / "p1.json").write_text(json.dumps(doc))
    out = _cli("profiles", "verify", "p1.json", "--trusted", "sign.pub.json", cwd=tmp_path)
    assert out.returncode == 1 and "REFUSED" in out.stdout and "p1.json" in out.stdout
    out = _cli("profiles", "sign", "p1.json", "--key", "sign.key", cwd=tmp_path)
    assert out.returncode == 0
    assert _cli("profiles", "verify", "p1.json", "--trusted", "sign.pub.json", cwd=tmp_path).returncode == 0
    out = _cli(
        "profiles",
        "new",
        "--id",
        "bad",
        "--provider",
        "openai",
        "--base-url",
        "http://example.com",
        "--models",
        "x",
        "--credential",
        "env:X",
        "--sign-key",
        "sign.key",
        cwd=tmp_path,
    )
    assert out.returncode == 1 and "loopback" in out.stderr

    (tmp_path / "principals.toml").write_text("")
    out = _cli("principals", "add", "--id", "svc", "--profiles", "p1", "--file", "principals.toml", cwd=tmp_path)
    assert out.returncode == 0
    key = out.stdout.strip().splitlines()[-1].split()[-1]
    stored = (tmp_path / "principals.toml").read_text()
    assert key.startswith("wg-") and key not in stored
    import hashlib

    assert hashlib.sha256(key.encode()).hexdigest() in stored


def test_committed_example_profiles_verify() -> None:
    pub = json.loads((REPO / "profiles" / "trust" / "example-signing.pub.json").read_text())
    trusted = {pub["key_id"]: signing.trusted_key(pub["key_id"], pub["public_key"])}
    names = sorted(p.name for p in (REPO / "profiles").glob("*.json"))
    assert names == ["anthropic.json", "mock-anthropic.json", "mock-openai.json", "openai.json"]
    for name in names:
        loaded = load_profile(REPO / "profiles" / name, trusted, NOW, REPO)
        assert loaded.profile.id == name.removesuffix(".json")
