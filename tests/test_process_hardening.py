"""`wiregate serve` allows itself no core dump: one would hold the key ring, the upstream
credentials and every body in flight, and the host's default (or a debugging shell's
`ulimit -c unlimited`) must not decide that. Workers it starts inherit the limit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from gateway.mockprovider import MockProviderServer
from tests.deploy import procs
from tests.harness import build_env

WIREGATE = Path(sys.executable).with_name("wiregate")


def _core_limit(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max core file size"):
            soft, hard = line.split()[4:6]
            return soft, hard
    raise AssertionError("no core limit in /proc/<pid>/limits")


def _allow_cores() -> None:
    """In the child, before exec: the most a process may allow itself (as `ulimit -c unlimited`)."""
    _, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))


def test_serve_turns_core_dumps_off(mock: MockProviderServer, tmp_path: Path) -> None:
    env = build_env(tmp_path / "gw", mock.url)
    proc = procs.Proc([str(WIREGATE), "serve", "--config", str(env.config)], dict(os.environ), tmp_path / "gw.log")
    try:
        proc.wait_status(lambda: procs.uds(env.dir / "run" / "gw.sock"), "/readyz")
        assert _core_limit(proc.pid) == ("0", "0")
        assert proc.terminate() == 0
    finally:
        proc.close()


def test_the_limit_is_the_gateways_own_not_inherited(tmp_path: Path) -> None:
    """Started from a shell that allows cores, the process still has none (checked here on
    a plain child first, so the test shows the limit would otherwise be open)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], preexec_fn=_allow_cores)
    try:
        assert _core_limit(child.pid)[0] != "0"
    finally:
        child.kill()
        child.wait()
    code = "from gateway import cli\ncli._no_core_dumps()\nimport time\nprint('ready', flush=True)\ntime.sleep(30)\n"
    gw = subprocess.Popen([sys.executable, "-c", code], preexec_fn=_allow_cores, stdout=subprocess.PIPE, text=True)
    try:
        assert gw.stdout is not None and gw.stdout.readline().strip() == "ready"
        assert _core_limit(gw.pid) == ("0", "0")
    finally:
        gw.kill()
        gw.wait()
