"""Floor benchmark: what the wire benchmark's gateway costs, split into the floor of its stack
and wiregate's own work, in one run.

    .venv/bin/python bench/floor_bench.py [--quick] [--rounds N] [--secrets N] [--json PATH]

The wire benchmark's set-up (`wire_bench.running_stack`: the mock provider on core 0 with the
client, `wiregate serve` on core 1, strict mode, the full catalogue plus --secrets configured
values, default 1,000) plus one more process on core 1: `bare_proxy.py`, the least a strict
reverse proxy on the same stack can do (aiohttp server and client, uvloop, the same TLS
context; read the whole request, send it, read the whole response, release it; nothing else).
The wire benchmark's four workloads go, round by round interleaved, to

* ``direct``  -- the mock provider;
* ``bare-https`` / ``gateway-https`` -- over TLS;
* ``bare-uds`` / ``gateway-uds`` -- over the Unix socket.

Per workload and target: p50, req/s and the serving process's CPU per call (utime + stime from
/proc over the timed rounds: the gateway with its check workers, the bare proxy alone). The
speed issue's targets are then read against both: a target the bare proxy itself misses cannot
be met on this machine by anything built on this stack (the floor is the reason); one the bare
proxy meets and the gateway misses is missed by wiregate's own work (gateway - bare says how
much). Reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wire_bench  # noqa: E402

BARE = Path(__file__).resolve().with_name("bare_proxy.py")
ORDER = ["direct", "bare-https", "gateway-https", "bare-uds", "gateway-uds"]
DEFAULT_SECRETS = 1000


class FloorTargets(wire_bench.Targets):
    """wire_bench's three sessions plus the bare proxy's two, in `ORDER`."""

    def __init__(self, stack: wire_bench.Stack, bare_port: int, bare_uds: Path, limit: int) -> None:
        super().__init__(stack, limit)
        tls = ssl.create_default_context(cafile=str(stack.env.ca))
        timeout = aiohttp.ClientTimeout(total=wire_bench.REQUEST_TIMEOUT_S)
        headers = {"content-type": "application/json", "authorization": "Bearer unused"}
        https = aiohttp.TCPConnector(limit=limit, keepalive_timeout=wire_bench.KEEPALIVE_S, ssl=tls)
        uds = aiohttp.UnixConnector(str(bare_uds), limit=limit, keepalive_timeout=wire_bench.KEEPALIVE_S)
        self.bare_https = wire_bench.Target(
            "bare-https",
            aiohttp.ClientSession(connector=https, timeout=timeout),
            f"https://127.0.0.1:{bare_port}",
            headers,
        )
        self.bare_uds = wire_bench.Target(
            "bare-uds", aiohttp.ClientSession(connector=uds, timeout=timeout), "http://localhost", headers
        )

    @property
    def all(self) -> list[wire_bench.Target]:
        return [self.direct, self.bare_https, self.https, self.bare_uds, self.uds]


def _cpu_reader(gateway_pid: int, bare_pid: int) -> Callable[[wire_bench.Target], float | None]:
    """The serving process's CPU seconds for a target: the gateway with its check workers, the
    bare proxy alone; None for the mock."""

    def read(target: wire_bench.Target) -> float | None:
        if target.name.startswith("gateway"):
            return wire_bench.tree_cpu_seconds(gateway_pid)
        if target.name.startswith("bare"):
            return wire_bench.cpu_seconds(bare_pid)
        return None

    return read


def _cpu_ms(m: wire_bench.Measurement) -> float | None:
    return m.cpu_s / len(m.latencies_ms) * 1000 if m.latencies_ms else None


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(result: wire_bench.WorkloadResult) -> str:
    workload, stats = result.workload, wire_bench.summarize(result)
    lines = [
        f"== {workload.name}: body {len(workload.body):,} B, concurrency {workload.concurrency}",
        f"   {'target':<14}{'ok':>6}{'err':>5}{'p50 ms':>9}{'added ms':>10}{'req/s':>9}{'CPU ms/call':>13}",
    ]
    for name in ORDER:
        s = stats[name]
        cpu = _cpu_ms(result.measurements[name]) if name != "direct" else None
        lines.append(
            f"   {name:<14}{s.ok:>6}{s.errors:>5}{_f(s.p50_ms, '.3f'):>9}{_f(s.added_p50_ms, '+.3f'):>10}"
            f"{_f(s.rps, ',.0f'):>9}{_f(cpu, '.3f'):>13}"
        )
    for listener in ("https", "uds"):
        bare, gw = stats[f"bare-{listener}"].p50_ms, stats[f"gateway-{listener}"].p50_ms
        bare_cpu = _cpu_ms(result.measurements[f"bare-{listener}"])
        gw_cpu = _cpu_ms(result.measurements[f"gateway-{listener}"])
        if bare is not None and gw is not None:
            own_cpu = gw_cpu - bare_cpu if gw_cpu is not None and bare_cpu is not None else None
            lines.append(
                f"   wiregate's own work over {listener}: p50 {gw - bare:+.3f} ms, CPU {_f(own_cpu, '+.3f')} ms/call"
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    target: str
    gateway: str
    floor: str
    verdict: str


def verdicts(results: dict[str, wire_bench.WorkloadResult]) -> list[Verdict]:
    """The speed issue's wire targets over HTTPS, each read against the bare proxy."""
    out: list[Verdict] = []

    def judge(
        name: str, gw_value: float | None, floor_value: float | None, ok: Any, fmt: str, budget: float | None = None
    ) -> None:
        """`budget`: for an upper bound on a cost the gateway adds to the floor, the bound
        itself, so the verdict says how much of it the floor leaves to wiregate's own work."""
        if gw_value is None or floor_value is None:
            out.append(Verdict(name, "-", "-", "not measured"))
            return
        if ok(gw_value):
            verdict = "met"
        elif not ok(floor_value):
            verdict = "missed: the bare proxy misses it too (the stack's floor on this machine)"
        else:
            verdict = "missed by wiregate's own work (the bare proxy meets it"
            if budget is not None:
                verdict += f", leaving {budget - floor_value:.3f} for everything wiregate does"
            verdict += ")"
        out.append(Verdict(name, format(gw_value, fmt), format(floor_value, fmt), verdict))

    stats = {name: wire_bench.summarize(result) for name, result in results.items()}

    def added(workload: str, name: str) -> float | None:
        return stats[workload][name].added_p50_ms

    judge(
        "1 KB c=1: added p50 <= 0.5 ms",
        added("chat-1KB c=1", "gateway-https"),
        added("chat-1KB c=1", "bare-https"),
        lambda v: v <= 0.5,
        "+.3f",
        0.5,
    )
    judge(
        "1 KB c=32: >= 2,000 req/s on one core",
        stats["chat-1KB c=32"]["gateway-https"].rps,
        stats["chat-1KB c=32"]["bare-https"].rps,
        lambda v: v >= 2000,
        ",.0f",
    )
    judge(
        "200 KB c=1: added p50 <= 1.5 ms",
        added("chat-200KB c=1", "gateway-https"),
        added("chat-200KB c=1", "bare-https"),
        lambda v: v <= 1.5,
        "+.3f",
        1.5,
    )
    stream = stats["stream-200 c=1"]
    judge(
        "stream-200: p50 <= 1.3x direct",
        stream["gateway-https"].p50_ratio,
        stream["bare-https"].p50_ratio,
        lambda v: v <= 1.3,
        ".2f",
    )
    measured = results["stream-200 c=1"].measurements
    judge(
        "stream-200: CPU per stream <= 2 ms",
        _cpu_ms(measured["gateway-https"]),
        _cpu_ms(measured["bare-https"]),
        lambda v: v <= 2.0,
        ".3f",
        2.0,
    )
    return out


