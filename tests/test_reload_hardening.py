"""Reloads an operator can trip over: a certificate replaced before its key (the live TLS
context took the new certificate, found the old key did not match, and every handshake
failed while the log said the reload succeeded); a file no loader foresaw (a non-UTF-8
policy) is a counted, logged refusal; reloads asked close together run one at a time; and
a SIGHUP or SIGTERM that arrives while the process starts is kept, never fatal."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.config.load import ConfigError, load_runtime
from gateway.listeners import generate_dev_tls
from gateway.state import ATTRIBUTION, METRICS
from tests.conftest import GatewayFactory, LogCapture
from tests.deploy.procs import free_port
from tests.harness import Env, GatewayThread, build_env, mock_profile


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("reload-hardening") as started:
        yield started


def _handshake(gateway: GatewayThread, ca: Path) -> bool:
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                return True
    except (ssl.SSLError, OSError):
        return False


def test_a_certificate_without_its_key_leaves_the_old_pair_serving(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture, tmp_path: Path
) -> None:
    env, gateway = gw
    tls = env.dir / "tls"
    old_ca = tmp_path / "old-ca.pem"
    shutil.copy(tls / "ca.pem", old_ca)
    new_ca, new_cert, new_key = generate_dev_tls(tmp_path / "new")
    saved = {name: (tls / name).read_bytes() for name in ("server.pem", "server.key")}
    try:
        shutil.copy(new_cert, tls / "server.pem")  # the certificate first, as a rotation writes it
        mark = captured_logs.mark()
        assert gateway.reload()
        assert '"event":"tls_reload_failed"' in captured_logs.since(mark)
        assert _handshake(gateway, old_ca) and not _handshake(gateway, new_ca)
        shutil.copy(new_key, tls / "server.key")  # then its key: the next reload takes the pair
        assert gateway.reload()
        assert _handshake(gateway, new_ca) and not _handshake(gateway, old_ca)
    finally:
        for name, data in saved.items():
            (tls / name).write_bytes(data)
        assert gateway.reload()
        assert _handshake(gateway, old_ca)


def test_an_unreadable_policy_is_a_counted_refusal(gw: tuple[Env, GatewayThread], captured_logs: LogCapture) -> None:
    env, gateway = gw
    policy = env.dir / "policy.toml"
    original = policy.read_bytes()
    assert gateway.running is not None
    failed = gateway.running.app[METRICS].reloads.labels("failed")
    before = failed._value.get()
    generation = gateway.running.holder.current.generation
    try:
        policy.write_bytes(original + b"\n# \xff\xfe not UTF-8\n")
        mark = captured_logs.mark()
        assert gateway.reload() is False
        assert '"event":"config_reload_failed"' in captured_logs.since(mark)
        assert failed._value.get() == before + 1
        assert gateway.running.holder.current.generation == generation  # the running one kept
    finally:
        policy.write_bytes(original)
    assert gateway.reload()


def test_reloads_asked_together_run_one_after_another(gw: tuple[Env, GatewayThread]) -> None:
    _, gateway = gw
    running = gateway.running
    assert running is not None
    before = running.holder.current.generation

    async def both() -> list[bool]:
        return list(await asyncio.gather(running.reload(), running.reload(), running.reload()))

    assert gateway.call(both()) == [True, True, True]
    assert running.holder.current.generation == before + 3  # none computed from a stale current


@pytest.fixture
def initialised(tmp_path: Path) -> tuple[Path, Path]:
    work = tmp_path / "wg"
    made = subprocess.run(
        [sys.executable, "-m", "gateway", "init", "--dir", str(work)], capture_output=True, text=True, timeout=60
    )
    assert made.returncode == 0, made.stderr
    config = work / "wiregate.toml"
    config.write_text(config.read_text().replace("port = 8443", f"port = {free_port()}"))
    return config, work / "run" / "wiregate.sock"


def _serve(config: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = config.parent / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    return proc, log


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)


def test_a_sighup_while_starting_is_a_reload_once_serving(initialised: tuple[Path, Path]) -> None:
    config, sock = initialised
    proc, log = _serve(config)
    try:
        time.sleep(0.6)  # interpreter up, still loading
        assert proc.poll() is None
        proc.send_signal(signal.SIGHUP)
        _wait_for(sock, proc)
        assert proc.poll() is None and sock.exists()
        deadline = time.monotonic() + 30
        while '"event":"config_reloaded"' not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.05)
        assert '"event":"config_reloaded"' in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_sigterm_while_starting_stops_gracefully(initialised: tuple[Path, Path]) -> None:
    config, sock = initialised
    proc, log = _serve(config)
    time.sleep(0.6)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not sock.exists()
    assert '"event":"stopping"' in log.read_text()


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("policy.toml", b'version = "x"\n# \xff\n'),
        ("principals.toml", b"a = " + b"[" * 2000 + b"]" * 2000 + b"\n"),
        ("keys/bindings-keyring.json", b"[" * 100_000 + b"]" * 100_000),
    ],
)
def test_a_file_no_loader_foresaw_is_a_clear_config_error(tmp_path: Path, name: str, data: bytes) -> None:
    env = build_env(
        tmp_path / "config", "http://127.0.0.1:9", profiles=[mock_profile("p", "openai", "http://127.0.0.1:9")]
    )
    (env.dir / name).write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        load_runtime(env.config)
    assert name.split("/")[-1] in str(caught.value)


def test_serve_refuses_a_non_utf8_config_without_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "wiregate.toml"
    config.write_bytes(b"[server]\n# \xff\xfe\n")
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "not UTF-8" in done.stderr and "Traceback" not in done.stderr


def test_the_attribution_cli_never_prints_the_key(tmp_path: Path) -> None:
    secret = "wg-THISISTHESECRETKEY"
    for key in (secret + "\n", secret + "\r", "bad key\u00e9" + secret):
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "attribution", "report", "--uds", str(tmp_path / "none.sock")],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "WIREGATE_KEY": key},
        )
        assert done.returncode != 0
        assert secret not in done.stdout + done.stderr, done.stderr


def test_attribution_bounds_follow_a_reload(gw: tuple[Env, GatewayThread]) -> None:
    """`[attribution] retention_days` and `max_records` apply on reload, not only at start
    (an operator who shortens the retention has it at once)."""
    env, gateway = gw
    assert gateway.running is not None
    ledger = gateway.running.app[ATTRIBUTION]
    original = env.config.read_text()
    assert "[attribution]" not in original and ledger.retention_s == 7 * 86400
    try:
        env.config.write_text(original + "\n[attribution]\nretention_days = 1\nmax_records = 500\n")
        assert gateway.reload()
        assert (ledger.retention_s, ledger.max_records) == (86400, 500)
    finally:
        env.config.write_text(original)
    assert gateway.reload()
    assert (ledger.retention_s, ledger.max_records) == (7 * 86400, 100_000)
