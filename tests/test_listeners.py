"""Listeners and the real `wiregate init` + `wiregate serve` processes."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.listeners import ListenerError, prepare_socket_path, set_socket_mode
from tests.deploy.procs import free_port


def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # bound, nobody listening: stale
    prepare_socket_path(path)
    assert not path.exists()


def test_live_socket_and_other_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "live.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen(1)
    try:
        with pytest.raises(ListenerError, match="already listening"):
            prepare_socket_path(path)
    finally:
        sock.close()
    regular = tmp_path / "file.sock"
    regular.write_text("precious")
    with pytest.raises(ListenerError, match="not a socket"):
        prepare_socket_path(regular)
    assert regular.read_text() == "precious"


@pytest.mark.parametrize("o_path", [True, False], ids=["linux", "without-o_path"])
def test_socket_mode_is_set_on_the_socket_never_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, o_path: bool
) -> None:
    """The socket's mode is set on what is at the path without following a link: a socket
    swapped for a symlink to a file between bind and chmod leaves the file alone (on Linux
    through an O_PATH descriptor; elsewhere after an lstat)."""
    if not o_path:
        monkeypatch.delattr(os, "O_PATH", raising=False)
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    old = os.umask(0)
    try:
        sock.bind(str(path))  # 0777 under umask 0
    finally:
        os.umask(old)
    try:
        set_socket_mode(path, 0o660)
        assert stat.S_IMODE(path.lstat().st_mode) == 0o660
        victim = tmp_path / "victim"
        victim.write_text("precious")
        victim.chmod(0o600)
        path.unlink()
        path.symlink_to(victim)
        with pytest.raises(ListenerError, match="no longer the socket"):
            set_socket_mode(path, 0o666)
        assert stat.S_IMODE(victim.stat().st_mode) == 0o600
        path.unlink()
        with pytest.raises(ListenerError, match="cannot be opened"):
            set_socket_mode(path, 0o660)
    finally:
        sock.close()


def test_socket_mode(make_env: Any, gateway_for: Any) -> None:
    env = make_env()
    gateway = gateway_for(env)
    assert stat.S_IMODE(gateway.uds.stat().st_mode) == 0o660


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self._path)


def _get(conn: http.client.HTTPConnection, path: str, key: str | None = None) -> tuple[int, str]:
    conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
    r = conn.getresponse()
    return r.status, r.read().decode()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`wiregate init` then `wiregate serve` as real processes (what `make run` does)."""
    work = tmp_path / "wg"
    init = subprocess.run(
        [sys.executable, "-m", "gateway", "init", "--dir", str(work)], capture_output=True, text=True, timeout=60
    )
    assert init.returncode == 0, init.stderr
    key = (work / "dev-gateway-key").read_text().strip()
    assert key in init.stdout  # printed once at creation
    port = free_port()
    cfg = work / "wiregate.toml"
    cfg.write_text(cfg.read_text().replace("port = 8443", f"port = {port}"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sock = work / "run" / "wiregate.sock"
    deadline = time.monotonic() + 20
    while not sock.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert sock.exists(), proc.stderr.read() if proc.poll() is not None else "no socket"
    try:
        yield {"work": work, "port": port, "key": key, "proc": proc, "sock": sock}
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def test_make_run_serves_https_and_uds(served: dict[str, Any]) -> None:
    ctx = ssl.create_default_context(cafile=str(served["work"] / "tls" / "ca.pem"))
    https = http.client.HTTPSConnection("127.0.0.1", served["port"], context=ctx, timeout=5)
    assert _get(https, "/healthz") == (200, json.dumps({"status": "ok"}))
    uds = _UnixHTTPConnection(str(served["sock"]))
    assert _get(uds, "/healthz")[0] == 200
    status, body = _get(uds, "/v1/capabilities", served["key"])
    assert status == 200 and json.loads(body)["inspection_engine"] == "hyperscan"
    assert _get(_UnixHTTPConnection(str(served["sock"])), "/v1/capabilities")[0] == 401  # a socket is not a credential


def test_sighup_reloads_and_sigterm_stops_cleanly(served: dict[str, Any]) -> None:
    work = served["work"]
    added = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "principals",
            "add",
            "--id",
            "late",
            "--profiles",
            "mock-openai",
            "--config",
            str(work / "wiregate.toml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    new_key = added.stdout.strip().splitlines()[-1].split()[-1]
    assert _get(_UnixHTTPConnection(str(served["sock"])), "/v1/models", new_key)[0] == 401
    served["proc"].send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if _get(_UnixHTTPConnection(str(served["sock"])), "/v1/models", new_key)[0] == 200:
            break
        time.sleep(0.05)
    else:
        pytest.fail("SIGHUP did not reload principals")
    served["proc"].send_signal(signal.SIGTERM)
    assert served["proc"].wait(15) == 0
    assert not served["sock"].exists()
    logs = served["proc"].stderr.read()
    assert '"event":"config_reloaded"' in logs
    assert served["key"] not in logs and new_key not in logs


def test_serve_refuses_bad_config_with_a_clear_message(tmp_path: Path) -> None:
    work = tmp_path / "wg"
    subprocess.run(
        [sys.executable, "-m", "gateway", "init", "--dir", str(work)], capture_output=True, timeout=60, check=True
    )
    profile = work / "profiles" / "openai.json"
    profile.write_text(profile.read_text().replace("gpt-*", "gpx-*"))
    out = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(work / "wiregate.toml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "openai.json" in out.stderr and "does not match" in out.stderr
    assert not (work / "run" / "wiregate.sock").exists()
