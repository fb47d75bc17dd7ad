"""Configuration the gateway must refuse before it serves anything.

Binding lifetimes the send binding's own coherence check would reject (a send binding that
outlives its correlation window is refused by its opener as never ours, so every call would
be withheld after the billed upstream call), and files that decide enforcement which another
user could rewrite or replace: the custom format rules at o+w, a file another non-root user
owns, or one in a directory others may write without the sticky bit."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import devsetup
from gateway.config.load import ConfigError, load_runtime, read_secret_values
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread

NOBODY = 65534
# Distinctive values: the refusal names the fields, never echoes what was configured.
BAD_TTLS = "[bindings]\nsend_valid_s = 1234.5\ncorrelate_s = 987.25\n"
EQUAL_TTLS = "[bindings]\nsend_valid_s = 600\ncorrelate_s = 600\n"

RULES = {
    "version": "corp-1",
    "rules": [
        {
            "id": "corp-token",
            "description": "internal token",
            "keywords": ["corp_"],
            "pattern": "corp_[A-Za-z0-9]{24}",
            "secret_group": 0,
            "min_entropy": 2.5,
            "allow": [],
            "left": "word",
            "right": "word",
            "advisory": False,
        }
    ],
}


@pytest.fixture
def work(tmp_path: Path) -> Path:
    served = tmp_path / "served"
    devsetup.init(served)
    return served


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: giving a file to another uid (chown) is root's alone")


# --- 4: binding lifetimes -------------------------------------------------------------------


def _assert_names_the_ttl_fields(message: str) -> None:
    assert "bindings.send_valid_s" in message and "bindings.correlate_s" in message, message
    assert "1234.5" not in message and "987.25" not in message, message


def test_a_send_binding_outliving_its_correlation_window_refuses_the_load(make_env: Any) -> None:
    env = make_env(config_extra=BAD_TTLS)
    with pytest.raises(ConfigError) as refused:
        load_runtime(env.config)
    _assert_names_the_ttl_fields(str(refused.value))


def test_equal_send_and_correlation_windows_load(make_env: Any) -> None:
    env = make_env(config_extra=EQUAL_TTLS)
    bindings = load_runtime(env.config).config.bindings
    assert bindings.send_valid_s == bindings.correlate_s == 600


@pytest.fixture
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("config-guards") as started:
        yield started


def test_a_reload_refuses_a_send_binding_outliving_its_correlation_window(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    assert gateway.running is not None
    config = env.config
    original = config.read_bytes()
    generation = gateway.running.holder.current.generation
    try:
        config.write_bytes(original + b"\n" + BAD_TTLS.encode())
        with pytest.raises(ConfigError) as refused:
            load_runtime(config)
        _assert_names_the_ttl_fields(str(refused.value))
        assert gateway.reload() is False
        assert gateway.running.holder.current.generation == generation  # the running one kept
        config.write_bytes(original + b"\n" + EQUAL_TTLS.encode())
        assert gateway.reload() is True
        assert gateway.running.holder.current.config.bindings.send_valid_s == 600
    finally:
        config.write_bytes(original)
    assert gateway.reload()


# --- 5: the custom format rules file --------------------------------------------------------


def _with_custom_rules(work: Path) -> Path:
    custom = work / "corp-rules.json"
    custom.write_text(json.dumps(RULES))
    policy = work / "policy.toml"
    text = policy.read_text()
    assert "[formats]" not in text
    policy.write_text(text + '\n[formats]\ncustom_file = "corp-rules.json"\n')
    return custom


def test_a_custom_rules_file_others_can_write_refuses_the_load(work: Path) -> None:
    custom = _with_custom_rules(work)
    os.chmod(custom, 0o646)
    with pytest.raises(ConfigError, match="writable by others") as refused:
        load_runtime(work / "wiregate.toml")
    assert "custom format rules" in str(refused.value) and str(custom) in str(refused.value)
    os.chmod(custom, 0o664)  # group-writable: loads, and says so, as for the policy
    runtime = load_runtime(work / "wiregate.toml")
    assert any(str(custom) in w and "writable by its group" in w for w in runtime.warnings)
    os.chmod(custom, 0o600)
    assert not any("writable" in w for w in load_runtime(work / "wiregate.toml").warnings)


# --- 6a: a file another user owns -----------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "what"),
    [
        ("policy.toml", "policy"),
        ("principals.toml", "principals"),
        ("wiregate.toml", "configuration"),
        ("secrets/secret-values.txt", "policy secret_values"),
    ],
)
def test_a_file_another_user_owns_refuses_the_load(work: Path, which: str, what: str) -> None:
    _as_root()
    path = work / which
    mode = path.stat().st_mode & 0o777
    assert not mode & 0o022  # the mode rule alone would pass it
    os.chown(path, NOBODY, NOBODY)  # its owner may rewrite it whatever its mode
    with pytest.raises(ConfigError, match="writable by others") as refused:
        load_runtime(work / "wiregate.toml")
    message = str(refused.value)
    assert message.startswith(f"{what}: {path} ") and f"uid {NOBODY}" in message, message
    os.chown(path, 0, 0)
    load_runtime(work / "wiregate.toml")


def test_a_directory_another_user_owns_refuses_the_load(work: Path) -> None:
    _as_root()
    os.chown(work / "secrets", NOBODY, NOBODY)  # 0755, but its owner may replace what is in it
    with pytest.raises(ConfigError, match="writable by others") as refused:
        load_runtime(work / "wiregate.toml")
    assert f"{work / 'secrets'} is owned by uid {NOBODY}" in str(refused.value)
    os.chown(work / "secrets", 0, 0)
    load_runtime(work / "wiregate.toml")


# --- 6b: a directory others may write -------------------------------------------------------


def test_a_config_directory_others_may_write_refuses_the_load(work: Path) -> None:
    os.chmod(work, 0o777)  # others may unlink policy.toml and put their own there
    with pytest.raises(ConfigError, match="writable by others") as refused:
        load_runtime(work / "wiregate.toml")
    assert f"its directory {work} is writable by others without the sticky bit" in str(refused.value)
    os.chmod(work, 0o1777)  # sticky: only a file's owner may replace it
    runtime = load_runtime(work / "wiregate.toml")
    assert not any(str(work) + " " in w or "directory" in w for w in runtime.warnings), runtime.warnings
    os.chmod(work, 0o775)  # group-writable without the sticky bit: loads, and says so
    runtime = load_runtime(work / "wiregate.toml")
    assert any(f"{work} is writable by its group without the sticky bit" in w for w in runtime.warnings)
    os.chmod(work, 0o755)
    assert not any("writable" in w for w in load_runtime(work / "wiregate.toml").warnings)


def test_a_subdirectory_others_may_write_refuses_the_load(work: Path) -> None:
    secrets_dir = work / "secrets"
    os.chmod(secrets_dir, 0o777)
    with pytest.raises(ConfigError, match=f"its directory {secrets_dir} is writable by others"):
        load_runtime(work / "wiregate.toml")
    os.chmod(secrets_dir, 0o700)
    load_runtime(work / "wiregate.toml")


def test_the_directory_walk_stops_at_the_configuration_directory(work: Path) -> None:
    """Above the configuration directory only the directory a file itself is in counts (the
    test suite's own temporary directories sit under a world-writable /tmp)."""
    above = work.parent
    os.chmod(above, 0o777)
    try:
        runtime = load_runtime(work / "wiregate.toml")
        assert not any("writable" in w for w in runtime.warnings)
    finally:
        os.chmod(above, 0o700)


def test_a_file_outside_the_configuration_directory_is_judged_by_its_own_directory(work: Path) -> None:
    outside = work.parent / "shared"
    outside.mkdir()
    custom = _with_custom_rules(work)
    moved = outside / custom.name
    custom.rename(moved)
    policy = work / "policy.toml"
    policy.write_text(policy.read_text().replace('"corp-rules.json"', json.dumps(str(moved))))
    os.chmod(moved, 0o644)
    load_runtime(work / "wiregate.toml")
    os.chmod(outside, 0o777)
    with pytest.raises(ConfigError, match=f"its directory {outside} is writable by others"):
        load_runtime(work / "wiregate.toml")


def test_a_symlinked_file_is_judged_where_it_really_is(work: Path) -> None:
    """Kubernetes mounts Secret files as symlinks: both the link's directories and the
    target's directory count."""
    real_dir = work.parent / "real"
    real_dir.mkdir()
    values = work / "secrets" / "secret-values.txt"
    target = real_dir / values.name
    values.rename(target)
    values.symlink_to(target)
    load_runtime(work / "wiregate.toml")
    os.chmod(real_dir, 0o777)
    with pytest.raises(ConfigError, match=f"its directory {real_dir} is writable by others"):
        load_runtime(work / "wiregate.toml")


def test_a_directory_on_a_read_only_mount_is_not_judged(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Kubernetes ConfigMap volume's directory is world-writable by its mode, but mounted
    read-only no one can replace what is in it."""
    os.chmod(work, 0o777)
    with pytest.raises(ConfigError, match="writable by others"):
        load_runtime(work / "wiregate.toml")
    real_statvfs = os.statvfs

    class ReadOnly:
        def __init__(self, result: os.statvfs_result) -> None:
            self._result = result
            self.f_flag = result.f_flag | os.ST_RDONLY

        def __getattr__(self, name: str) -> Any:
            return getattr(self._result, name)

    monkeypatch.setattr(os, "statvfs", lambda p: ReadOnly(real_statvfs(p)))
    load_runtime(work / "wiregate.toml")


# --- secret values: matched exactly as written -----------------------------------------------

VALUE = "sk-guards-Platypus-77413"


@pytest.mark.parametrize("line", [VALUE + " ", VALUE + "\t", " " + VALUE, VALUE + "\u00a0"])
def test_a_secret_value_line_with_whitespace_at_an_end_refuses_the_load(tmp_path: Path, line: str) -> None:
    """Loaded as written, the value would never match the real one: a secret nothing
    blocks. The refusal names the file and the line, never the value."""
    (tmp_path / "values.txt").write_text(f"another-value-5532\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        read_secret_values(("file:values.txt",), tmp_path, 8)
    message = str(refused.value)
    assert "values.txt line 2" in message and "whitespace" in message
    assert VALUE not in message and "another-value" not in message


def test_a_byte_order_mark_is_not_part_of_the_first_secret_value(tmp_path: Path) -> None:
    (tmp_path / "values.txt").write_bytes(b"\xef\xbb\xbf" + f"{VALUE}\r\nanother-value-5532\r\n".encode())
    values = read_secret_values(("file:values.txt",), tmp_path, 8)
    assert [v.value for v in values] == [VALUE, "another-value-5532"]
