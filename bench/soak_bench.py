"""Soak and overload benchmark (issue 11): a real `wiregate serve` and the bundled mock, on
loopback only, bounded in time.

Soak: mixed workloads (1 KB chat, a streamed chat, a 64 KB chat, a check-API before_send) at
concurrency 64, half over HTTPS and half over the Unix socket, for a warm-up and then a
measured period. Reports throughput, p50/p99 per workload, errors (target 0) and the gateway's
RSS growth from the end of the warm-up to the end (target ≤ 5 %).

Overload: `concurrent_buffered_responses` = 8 and 64 concurrent calls whose answers are 2 MiB
each: the calls past the bound get 503 `capacity_exceeded` at once, and the gateway's peak RSS
(VmHWM) stays bounded by about bound × response size.

Bounded structures: what the in-process release ledger costs at its bound (100,000 entries),
measured here with tracemalloc.

    .venv/bin/python bench/soak_bench.py [--warmup S] [--seconds S] [--json PATH]

Exit status is non-zero when a soak request failed or an overload answer was neither 200 nor
503 capacity_exceeded.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import loop_bench, wire_bench  # noqa: E402
from gateway.ledgers.release import MemoryReleaseLedger  # noqa: E402

CONCURRENCY = 64
MIX = (("chat_1kb", 6), ("stream", 2), ("chat_64kb", 1), ("check", 1))  # weights


def _rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise wire_bench.BenchError(f"no {field_name} for {pid}")


def _gateway_pid(st: wire_bench.Stack) -> int:
    for name, proc, _ in st.processes._running:
        if name == "gateway":
            return proc.pid
    raise wire_bench.BenchError("no gateway process")


def bodies() -> dict[str, tuple[str, bytes]]:
    check = {
        "scope_id": "default",
        "phase": "before_send",
        "target_profile": "bench-openai",
        "payload": {
            "schema": "powercontext.model-json-payload.v1",
            "headers": {"content-type": "application/json"},
            "body": wire_bench.chat_body(1024).decode(),
        },
    }
    return {
        "chat_1kb": (wire_bench.CHAT_PATH, wire_bench.chat_body(1024)),
        "stream": (wire_bench.CHAT_PATH, wire_bench.stream_body()),
        "chat_64kb": (wire_bench.CHAT_PATH, wire_bench.chat_body(64 * 1024)),
        "check": ("/v1/context/check", json.dumps(check).encode()),
    }


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)

    def ok(self, name: str, ms: float) -> None:
        self.latencies.setdefault(name, []).append(ms)

    def fail(self, name: str, kind: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1
        if len(self.kinds) < 8 or kind in self.kinds:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1


async def _one(target: wire_bench.Target, path: str, body: bytes) -> tuple[float, str | None]:
    started = time.perf_counter()
    try:
        async with target.session.post(target.base_url + path, data=body, headers=target.headers) as resp:
            payload = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0.0, type(exc).__name__
    if status != 200:
        return 0.0, f"HTTP {status} {payload[:120]!r}"
    return (time.perf_counter() - started) * 1000, None


async def soak(st: wire_bench.Stack, warmup_s: float, seconds: float) -> dict[str, Any]:
    targets = wire_bench.Targets(st, CONCURRENCY)
    pid = _gateway_pid(st)
    made = bodies()
    names = [name for name, weight in MIX for _ in range(weight)]
    rss: list[tuple[float, int]] = []
    try:
        await wire_bench.wait_ready(st, targets)
        await wire_bench.mock_admin(targets.direct, "POST", "/_mock/scenarios", wire_bench.stream_scenario(210))
        async with wire_bench.mock_records_kept_small(targets):
            for phase, length in (("warmup", warmup_s), ("measured", seconds)):
                tally = Tally()
                deadline = time.perf_counter() + length
                started = time.perf_counter()

                async def worker(n: int, tally: Tally = tally, deadline: float = deadline) -> None:
                    rng = random.Random(n)
                    target = targets.https if n % 2 else targets.uds
                    while time.perf_counter() < deadline:
                        name = rng.choice(names)
                        path, body = made[name]
                        ms, error = await _one(target, path, body)
                        if error is None:
                            tally.ok(name, ms)
                        else:
                            tally.fail(name, error)

                async def sample(deadline: float = deadline, phase: str = phase) -> None:
                    while time.perf_counter() < deadline:
                        rss.append((time.perf_counter(), _rss_kib(pid)))
                        await asyncio.sleep(1.0)

                await asyncio.gather(sample(), *(worker(n) for n in range(CONCURRENCY)))
                elapsed = time.perf_counter() - started
                if phase == "warmup":
                    rss_after_warmup = _rss_kib(pid)
                    continue
                rss_end = _rss_kib(pid)
                total = sum(len(v) for v in tally.latencies.values())
                return {
                    "concurrency": CONCURRENCY,
                    "seconds": round(elapsed, 1),
                    "requests_ok": total,
                    "errors": sum(tally.errors.values()),
                    "error_kinds": tally.kinds,
                    "throughput_rps": round(total / elapsed, 1),
                    "per_workload": {
                        name: {
                            "n": len(values),
                            "p50_ms": wire_bench.percentile(values, 50),
                            "p99_ms": wire_bench.percentile(values, 99),
                        }
                        for name, values in sorted(tally.latencies.items())
                    },
                    "rss_after_warmup_mib": round(rss_after_warmup / 1024, 1),
                    "rss_end_mib": round(rss_end / 1024, 1),
                    "rss_growth_pct": round(100 * (rss_end - rss_after_warmup) / rss_after_warmup, 2),
                }
    finally:
        await targets.close()
    raise AssertionError("unreachable")


async def overload(st: wire_bench.Stack, bound: int, answer_bytes: int, calls: int) -> dict[str, Any]:
    targets = wire_bench.Targets(st, calls)
    pid = _gateway_pid(st)
    try:
        await wire_bench.wait_ready(st, targets)
        scenario = {
            "id": "bench-big",
            "steps": [{"text": "x" * answer_bytes, "delay_ms": 300}],
        }  # the last step repeats
        await wire_bench.mock_admin(targets.direct, "POST", "/_mock/scenarios", scenario)
        body = json.dumps(
            {"model": wire_bench.MODEL, "messages": [{"role": "user", "content": "mock-scenario:bench-big"}]}
        ).encode()
        baseline = _rss_kib(pid, "VmHWM")
        statuses: dict[str, int] = {}
        refused_ms: list[float] = []

        async def call(n: int) -> None:
            target = targets.https if n % 2 else targets.uds
            started = time.perf_counter()
            async with target.session.post(
                target.base_url + wire_bench.CHAT_PATH, data=body, headers=target.headers
            ) as r:
                payload = await r.read()
                key = str(r.status)
                if r.status == 503 and b"capacity_exceeded" in payload:
                    key = "503 capacity_exceeded"
                    refused_ms.append((time.perf_counter() - started) * 1000)
                statuses[key] = statuses.get(key, 0) + 1

        async with wire_bench.mock_records_kept_small(targets):
            await asyncio.gather(*(call(n) for n in range(calls)))
        peak = _rss_kib(pid, "VmHWM")
        return {
            "bound": bound,
            "answer_mib": round(answer_bytes / 2**20, 2),
            "calls": calls,
            "statuses": statuses,
            "refused_p50_ms": wire_bench.percentile(refused_ms, 50),
            "peak_rss_before_mib": round(baseline / 1024, 1),
            "peak_rss_after_mib": round(peak / 1024, 1),
            "peak_growth_mib": round((peak - baseline) / 1024, 1),
            "bound_x_answer_mib": round(bound * answer_bytes / 2**20, 1),
        }
    finally:
        await targets.close()


def release_ledger_cost(entries: int = 100_000) -> dict[str, Any]:
    async def fill() -> MemoryReleaseLedger:
        ledger = MemoryReleaseLedger(capacity=entries)
        for n in range(entries):
            await ledger.admit(f"sb_{n:022d}", f"{n:064x}", 1e12, 0.0)
        return ledger

    tracemalloc.start()
    ledger = asyncio.run(fill())
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(ledger) == entries
    return {"entries": entries, "mib": round(size / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {"release_ledger_at_bound": release_ledger_cost()}
    for name, extra in (
        ("soak", ""),
        ("overload", "[limits]\nconcurrent_buffered_responses = 8\nper_principal_concurrent = 128\n"),
    ):
        workdir = Path(tempfile.mkdtemp(prefix="soak-bench-"))
        try:
            with loop_bench.stack(extra, workdir) as st:
                if name == "soak":
                    results[name] = asyncio.run(soak(st, args.warmup, args.seconds))
                else:
                    results[name] = asyncio.run(overload(st, 8, 2 * 2**20, 64))
        except wire_bench.BenchError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(workdir)
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    statuses = results["overload"]["statuses"]
    bad = results["soak"]["errors"] or set(statuses) - {"200", "503 capacity_exceeded"}
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
