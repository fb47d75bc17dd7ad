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
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wire_bench  # noqa: E402

BARE = Path(__file__).resolve().with_name("bare_proxy.py")
ORDER = ["direct", "bare-https", "gateway-https", "bare-uds", "gateway-uds"]
DEFAULT_SECRETS = 1000


@dataclass
class Side:
    """A target's measurements over the timed rounds."""

    latencies_ms: list[float] = field(default_factory=list)
    ok: int = 0
    errors: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0

    def p50(self) -> float | None:
        return statistics.median(self.latencies_ms) if self.latencies_ms else None

    def rps(self) -> float | None:
        return self.ok / self.elapsed_s if self.elapsed_s else None

    def cpu_ms(self) -> float | None:
        return self.cpu_s / self.ok * 1000 if self.ok else None


class FloorTargets:
    """wire_bench's three sessions plus the bare proxy's two."""

    def __init__(self, stack: wire_bench.Stack, bare_port: int, bare_uds: Path, limit: int) -> None:
        self.base = wire_bench.Targets(stack, limit)
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
        self.direct = self.base.direct
        self.by_name = {
            "direct": self.base.direct,
            "bare-https": self.bare_https,
            "gateway-https": self.base.https,
            "bare-uds": self.bare_uds,
            "gateway-uds": self.base.uds,
        }

    async def close(self) -> None:
        await self.base.close()
        await self.bare_https.session.close()
        await self.bare_uds.session.close()


async def _ready(target: wire_bench.Target, processes: wire_bench.Processes) -> None:
    deadline = time.monotonic() + wire_bench.READY_TIMEOUT_S
    while True:
        processes.check_alive()
        try:
            if await target.get("/healthz") == 200:
                return
        except (aiohttp.ClientError, OSError):
            pass
        if time.monotonic() > deadline:
            raise wire_bench.BenchError(f"{target.name} not ready")
        await asyncio.sleep(0.05)


def _cpu(name: str, gateway_pid: int, bare_pid: int) -> float:
    if name.startswith("gateway"):
        return wire_bench.tree_cpu_seconds(gateway_pid)
    if name.startswith("bare"):
        return wire_bench.cpu_seconds(bare_pid)
    return 0.0


async def run_workload(
    targets: FloorTargets, workload: wire_bench.Workload, rounds: int, gateway_pid: int, bare_pid: int
) -> dict[str, Side]:
    sides = {name: Side() for name in ORDER}
    async with wire_bench.mock_records_kept_small(targets.base):
        for name in ORDER:
            _, _, error = await wire_bench.send(targets.by_name[name], workload.body)
            if error is not None:
                raise wire_bench.BenchError(f"{workload.name} / {name}: {error}")
            await wire_bench.run_round(targets.by_name[name], workload, workload.warmup)
        for _ in range(rounds):
            for name in ORDER:
                before = _cpu(name, gateway_pid, bare_pid)
                m = await wire_bench.run_round(targets.by_name[name], workload, workload.round)
                side = sides[name]
                side.cpu_s += _cpu(name, gateway_pid, bare_pid) - before
                side.latencies_ms += m.latencies_ms
                side.ok += len(m.latencies_ms)
                side.errors += m.errors
                side.elapsed_s += m.elapsed_s
    return sides


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(workload: wire_bench.Workload, sides: dict[str, Side]) -> str:
    direct = sides["direct"].p50()
    lines = [
        f"== {workload.name}: body {len(workload.body):,} B, concurrency {workload.concurrency}",
        f"   {'target':<14}{'ok':>6}{'err':>5}{'p50 ms':>9}{'added ms':>10}{'req/s':>9}{'CPU ms/call':>13}",
    ]
    for name in ORDER:
        s = sides[name]
        p50 = s.p50()
        added = p50 - direct if p50 is not None and direct is not None and name != "direct" else None
        lines.append(
            f"   {name:<14}{s.ok:>6}{s.errors:>5}{_f(p50, '.3f'):>9}{_f(added, '+.3f'):>10}"
            f"{_f(s.rps(), ',.0f'):>9}{_f(s.cpu_ms(), '.3f') if name != 'direct' else '-':>13}"
        )
    for listener in ("https", "uds"):
        bare, gw = sides[f"bare-{listener}"], sides[f"gateway-{listener}"]
        if bare.p50() is not None and gw.p50() is not None:
            own_cpu = gw.cpu_ms() - bare.cpu_ms() if gw.cpu_ms() is not None and bare.cpu_ms() is not None else None
            lines.append(
                f"   wiregate's own work over {listener}: p50 {gw.p50() - bare.p50():+.3f} ms"  # type: ignore[operator]
                f", CPU {_f(own_cpu, '+.3f')} ms/call"
            )
    return "\n".join(lines)


@dataclass(frozen=True)
class Verdict:
    target: str
    gateway: str
    floor: str
    verdict: str


def verdicts(results: dict[str, dict[str, Side]]) -> list[Verdict]:
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

    def added(workload: str, name: str) -> float | None:
        s, d = results[workload][name].p50(), results[workload]["direct"].p50()
        return s - d if s is not None and d is not None else None

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
        results["chat-1KB c=32"]["gateway-https"].rps(),
        results["chat-1KB c=32"]["bare-https"].rps(),
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
    stream = results["stream-200 c=1"]
    d = stream["direct"].p50()

    def ratio(name: str) -> float | None:
        p = stream[name].p50()
        return p / d if p is not None and d else None

    judge("stream-200: p50 <= 1.3x direct", ratio("gateway-https"), ratio("bare-https"), lambda v: v <= 1.3, ".2f")
    judge(
        "stream-200: CPU per stream <= 2 ms",
        stream["gateway-https"].cpu_ms(),
        stream["bare-https"].cpu_ms(),
        lambda v: v <= 2.0,
        ".3f",
        2.0,
    )
    return out


async def measure(args: argparse.Namespace) -> tuple[dict[str, dict[str, Side]], list[Verdict]]:
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
            await wire_bench.wait_ready(stack, targets.base)
            await _ready(targets.bare_https, stack.processes)
            await _ready(targets.bare_uds, stack.processes)
            await wire_bench.mock_admin(targets.direct, "POST", "/_mock/scenarios", wire_bench.stream_scenario(200))
            results = {}
            for workload in plan:
                results[workload.name] = await run_workload(targets, workload, args.rounds, stack.gateway.pid, bare.pid)
                stack.processes.check_alive()
                print(table(workload, results[workload.name]) + "\n", flush=True)
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
    errors = sum(s.errors for sides in results.values() for s in sides.values())
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "machine": info,
            "workloads": {
                w: {
                    n: {"p50_ms": s.p50(), "rps": s.rps(), "cpu_ms_per_call": s.cpu_ms(), "errors": s.errors}
                    for n, s in sides.items()
                }
                for w, sides in results.items()
            },
            "targets": [v.__dict__ for v in found],
        }
        args.json.write_text(json.dumps(doc, indent=2))
    if errors:
        print(f"FAILED: {errors} request(s) did not return 200", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
