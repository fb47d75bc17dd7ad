"""Scaling from one gateway process to two (`wiregate serve --workers N`).

One run, the same mock provider, two gateways started one after the other on the same
configuration: `--workers 1` pinned to core 1 (as wire_bench pins it), then `--workers 2` on
cores 0 and 1. The load client and the mock stay on core 0 throughout, so on a 2-core machine
the two-worker figure is bounded by the client sharing a core with a worker: the ratio shows
what the second process buys here, not the machine's ceiling (on a machine with spare cores
give the client its own). Workload: 1 KB chat at concurrency 32 and 64 over HTTPS and over the
Unix socket (each keep-alive connection stays on the worker the kernel gave it).

Beside throughput, the gateway's CPU per call: utime + stime of the gateway process and every
process below it (the supervisor, its workers, their check workers), read from /proc around
each timed round. It says what the second process costs per call, whatever the client can
drive: with no contention between workers it stays what one worker spends, and the gateway
alone could then serve (cores ÷ CPU per call) calls a second.

    .venv/bin/python bench/workers_bench.py [--seconds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import wire_bench  # noqa: E402

from tests.harness import build_env, mock_profile  # noqa: E402


async def measure(stack: wire_bench.Stack, seconds: float) -> dict[str, Any]:
    body = wire_bench.chat_body(1024)
    out: dict[str, Any] = {}
    for concurrency in (32, 64):
        targets = wire_bench.Targets(stack, concurrency)
        try:
            await wire_bench.wait_ready(stack, targets)
            async with wire_bench.mock_records_kept_small(targets):
                for target in (targets.https, targets.uds):
                    load = wire_bench.Workload(
                        f"chat-1KB c={concurrency}",
                        body,
                        concurrency,
                        wire_bench.Bound(None, seconds),
                        wire_bench.Bound(None, 1.0),
                    )
                    await wire_bench.run_round(target, load, load.warmup)
                    assert stack.gateway is not None
                    cpu_before = wire_bench.tree_cpu_seconds(stack.gateway.pid)
                    result = await wire_bench.run_round(target, load, load.round)
                    cpu = wire_bench.tree_cpu_seconds(stack.gateway.pid) - cpu_before
                    calls = len(result.latencies_ms)
                    out[f"{target.name} c={concurrency}"] = {
                        "rps": round(calls / result.elapsed_s, 1),
                        "cpu_ms_per_call": round(1000 * cpu / calls, 3) if calls else None,
                        "p50_ms": wire_bench.percentile(result.latencies_ms, 50),
                        "p99_ms": wire_bench.percentile(result.latencies_ms, 99),
                        "errors": result.errors,
                    }
        finally:
            await targets.close()
    return out


ATTEMPTS = 3  # a port picked free can be taken before the server binds it: start again on new ports


def run(workers: int, seconds: float, workdir: Path) -> dict[str, Any]:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return run_once(workers, seconds, workdir)
        except wire_bench.BenchError as exc:
            if "address already in use" not in str(exc) or attempt == ATTEMPTS:
                raise
            print(f"workers_bench: a port was taken before the server bound it; starting again ({attempt})")
    raise AssertionError("unreachable")


def run_once(workers: int, seconds: float, workdir: Path) -> dict[str, Any]:
    processes = wire_bench.Processes(pin=True)
    workdir = Path(tempfile.mkdtemp(dir=workdir, prefix=f"workers-{workers}-"))  # a fresh one per attempt
    try:
        mock_port, gateway_port = wire_bench.free_ports(2)
        mock_url = f"http://127.0.0.1:{mock_port}"
        profile = mock_profile("bench-openai", "openai", mock_url)
        for tuned_for_tests in ("retry", "timeouts"):
            profile.pop(tuned_for_tests, None)
        env = build_env(
            workdir / f"config-{workers}", mock_url, secrets_=wire_bench.secret_values(20), profiles=[profile]
        )
        wire_bench.set_https_port(env.config, gateway_port)
        wiregate = str(Path(sys.executable).with_name("wiregate"))
        processes.start(
            "mock provider",
            [wiregate, "mock-provider", "--port", str(mock_port), "--api-key", env.upstream_key],
            0,
            workdir / f"mock-{workers}.log",
        )
        argv = [wiregate, "serve", "--config", str(env.config), "--workers", str(workers)]
        if workers == 1:
            gateway = processes.start("gateway", argv, wire_bench.GATEWAY_CORE, workdir / f"gateway-{workers}.log")
        else:
            processes._pin = False  # both cores
            gateway = processes.start("gateway", argv, 0, workdir / f"gateway-{workers}.log")
        stack = wire_bench.Stack(
            env, mock_url, f"https://127.0.0.1:{gateway_port}", wire_bench.uds_path(env.config), processes, gateway
        )
        return asyncio.run(measure(stack, seconds))
    finally:
        processes.stop_all()


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    wire_bench.pin_client()
    workdir = Path(tempfile.mkdtemp(prefix="workers-bench-"))
    try:
        results = {n: run(n, args.seconds, workdir) for n in (1, 2)}
    except wire_bench.BenchError as exc:
        print(f"workers_bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"{'target':<26}{'1 worker rps':>14}{'2 workers rps':>15}{'ratio':>8}{'p99 1w ms':>11}{'p99 2w ms':>11}"
        f"{'CPU/call 1w ms':>16}{'CPU/call 2w ms':>16}"
    )
    for key, one in results[1].items():
        two = results[2][key]
        ratio = two["rps"] / one["rps"] if one["rps"] else float("nan")
        print(
            f"{key:<26}{one['rps']:>14.1f}{two['rps']:>15.1f}{ratio:>8.2f}{one['p99_ms']:>11.2f}{two['p99_ms']:>11.2f}"
            f"{_ms(one['cpu_ms_per_call']):>16}{_ms(two['cpu_ms_per_call']):>16}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    errors = sum(v["errors"] for r in results.values() for v in r.values())
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
