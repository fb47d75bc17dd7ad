"""The refusal to load when the private half of a trusted profile-signing key lies inside the
served configuration directory holds whatever else the tree holds: the walk looks at keys/
and secrets/ first, does not spend its bound on .git (or .hg, .svn), and when the bound runs
out before the tree does the load is refused, naming the bound, never passed silently (a
.git or data/ of more than 5000 files used to push keys/ and secrets/ out of a sorted
5000-path window, and the key inside was no longer found)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from gateway import devsetup
from gateway.config import load
from gateway.config.load import ConfigError, load_runtime, refuse_signing_keys_inside

BOUND = 5000
KEY_INSIDE = "private key of trusted profile-signing key"


@pytest.fixture
def initialised(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    work = tmp_path / "served"
    return work, devsetup.init(work)


def _fill(directory: Path, count: int, name: str = "f") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (directory / f"{name}{i:05d}").write_bytes(b"x")


def _entries(root: Path) -> int:
    """Entries the scan looks at: every file and directory under `root`, .git's contents aside."""
    total = 0
    for _, dirs, files in os.walk(root):
        total += len(dirs) + len(files)
        dirs[:] = [d for d in dirs if d not in {".git", ".hg", ".svn"}]
    return total


def test_the_bound_is_the_documented_one() -> None:
    assert load._KEY_SCAN_MAX_ENTRIES == BOUND


@pytest.mark.parametrize("bulk", [".git/objects", "data"])
def test_a_key_in_secrets_is_refused_behind_a_large_tree(initialised: tuple[Path, dict[str, Any]], bulk: str) -> None:
    work, facts = initialised
    shutil.copy(facts["signing_key"], work / "secrets" / "oops.pem")
    _fill(work / bulk, BOUND + 1)
    with pytest.raises(ConfigError, match=KEY_INSIDE) as refused:
        load_runtime(work / "wiregate.toml")
    assert "oops.pem" in str(refused.value)


def test_a_key_in_keys_is_refused_behind_a_large_git_directory(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, facts = initialised
    shutil.copy(facts["signing_key"], work / "keys" / "profile-signing.key")
    _fill(work / ".git" / "objects" / "ab", BOUND + 1)
    with pytest.raises(ConfigError, match=KEY_INSIDE):
        load_runtime(work / "wiregate.toml")


def test_a_key_elsewhere_behind_a_tree_larger_than_the_bound_is_refused(
    initialised: tuple[Path, dict[str, Any]],
) -> None:
    """Wherever the walk meets it first, the key or the bound, the load is refused."""
    work, facts = initialised
    (work / "notes").mkdir()
    shutil.copy(facts["signing_key"], work / "notes" / "zz.pem")
    _fill(work / "data", BOUND + 1)
    with pytest.raises(ConfigError, match=f"{KEY_INSIDE}|more than {BOUND}"):
        load_runtime(work / "wiregate.toml")


def test_a_tree_larger_than_the_bound_without_a_key_is_refused_naming_the_bound(
    initialised: tuple[Path, dict[str, Any]],
) -> None:
    """Fail closed: the scan cannot vouch for a tree it did not finish, so the load is refused
    with a message naming the bound and the way out, and no file's name or content."""
    work, _ = initialised
    _fill(work / "data", BOUND + 1, name="customer-record-")
    with pytest.raises(ConfigError) as refused:
        load_runtime(work / "wiregate.toml")
    message = str(refused.value)
    assert f"more than {BOUND}" in message and "Move what the gateway does not need" in message, message
    assert "customer-record" not in message and KEY_INSIDE not in message, message


def test_exactly_the_bound_loads_and_one_more_entry_is_refused(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, _ = initialised
    (work / "data").mkdir()
    _fill(work / "data", BOUND - _entries(work))
    assert _entries(work) == BOUND
    assert load_runtime(work / "wiregate.toml").profiles
    (work / "data" / "one-more").write_bytes(b"x")
    with pytest.raises(ConfigError, match=f"more than {BOUND}"):
        load_runtime(work / "wiregate.toml")


def test_a_large_git_directory_without_a_key_loads(initialised: tuple[Path, dict[str, Any]]) -> None:
    """A configuration kept in a checkout still loads: version-control metadata is not walked
    (its objects are compressed; a scan for PEM text cannot see a key in them anyway)."""
    work, _ = initialised
    _fill(work / ".git" / "objects" / "ab", BOUND + 1)
    _fill(work / ".hg" / "store", 10)
    assert load_runtime(work / "wiregate.toml").profiles


def test_the_paths_the_configuration_names_are_looked_at_first(initialised: tuple[Path, dict[str, Any]]) -> None:
    work, facts = initialised
    trusted = load.load_trusted_keys(("keys/profile-signing.pub.json",), work)
    (work / "conf-keys").mkdir()
    shutil.copy(facts["signing_key"], work / "conf-keys" / "signing.pem")
    _fill(work / "data", BOUND + 1)
    with pytest.raises(ConfigError, match=KEY_INSIDE):
        refuse_signing_keys_inside(work, trusted, named=[work / "conf-keys" / "ring.json"])
