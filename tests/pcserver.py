"""The real PowerContext 1.4.1 server, for differential tests and the context bench.

`ensure_venv()` keeps a separate virtualenv at `<repo>/.cache/powercontext-1.4.1/venv` with
`powercontext[server,cli]==1.4.1` (the `server` extra brings FastAPI/uvicorn and the SQLite
storage, `cli` the `powercontext server run` command). It is built once and reused: a marker
file is written only after the install and an import check succeed, and an flock serialises
concurrent builders, so a half-finished install is thrown away and redone.

`running_server()` starts `powercontext server run` on 127.0.0.1 with a free port, a fresh
temporary POWERCONTEXT_HOME (default SQLite storage, no inference provider) and static
bearer auth (ACCESS_MODE=enforced with AUTH_TOKEN, the token principal being the bootstrap
administrator), waits until /v1/capabilities answers, yields a `PowerContextServer`, and
stops it (SIGTERM, then SIGKILL).

`server_or_skip()` is the pytest wrapper: when the server cannot be installed or started the
test is skipped with the reason, or fails when WIREGATE_REQUIRE_POWERCONTEXT=1.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.deploy.procs import free_port

VERSION = "1.4.1"
REQUIREMENT = f"powercontext[server,cli]=={VERSION}"
ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / f"powercontext-{VERSION}"
VENV = CACHE / "venv"
MARKER = CACHE / "installed.ok"
LOCK = CACHE / "install.lock"
INSTALL_TIMEOUT = 900.0
START_TIMEOUT = 90.0


class PowerContextUnavailable(RuntimeError):
    """The server could not be installed or started; the message says why."""


@dataclass(frozen=True)
class PowerContextServer:
    base_url: str
    token: str
    home: Path
    log: Path
    pid: int

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


def _bin(name: str) -> Path:
    return VENV / "bin" / name


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise PowerContextUnavailable(f"{cmd[0]} timed out after {timeout:.0f} s (log: {log})") from exc
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise PowerContextUnavailable(f"{' '.join(cmd[:4])} … exited {done.returncode}: {' | '.join(tail)}")


def ensure_venv() -> Path:
    """The `powercontext` executable of the cached 1.4.1 venv, building the venv if needed."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if MARKER.is_file() and _bin("powercontext").is_file():
            return _bin("powercontext")
        MARKER.unlink(missing_ok=True)
        shutil.rmtree(VENV, ignore_errors=True)  # whatever is there is a half install
        log = CACHE / "install.log"
        log.write_text("")
        started = time.monotonic()
        _run([sys.executable, "-m", "venv", str(VENV)], log, 120)
        _run([str(_bin("python")), "-m", "pip", "install", "--quiet", REQUIREMENT], log, INSTALL_TIMEOUT)
        check = (
            f"import importlib.metadata as m, powercontext.server.cli; assert m.version('powercontext') == '{VERSION}'"
        )
        _run([str(_bin("python")), "-c", check], log, 120)
        seconds = time.monotonic() - started
        MARKER.write_text(f"{REQUIREMENT} installed in {seconds:.1f} s\n")
        return _bin("powercontext")


def _die_with_parent() -> None:
    """Runs in the server process before exec: a killed test run leaves no server behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.contextmanager
def running_server(*, start_timeout: float = START_TIMEOUT, home: Path | None = None) -> Iterator[PowerContextServer]:
    """`home`: an existing POWERCONTEXT_HOME to serve (kept afterwards); default a fresh
    temporary one, deleted after the server stops."""
    executable = ensure_venv()
    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="pc-home-")) if home is None else home
    token = secrets.token_urlsafe(24)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POWERCONTEXT", "VIRTUAL_ENV"))}
    env.update(
        POWERCONTEXT_HOME=str(home),
        POWERCONTEXT_SERVER_WORKSPACE=str(home),
        POWERCONTEXT_SERVER_ACCESS_MODE="enforced",
        POWERCONTEXT_SERVER_AUTH_TOKEN=token,
        POWERCONTEXT_SERVER_MCP_ENABLED="false",
    )
    log = home / "server.log"
    last_error = "no answer"
    for _attempt in range(3):  # the free port can be taken between probing and binding
        port = free_port()
        cmd = [str(executable), "server", "run", "--host", "127.0.0.1", "--port", str(port), "--no-env-file"]
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )
        try:
            server = PowerContextServer(f"http://127.0.0.1:{port}", token, home, log, proc.pid)
            deadline = time.monotonic() + start_timeout
            ready = False
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    r = httpx.get(server.base_url + "/v1/capabilities", headers=server.headers, timeout=2)
                    if r.status_code == 200:
                        ready = True
                        break
                    last_error = f"/v1/capabilities answered {r.status_code}"
                except httpx.HTTPError as exc:
                    last_error = type(exc).__name__
                time.sleep(0.2)
            if ready:
                try:
                    yield server
                finally:
                    _stop(proc)
                    if own_home:
                        shutil.rmtree(home, ignore_errors=True)
                return
            if proc.poll() is None:
                last_error = f"not ready after {start_timeout:.0f} s ({last_error})"
            else:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                last_error = f"exited {proc.returncode}: {' | '.join(tail)}"
                if "already in use" in log.read_text(errors="replace").lower():
                    continue
            break
        finally:
            _stop(proc)
    raise PowerContextUnavailable(f"PowerContext {VERSION} server did not start: {last_error} (log: {log})")


def required() -> bool:
    return os.environ.get("WIREGATE_REQUIRE_POWERCONTEXT") == "1"


@contextlib.contextmanager
def server_or_skip() -> Iterator[PowerContextServer]:
    """`running_server()` for pytest: skip when unavailable, fail when it is required."""
    import pytest

    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_server())
        except PowerContextUnavailable as exc:
            if required():
                pytest.fail(f"WIREGATE_REQUIRE_POWERCONTEXT=1 but {exc}")
            pytest.skip(str(exc))
        yield server
