"""`wiregate init` without --force writes over nothing: if any file it would write exists —
the profile-signing private key in the sibling <dir>-signing/, the binding key ring,
principals.toml, ... — it exits non-zero with a clear message and writes nothing (it used to
check wiregate.toml alone, and silently replaced the signing key and the key ring when only
the configuration had been moved away). Files are created exclusively, so one that appears
while init runs is not replaced either. --force still regenerates everything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import devsetup
from gateway.cli import main
from gateway.config.load import load_runtime
from gateway.listeners import generate_dev_tls


def _wiregate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every path under `root`: a file's bytes and mode, or None for a directory."""
    return {
        str(path.relative_to(root)): None if path.is_dir() else (path.read_bytes(), path.stat().st_mode)
        for path in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[bytes, int] | None]]:
    """What a fresh `wiregate init` writes (the served directory and its -signing sibling)."""
    root = tmp_path_factory.mktemp("fresh")
    made = _wiregate("init", "--dir", str(root / "served"))
    assert made.returncode == 0, made.stderr
    return root, _snapshot(root)


def test_without_force_an_existing_signing_key_ring_and_principals_survive(tmp_path: Path) -> None:
    work = tmp_path / "served"
    assert _wiregate("init", "--dir", str(work)).returncode == 0
    (work / "wiregate.toml").unlink()  # the configuration moved away, say
    before = _snapshot(tmp_path)
    again = _wiregate("init", "--dir", str(work))
    assert again.returncode != 0
    assert "already exist" in again.stderr and "--force" in again.stderr, again.stderr
    assert "Traceback" not in again.stderr and "gateway key" not in again.stdout
    assert _snapshot(tmp_path) == before  # nothing written, nothing changed
    assert not (work / "wiregate.toml").exists()


def test_force_still_regenerates_everything(tmp_path: Path) -> None:
    work = tmp_path / "served"
    assert _wiregate("init", "--dir", str(work)).returncode == 0
    secrets_ = [
        tmp_path / "served-signing" / "profile-signing.key",
        work / "keys" / "bindings-keyring.json",
        work / "principals.toml",
        work / "dev-gateway-key",
    ]
    before = {path: path.read_bytes() for path in secrets_}
    forced = _wiregate("init", "--dir", str(work), "--force")
    assert forced.returncode == 0, forced.stderr
    for path in secrets_:
        assert path.read_bytes() != before[path], path
        assert (path.stat().st_mode & 0o777) == 0o600, path
    assert load_runtime(work / "wiregate.toml").profiles


def test_every_file_init_writes_stops_it_alone(
    tmp_path: Path, fresh: tuple[Path, dict[str, tuple[bytes, int] | None]], capsys: pytest.CaptureFixture[str]
) -> None:
    """For each file a fresh init writes: with only that file in place, init refuses and
    nothing is created or changed (the guard covers every file, not just wiregate.toml)."""
    _, written = fresh
    files = [name for name, content in written.items() if content is not None]
    assert len(files) >= 15 and "served-signing/profile-signing.key" in files
    for i, name in enumerate(files):
        root = tmp_path / f"case{i}"
        existing = root / name
        existing.parent.mkdir(parents=True)
        existing.write_bytes(b"already here\n")
        before = _snapshot(root)
        assert main(["init", "--dir", str(root / "served")]) != 0, name
        assert _snapshot(root) == before, name
        assert name in capsys.readouterr().err.replace(str(root) + os.sep, "")


def test_a_dangling_link_where_the_signing_key_goes_is_not_followed(tmp_path: Path) -> None:
    work = tmp_path / "served"
    link = tmp_path / "served-signing" / "profile-signing.key"
    link.parent.mkdir()
    link.symlink_to(tmp_path / "elsewhere.key")
    assert main(["init", "--dir", str(work)]) != 0
    assert link.is_symlink() and not (tmp_path / "elsewhere.key").exists()
    assert not work.exists()


def test_a_file_that_appears_while_init_runs_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check before writing is not the only guard: each file is created exclusively, and
    a run that meets one already there removes what it had created and stops."""
    work = tmp_path / "served"
    principals = work / "principals.toml"

    def someone_else_writes_principals(directory: Path) -> tuple[Path, Path, Path]:
        principals.write_bytes(b"# someone else's principals\n")
        return generate_dev_tls(directory)

    monkeypatch.setattr(devsetup, "generate_dev_tls", someone_else_writes_principals)
    with pytest.raises(FileExistsError, match="appeared while init was writing"):
        devsetup.init(work)
    assert principals.read_bytes() == b"# someone else's principals\n"
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert left == ["served/principals.toml"], left  # the run's own files removed, no TLS leftovers


def test_init_files_lists_what_init_writes(fresh: tuple[Path, dict[str, tuple[bytes, int] | None]]) -> None:
    root, written = fresh
    files = {name for name, content in written.items() if content is not None}
    listed = {str(path.relative_to(root)) for path in devsetup.init_files((root / "served").resolve())}
    assert listed == files
