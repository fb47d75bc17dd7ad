"""`make run` on a fresh clone gives a working first call, and every README example works
as written.

The test runs the Makefile's own `run` recipe (read from the Makefile) in an empty
directory: `wiregate init --dir .wiregate`, then `wiregate serve --config
.wiregate/wiregate.toml` as a subprocess. The only difference from a developer's
machine: init is given free ports (`--https-port`, `--mock-port`) instead of 8443 / 9901,
so that it never collides with anything else running here, and the README's `8443` is
read as that port. Then it runs, from README.md itself, the shell block with the first
curl (HTTPS and the Unix socket), the OpenAI and Anthropic SDK blocks (each over HTTPS and
over the Unix socket) and the context example, and finally stops the gateway with SIGTERM:
it exits 0 and takes the mock provider and the socket file with it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _run_recipe() -> list[str]:
    """The `run:` target's recipe lines from the Makefile, variables expanded."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = lines.index("run: $(STAMP)")
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(BIN)", str(BIN)).replace("$(WORKDIR)", ".wiregate"))
    return recipe


def _readme_block(lang: str, after: str, containing: str = "") -> str:
    """The first fenced `lang` block after the heading or text `after` (that holds `containing`)."""
    readme = (ROOT / "README.md").read_text()
    tail = readme[readme.index(after) :]
    for block in re.findall(rf"```{lang}\n(.*?)```", tail, flags=re.S):
        if containing in block:
            return str(block)
    raise AssertionError(f"no {lang} block after {after!r}")


def _unix_get(path: Path, url: str) -> tuple[int, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(path))
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@dataclass
class Served:
    dir: Path
    https_port: int
    mock_port: int
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    work = Path(tempfile.mkdtemp(prefix="wgoob", dir="/tmp"))  # short: a Unix socket path is bounded
    https_port, mock_port = free_port(), free_port()
    init_line, serve_line = _run_recipe()
    assert "wiregate init --dir .wiregate" in init_line and "wiregate serve" in serve_line
    init_line = init_line.replace(
        "init --dir .wiregate", f"init --dir .wiregate --https-port {https_port} --mock-port {mock_port}"
    )
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "SSL_CERT_FILE"):
        env.pop(name, None)
    subprocess.run(["bash", "-c", init_line], cwd=work, env=env, check=True, capture_output=True, timeout=60)
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(shlex.split(serve_line), cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    sock = work / ".wiregate" / "run" / "wiregate.sock"
    deadline = time.monotonic() + 90
    ready = False
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            ready = _unix_get(sock, "/readyz")[0] == 200
        except OSError:
            ready = False
        if ready:
            break
        time.sleep(0.2)
    facts = Served(work, https_port, mock_port, proc)
    try:
        assert ready, (work / "serve.log").read_text()[-4000:]
        yield facts
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def _as_served(text: str, facts: Served) -> str:
    return text.replace("127.0.0.1:8443", f"127.0.0.1:{facts.https_port}")


def test_readme_first_curl(served: Served) -> None:
    script = _as_served(_readme_block("sh", "## Using it", "KEY=$(cat"), served)
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.replace("curl ", "curl -sS --fail-with-body ") + "\necho"],
        cwd=served.dir,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    docs = [json.loads(line) for line in re.sub(r"\}\{", "}\n{", out.stdout).splitlines() if line.strip()]
    assert docs[0] == {"status": "ok"} and docs[1] == {"status": "ok"}
    assert docs[2]["object"] == "chat.completion" and docs[2]["choices"][0]["message"]["content"]
    assert docs[3]["type"] == "message" and docs[3]["content"][0]["text"]


@pytest.mark.parametrize("heading", ["### OpenAI SDK", "### Anthropic SDK"])
def test_readme_sdk_examples(served: Served, heading: str) -> None:
    code = _as_served(_readme_block("python", heading), served)
    assert code.count("base_url=") == 2 and "uds=" in code  # HTTPS and the Unix socket
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=served.dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    if heading == "### OpenAI SDK":
        assert out.stdout.count("ChatCompletion(") == 2
        listed = [line for line in out.stdout.splitlines() if line.startswith("[")]
        assert listed and "'mock-gpt-1'" in listed[0]  # the model list names the mock models
    else:
        assert out.stdout.count("Message(") == 2 and "input_tokens=" in out.stdout


def test_readme_context_example_runs_against_make_run(served: Served) -> None:
    """The README's `.venv/bin/python examples/context_replay.py` (its defaults are the
    `make run` directory's socket, key and mock model)."""
    command = _readme_block("sh", "A runnable host turn", "examples/context_replay.py").strip()
    assert command == ".venv/bin/python examples/context_replay.py"
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "context_replay.py")],
        cwd=served.dir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "replay verified" in out.stdout and "prepared_context_stale" in out.stdout


def test_readme_names_the_switch_to_a_real_provider() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### Switching to a real provider") :]
    assert "OPENAI_API_KEY=" in section and "ANTHROPIC_API_KEY=" in section and "profiles new" in section


def test_sigterm_stops_gateway_and_mock_provider(served: Served) -> None:
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(30) == 0
    assert not (served.dir / ".wiregate" / "run" / "wiregate.sock").exists()
    for port in (served.https_port, served.mock_port):
        with socket.socket() as probe, pytest.raises(ConnectionRefusedError):
            probe.settimeout(2)
            probe.connect(("127.0.0.1", port))
