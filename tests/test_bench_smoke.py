"""The benchmarks still run: `make bench`'s quick mode (every benchmark of bench/run_all.py,
each against a real gateway and the bundled mock where it needs one), the in-process context
store benchmark on both backends, the floor benchmark and the workers benchmark. Their figures are never
asserted (these machines are noisy); what is asserted is that each one ran to the end and
printed its results — a benchmark broken by a change elsewhere fails here, not months later
when someone needs its figures."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.context.conftest import require_pg

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str, timeout: float) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def test_every_benchmark_of_make_bench_runs() -> None:
    out = _run("bench/run_all.py", "--quick", timeout=900)
    for title in (
        "wiregate wire benchmark",
        "wiregate inspection benchmark",
        "wiregate 30-turn replay",
        "loop bench:",
        "end-to-end (gateway CPU per call",
        "wiregate stream benchmark",
    ):
        assert title in out, title
    assert out.count(" (record ") >= 2  # the gateway's own count of collection, by part, per body
    assert "native encoded-run finder: full decision" in out  # the native/reference comparison ran
    assert out.count("Hyperscan alone over one decision's passes") >= 2  # the matcher's ceiling per size
    assert out.count("Targets (informational") >= 2


@pytest.mark.parametrize(("backends", "corpus"), [("sqlite", "pc45"), ("sqlite", "zipf"), ("postgres", "pc45")])
def test_context_store_benchmark_runs(backends: str, corpus: str) -> None:
    if backends == "postgres":
        require_pg()
    args = ("--sizes", "300", "--backends", backends, "--corpus", corpus)
    out = _run("bench/context_store_bench.py", *args, timeout=600)
    assert f"corpus: {corpus}" in out and f"{backends}: write p50" in out


def test_floor_benchmark_runs() -> None:
    out = _run("bench/floor_bench.py", "--quick", "--secrets", "20", timeout=600)
    for workload in ("chat-1KB c=1", "chat-1KB c=32", "chat-200KB c=1", "stream-200 c=1"):
        assert f"== {workload}" in out, workload
    assert out.count("wiregate's own work over") == 8  # both listeners, every workload
    assert "stream-200: CPU per stream <= 2 ms" in out and "bare proxy" in out


def test_workers_benchmark_runs() -> None:
    out = _run("bench/workers_bench.py", "--seconds", "0.5", timeout=600)
    assert "gateway-uds c=64" in out and "gateway-https c=32" in out and "CPU/call 2w ms" in out


@pytest.mark.parametrize("listening", [False, True])
def test_workers_benchmark_starts_again_when_its_port_was_taken(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, listening: bool
) -> None:
    """A port picked free can be taken before the server binds it (CI saw it once): the run
    starts again on new ports, in a fresh directory, instead of failing — also when what took
    it listens and never answers (the readiness probe is bounded)."""
    for entry in (str(REPO), str(REPO / "bench")):
        monkeypatch.syspath_prepend(entry)
    import wire_bench
    import workers_bench

    taken = socket.socket()  # the gateway cannot bind it either way
    taken.bind(("127.0.0.1", 0))
    if listening:
        taken.listen()  # connections are accepted by the kernel and never answered
    picks: list[tuple[int, ...]] = []
    real = wire_bench.free_ports

    def ports(n: int) -> tuple[int, ...]:
        chosen = real(n)
        if not picks:  # the first attempt's gateway port is one another socket holds
            chosen = (*chosen[:-1], taken.getsockname()[1])
        picks.append(chosen)
        return chosen

    monkeypatch.setattr(wire_bench, "free_ports", ports)
    try:
        results = workers_bench.run(1, 0.2, tmp_path)
    finally:
        taken.close()
    assert len(picks) == 2  # one failed attempt, one that ran
    assert len(list(tmp_path.iterdir())) == 2  # each in its own directory
    assert {"gateway-https c=32", "gateway-uds c=64"} <= results.keys()
    assert all(r["errors"] == 0 and r["rps"] > 0 for r in results.values())
