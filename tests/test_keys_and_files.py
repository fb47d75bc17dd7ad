"""Keys and secret files: `wiregate init` keeps the profile-signing key out of the served
tree, and the gateway refuses to start if a trusted key's private half is inside it; the
dev CA is name-constrained to loopback and its key is never written; secret files others
can read refuse the load, group-readable ones are logged loudly."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from gateway import devsetup
from gateway.config.load import ConfigError, load_runtime


@pytest.fixture
def initialised(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    work = tmp_path / "served"
    facts = devsetup.init(work)
    return work, facts


def test_init_keeps_the_signing_key_outside_the_served_tree(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, facts = initialised
    signing_key = Path(facts["signing_key"])
    assert signing_key.is_file() and work not in signing_key.parents
    assert (signing_key.stat().st_mode & 0o777) == 0o600
    assert (work / "keys" / "profile-signing.pub.json").is_file()
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in work.rglob("*.key") if "tls" not in p.parts)
    assert load_runtime(work / "wiregate.toml").profiles  # and the gateway loads


def test_a_trusted_private_key_inside_the_served_tree_refuses_the_load(
    initialised: tuple[Path, dict[str, Any]],
) -> None:
    work, facts = initialised
    shutil.copy(facts["signing_key"], work / "secrets" / "oops.pem")
    with pytest.raises(ConfigError, match="private key of trusted profile-signing key"):
        load_runtime(work / "wiregate.toml")
    (work / "secrets" / "oops.pem").unlink()
    other = work / "keys" / "unrelated.key"  # some other Ed25519 key is not a problem
    devsetup.new_signing_key(other, work / "keys" / "unrelated.pub.json")
    load_runtime(work / "wiregate.toml")


def test_the_dev_ca_is_name_constrained_and_its_key_discarded(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, _ = initialised
    tls = work / "tls"
    assert not (tls / "ca.key").exists()
    assert sorted(p.name for p in tls.iterdir()) == ["ca.pem", "server.key", "server.pem"]
    ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    constraints = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert constraints.critical
    permitted = {str(getattr(n, "value", n)) for n in constraints.value.permitted_subtrees or ()}
    assert permitted == {"localhost", "127.0.0.0/8", "::1/128"}
    server = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)


@pytest.mark.parametrize("which", ["keyring", "credential", "secret_values", "tls_key"])
def test_secret_files_others_can_read_refuse_the_load(initialised: tuple[Path, dict[str, Any]], which: str) -> None:
    work, _ = initialised
    path = {
        "keyring": work / "keys" / "bindings-keyring.json",
        "credential": work / "secrets" / "mock-upstream.key",
        "secret_values": work / "secrets" / "secret-values.txt",
        "tls_key": work / "tls" / "server.key",  # whoever reads it can be the gateway
    }[which]
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_runtime(work / "wiregate.toml")
    os.chmod(path, 0o640)  # group-readable: loads, and says so
    runtime = load_runtime(work / "wiregate.toml")
    assert any(str(path) in w and "group" in w for w in runtime.warnings)
    os.chmod(path, 0o600)
    assert load_runtime(work / "wiregate.toml").warnings == ()


def test_a_principals_file_others_can_read_is_a_warning(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, _ = initialised
    os.chmod(work / "principals.toml", 0o644)
    runtime = load_runtime(work / "wiregate.toml")
    assert any("principals" in w for w in runtime.warnings)


@pytest.mark.parametrize(
    "which",
    [
        "configuration",
        "policy",
        "principals",
        "trusted profile key",
        "binding key ring",
        "secret values",
        "TLS private key",
        "TLS certificate",
    ],
)
def test_files_that_decide_enforcement_writable_by_others_refuse_the_load(
    initialised: tuple[Path, dict[str, Any]], which: str
) -> None:
    """Whoever can write the policy or the secret values can empty what the gateway stops;
    the principals, a trusted key or the configuration, who may call and what is trusted."""
    work, _ = initialised
    path = {
        "configuration": work / "wiregate.toml",
        "policy": work / "policy.toml",
        "principals": work / "principals.toml",
        "trusted profile key": work / "keys" / "profile-signing.pub.json",
        "binding key ring": work / "keys" / "bindings-keyring.json",
        "secret values": work / "secrets" / "secret-values.txt",
        "TLS private key": work / "tls" / "server.key",
        "TLS certificate": work / "tls" / "server.pem",
    }[which]
    assert path.is_file()
    private = (path.stat().st_mode & 0o777) == 0o600
    os.chmod(path, 0o602 if private else 0o646)
    with pytest.raises(ConfigError, match="writable by others") as refused:
        load_runtime(work / "wiregate.toml")
    assert str(path) in str(refused.value)
    os.chmod(path, 0o620 if private else 0o664)  # group-writable: loads, and says so
    runtime = load_runtime(work / "wiregate.toml")
    assert any(str(path) in w and "writable by its group" in w for w in runtime.warnings)
    os.chmod(path, 0o600 if private else 0o644)
    assert not any("writable" in w for w in load_runtime(work / "wiregate.toml").warnings)


def test_rewritten_secret_files_are_owner_only_whatever_their_mode_was(
    initialised: tuple[Path, dict[str, Any]],
) -> None:
    """`init --force` and `keys rotate` write new secrets: into files of their own (0600),
    never into an old file that someone had made readable by others."""
    work, facts = initialised
    secret_files = [
        work / "dev-gateway-key",
        work / "keys" / "bindings-keyring.json",
        work / "secrets" / "mock-upstream.key",
        work / "tls" / "server.key",
        Path(facts["signing_key"]),
    ]
    for path in secret_files:
        os.chmod(path, 0o644)
    devsetup.init(work, force=True)
    for path in secret_files:
        assert (path.stat().st_mode & 0o777) == 0o600, path


def test_rotation_keeps_the_rings_group_read_and_nothing_more(tmp_path: Path) -> None:
    """A ring the gateway reads through its group (0640) stays readable that way after a
    rotation; a ring others could read does not stay so; a leftover temporary file changes
    nothing."""
    from gateway.keyring import load_keyring, rotate_keyring_file

    ring = tmp_path / "ring.json"
    devsetup.new_keyring(ring)
    os.chmod(ring, 0o640)
    (tmp_path / "ring.json.tmp").write_text("left over")
    os.chmod(tmp_path / "ring.json.tmp", 0o666)
    rotate_keyring_file(ring)
    assert (ring.stat().st_mode & 0o777) == 0o640
    os.chmod(ring, 0o666)
    rotate_keyring_file(ring)
    assert (ring.stat().st_mode & 0o777) == 0o640
    assert load_keyring(ring).active.id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ring.json", "ring.json.tmp"]  # nothing else left behind


def test_a_rotated_ring_keeps_group_read_only_for_its_own_group(tmp_path: Path) -> None:
    """Only root may give a file away: when the group cannot be kept, the rewritten file is
    owner-only rather than readable by some other group."""
    from gateway import secretfile

    ring = tmp_path / "ring.json"
    ring.write_bytes(b"old")
    os.chmod(ring, 0o640)
    secretfile.write_private(ring, b"new", keep_group=True)
    assert ring.read_bytes() == b"new" and (ring.stat().st_mode & 0o777) == 0o640  # its own group: kept
    real_fchown = os.fchown

    def refused(fd: int, uid: int, gid: int) -> None:
        raise PermissionError

    os.fchown = refused  # type: ignore[assignment]
    try:
        os.chown(ring, -1, 4242)  # a group this test's process will not be able to give the new file
        secretfile.write_private(ring, b"newer", keep_group=True)
    finally:
        os.fchown = real_fchown
    assert ring.stat().st_gid != 4242 and (ring.stat().st_mode & 0o777) == 0o600
