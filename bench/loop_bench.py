"""Event-loop benchmark: do small calls keep their latency while a huge body is checked?

Issue 7 item 15. One run starts the bundled mock provider and a real `wiregate serve`
twice: with check workers (`server.check_workers = 2`, the default; bodies of 1 MiB or
more are parsed and checked in worker processes) and without (`check_workers = 0`: every
body is decided on the event loop). For each it measures, over the Unix socket:

* idle: `GET /healthz` and a 1 KB chat call, one after another;
* during: the same probes, sent while 25 MiB chat requests are being checked (one after
  another, from a second connection), counting only probes that started while a large
  request was in flight.

It prints p50 / p99 / max per probe and the ratio during/idle, per configuration, in the
same run. Informational: exit status non-zero only when a request failed.

    .venv/bin/python bench/loop_bench.py [--quick] [--big-mib 25] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import wire_bench  # noqa: E402

from tests.harness import build_env, mock_profile  # noqa: E402

# healthz: the gateway alone; chat_1kb: through the gateway to the mock; mock_1kb: the
# mock directly (it parses the 25 MiB body too, so it shows how much of chat_1kb is its own).
PROBES = ("healthz", "chat_1kb", "mock_1kb")

CONFIGS = {
    "workers": "[server]\ncheck_workers = 2\n",
    "in-loop": "[server]\ncheck_workers = 0\n",
}


@contextlib.contextmanager
def stack(config_extra: str, workdir: Path) -> Iterator[wire_bench.Stack]:
    processes = wire_bench.Processes(pin=False)
    try:
        mock_port, gateway_port = wire_bench.free_ports(2)
        mock_url = f"http://127.0.0.1:{mock_port}"
        profile = mock_profile("bench-openai", "openai", mock_url)
        profile.pop("timeouts", None)
        profile["context_window"] = 100_000_000  # the point is the check, not the window
        env = build_env(
            workdir / "config",
            mock_url,
            secrets_=wire_bench.secret_values(100),
            profiles=[profile],
            config_extra=config_extra,
        )
        wire_bench.set_https_port(env.config, gateway_port)
        wiregate = str(Path(sys.executable).with_name("wiregate"))
        processes.start(
            "mock provider",
            [wiregate, "mock-provider", "--port", str(mock_port), "--api-key", env.upstream_key],
            0,
            workdir / "mock.log",
        )
        processes.start("gateway", [wiregate, "serve", "--config", str(env.config)], 1, workdir / "gateway.log")
        yield wire_bench.Stack(
            env, mock_url, f"https://127.0.0.1:{gateway_port}", wire_bench.uds_path(env.config), processes
        )
    finally:
        processes.stop_all()


def chat(text: str) -> bytes:
    return json.dumps({"model": wire_bench.MODEL, "messages": [{"role": "user", "content": text}]}).encode()


async def timed(
    session: aiohttp.ClientSession,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
    base: str = "http://localhost",
) -> float:
    started = time.perf_counter()
    async with session.request(method, base + path, data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise wire_bench.BenchError(f"{method} {path}: {resp.status}")
    return time.perf_counter() - started


def stats(values: list[float]) -> dict[str, float | None]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50_ms": wire_bench.percentile(ms, 50),
        "p99_ms": wire_bench.percentile(ms, 99),
        "max_ms": max(ms) if ms else None,
    }


async def measure(st: wire_bench.Stack, big: bytes, big_rounds: int, idle_rounds: int) -> dict[str, Any]:
    headers = {"content-type": "application/json", "authorization": f"Bearer {st.env.gateway_key}"}
    small = chat(wire_bench.prose(900))

    def session() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(str(st.uds)), timeout=aiohttp.ClientTimeout(total=300)
        )

    direct_headers = {"content-type": "application/json", "authorization": f"Bearer {st.env.upstream_key}"}
    direct_base = st.mock_url + "/v1"

    async with session() as probes, session() as loader, aiohttp.ClientSession() as direct:
        deadline = time.monotonic() + 30
        while True:
            st.processes.check_alive()
            with contextlib.suppress(aiohttp.ClientError, OSError, wire_bench.BenchError):
                await timed(probes, "GET", "/healthz", None, {})
                break
            if time.monotonic() > deadline:
                raise wire_bench.BenchError("gateway did not come up")
            await asyncio.sleep(0.2)
        await timed(loader, "POST", wire_bench.CHAT_PATH, big, headers)  # warm: workers started

        async def probe(name: str) -> float:
            if name == "healthz":
                return await timed(probes, "GET", "/healthz", None, {})
            if name == "chat_1kb":
                return await timed(probes, "POST", wire_bench.CHAT_PATH, small, headers)
            chat_path = wire_bench.CHAT_PATH.removeprefix("/v1")
            return await timed(direct, "POST", chat_path, small, direct_headers, direct_base)

        idle: dict[str, list[float]] = {name: [] for name in PROBES}
        for _ in range(idle_rounds):
            for name in PROBES:
                idle[name].append(await probe(name))
        during: dict[str, list[float]] = {name: [] for name in PROBES}
        big_seconds: list[float] = []
        in_flight = asyncio.Event()
        done = asyncio.Event()

        async def load() -> None:
            for _ in range(big_rounds):
                in_flight.set()
                big_seconds.append(await timed(loader, "POST", wire_bench.CHAT_PATH, big, headers))
                in_flight.clear()
            done.set()

        task = asyncio.create_task(load())
        await in_flight.wait()
        await asyncio.sleep(0.05)  # the large body is on its way in
        while not done.is_set():
            for name in PROBES:
                if in_flight.is_set():
                    during[name].append(await probe(name))
            await asyncio.sleep(0.02)
        await task
    return {
        "idle": {k: stats(v) for k, v in idle.items()},
        "during": {k: stats(v) for k, v in during.items()},
        "big_request_s": stats(big_seconds),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def table(results: dict[str, dict[str, Any]], big_mib: int) -> str:
    lines = [
        f"{'config':<9} {'probe':<9} {'idle p50':>9} {'idle p99':>9} {'busy p50':>9} {'busy p99':>9}"
        f" {'busy max':>9} {'n':>4} {'p50 ×':>7} {'p99 ×':>7}",
    ]
    for config, result in results.items():
        for probe in PROBES:
            i, d = result["idle"][probe], result["during"][probe]
            lines.append(
                f"{config:<9} {probe:<9} {i['p50_ms']:9.2f} {i['p99_ms']:9.2f} {d['p50_ms'] or 0:9.2f}"
                f" {d['p99_ms'] or 0:9.2f} {d['max_ms'] or 0:9.2f} {d['n']:4d}"
                f" {ratio(d['p50_ms'], i['p50_ms']) or 0:7.1f} {ratio(d['p99_ms'], i['p99_ms']) or 0:7.1f}"
            )
        lines.append(f"{config:<9} {big_mib} MiB call p50 {result['big_request_s']['p50_ms'] / 1000:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--big-mib", type=int, default=25)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    big_rounds, idle_rounds = (1, 10) if args.quick else (3, 60)
    big = chat(wire_bench.prose(args.big_mib * 1024 * 1024 - 200))
    results: dict[str, dict[str, Any]] = {}
    for name, extra in CONFIGS.items():
        workdir = Path(tempfile.mkdtemp(prefix="loop-bench-"))
        try:
            with stack(extra, workdir) as st:
                results[name] = asyncio.run(measure(st, big, big_rounds, idle_rounds))
        except wire_bench.BenchError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            return 1
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"loop bench: {args.big_mib} MiB bodies checked while probing over the Unix socket (ms)")
    print(table(results, args.big_mib))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