async def measure(args: argparse.Namespace) -> tuple[dict[str, wire_bench.WorkloadResult], list[Verdict]]:
    pinning = wire_bench.pin_client()
    plan = wire_bench.workloads(args.quick)
    with wire_bench.running_stack(args.secrets, pinning, prefix="floor-bench-") as stack:
        assert stack.gateway is not None and stack.workdir is not None
        config_dir = stack.env.config.parent
        bare_port, bare_uds = wire_bench.free_port(), stack.workdir / "bare.sock"
        bare = stack.processes.start(
            "bare proxy",
            [
                sys.executable,
                str(BARE),
                "--upstream",
                stack.mock_url,
                "--upstream-key",
                stack.env.upstream_key,
                "--port",
                str(bare_port),
                "--uds",
                str(bare_uds),
                "--cert",
                str(config_dir / "tls" / "server.pem"),
                "--key",
                str(config_dir / "tls" / "server.key"),
            ],
            wire_bench.GATEWAY_CORE,
            stack.workdir / "bare.log",
        )
        limit = max(64, 2 * max(w.concurrency for w in plan))
        targets = FloorTargets(stack, bare_port, bare_uds, limit)
        try:
            await wire_bench.wait_ready(stack, targets)
            await wire_bench.wait_answering(
                stack.processes, [(targets.bare_https, "/healthz"), (targets.bare_uds, "/healthz")]
            )
            await wire_bench.mock_admin(targets.direct, "POST", "/_mock/scenarios", wire_bench.stream_scenario(200))
            cpu = _cpu_reader(stack.gateway.pid, bare.pid)
            results = {}
            for workload in plan:
                results[workload.name] = await wire_bench.run_workload(targets, workload, args.rounds, cpu)
                stack.processes.check_alive()
                print(table(results[workload.name]) + "\n", flush=True)
        finally:
            await targets.close()
    return results, verdicts(results)


@wire_bench.bench_main("floor_bench")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    parser.add_argument("--rounds", type=int, help="timed rounds per target (default 5, quick 2)")
    parser.add_argument("--secrets", type=int, default=DEFAULT_SECRETS, help="secret values to configure")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 5)
    wire_bench.exit_on_sigterm()
    info = wire_bench.machine_info(wire_bench.pin_client(), args.secrets)
    wire_bench.print_header(info, "wiregate floor benchmark (a bare strict proxy on the same stack beside it)")
    started = time.monotonic()
    results, found = asyncio.run(measure(args))
    print("Targets of the speed issue over HTTPS, against the floor (informational):")
    for v in found:
        print(f"  {v.target:<40} gateway {v.gateway:>9}   bare proxy {v.floor:>9}   {v.verdict}")
    print(f"\nTotal time {time.monotonic() - started:.0f} s")
    errors = wire_bench.print_errors(list(results.values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": info,
            "workloads": {
                w: {
                    n: {
                        "p50_ms": st.p50_ms,
                        "rps": st.rps,
                        "cpu_ms_per_call": _cpu_ms(r.measurements[n]),
                        "errors": st.errors,
                    }
                    for n, st in wire_bench.summarize(r).items()
                }
                for w, r in results.items()
            },
            "targets": [v.__dict__ for v in found],
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
