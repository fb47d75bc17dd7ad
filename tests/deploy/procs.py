"""Start a deployment command line as its own process, talk HTTP to it over its Unix
socket or HTTPS (verified against a CA), and stop it the way an orchestrator does."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, bytes]:
    try:
        conn.request(method, path, body=body, headers={"Host": "localhost", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def uds(path: Path, timeout: float = 10) -> http.client.HTTPConnection:
    return _UnixConnection(path, timeout)


def https(port: int, ca: Path, timeout: float = 10) -> http.client.HTTPConnection:
    return http.client.HTTPSConnection(
        "127.0.0.1", port, timeout=timeout, context=ssl.create_default_context(cafile=str(ca))
    )


class Proc:
    """A child process with its combined output in a file."""

    def __init__(self, argv: list[str], env: Mapping[str, str], log: Path, cwd: Path | None = None) -> None:
        self.argv = argv
        self.log_path = log
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def records(self) -> list[dict]:
        out = []
        for line in self.output().splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    def _alive(self) -> None:
        if self.popen.poll() is not None:
            raise AssertionError(f"{self.argv[0]} exited with {self.popen.returncode}:\n{self.output()[-4000:]}")

    def https_port(self, timeout: float = 30) -> int:
        """The port of the HTTPS listener, from the gateway's own `listening` log line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for rec in self.records():
                if rec.get("event") == "listening" and rec.get("listener") == "https":
                    return int(str(rec["address"]).rsplit(":", 1)[1])
            self._alive()
            time.sleep(0.05)
        raise AssertionError(f"no https listener logged:\n{self.output()[-4000:]}")

    def wait_status(self, connect, path: str, want: int = 200, timeout: float = 30) -> bytes:
        """Poll `path` until it answers `want` (connection errors while starting are retried)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            self._alive()
            try:
                status, body = request(connect(), "GET", path)
            except OSError as exc:
                last = exc
            else:
                if status == want:
                    return body
                last = status
            time.sleep(0.05)
        raise AssertionError(f"{path} never answered {want} (last: {last!r}):\n{self.output()[-4000:]}")

    def wait_port(self, port: int, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._alive()
            try:
                socket.create_connection(("127.0.0.1", port), 0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nothing listens on 127.0.0.1:{port}:\n{self.output()[-4000:]}")

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, as `docker stop`, the kubelet and systemd send; the exit status."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        self._log.close()


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
