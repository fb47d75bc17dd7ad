"""Stream benchmark: streamed chat completions through the gateway in both strict release modes.

One run starts the bundled mock provider and a real `wiregate serve` (strict mode, secret-value
inspection on, the full rule catalogue) with two OpenAI profiles against the same mock:
``bench-buffered`` (``release = "buffered"``: the whole stream is buffered, checked, then
released at once) and ``bench-windowed`` (``release = "windowed"``: events go out as they
arrive while a window of text is held back; the whole stream is checked at the end before
the held rest goes out). The same streamed request is sent, one at a time and interleaved
round by round, to three targets:

* ``direct``            -- the mock provider itself (TCP, plain HTTP, the upstream key);
* ``gateway-buffered``  -- the gateway's HTTPS listener, ``x-wiregate-profile: bench-buffered``;
* ``gateway-windowed``  -- the gateway's HTTPS listener, ``x-wiregate-profile: bench-windowed``.

Workloads (mock scenarios): ``burst`` -- 200 content events of 8 characters, no delay (as
wire_bench's "stream-200 c=1"); ``drip`` -- the same with 2 ms between events (a model
generating ~500 events/s). Per request it measures the time to the end of the body, to the
first body byte, and to the first byte of content text (the first time the body read so far
holds a non-empty ``"content":"...``); per gateway target, the gateway's CPU time per stream
(utime + stime of the gateway process from /proc across that target's timed rounds). The
windowed profile's access lines give its window and how much of each stream went out early.

Pinning (as wire_bench): the client (this process) and the mock share core 0, the gateway
runs on core 1.

    .venv/bin/python bench/stream_bench.py [--quick] [--secrets N] [--json PATH]

Timing results are informational: the exit status is non-zero only when a request failed
(anything but a 200 ending with ``data: [DONE]`` and carrying content text), a probe's text
differed from the scenario's, or the set-up did not come up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import ssl
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
for entry in (str(REPO), str(REPO / "bench")):
    if entry not in sys.path:
        sys.path.insert(0, entry)

import wire_bench  # noqa: E402
from wire_bench import BenchError, Bound, Target  # noqa: E402

from tests.harness import mock_profile  # noqa: E402

PROFILE_HEADER = "x-wiregate-profile"
BUFFERED_PROFILE, WINDOWED_PROFILE = "bench-buffered", "bench-windowed"
DIRECT, BUFFERED, WINDOWED = "direct", "gateway-buffered", "gateway-windowed"
CONTENT_RE = re.compile(rb'"content":"[^"]')
CONTENT_LOOKBEHIND = len(b'"content":"')  # a match may straddle two reads
DONE = b"data: [DONE]"
DEFAULT_SECRETS = 1000
MAX_ERROR_KINDS = 5
LOG_SETTLE_S = 0.2  # for the gateway's last access lines to reach its log


# --- workloads -------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamWorkload:
    """A mock scenario of `chunks` content events, `drip_ms` apart, and its round sizes."""

    name: str
    chunks: int
    chunk_size: int
    drip_ms: float
    round: Bound
    warmup: Bound

    def scenario(self) -> dict[str, Any]:
        """The mock scenario, under the id `wire_bench.stream_body()` names (replacing the
        previous workload's: the mock restarts a re-registered scenario at its first step)."""
        scenario = wire_bench.stream_scenario(self.chunks, self.chunk_size)
        if self.drip_ms:
            scenario["steps"][0]["drip_ms"] = self.drip_ms
        return scenario

    @property
    def text(self) -> str:
        text: str = self.scenario()["steps"][0]["text"]
        return text

    def describe(self) -> str:
        drip = f"{self.drip_ms:g} ms apart" if self.drip_ms else "no delay"
        return f"{self.chunks} content events of {self.chunk_size} characters, {drip}"


def workloads(quick: bool) -> list[StreamWorkload]:
    if quick:
        return [
            StreamWorkload("burst", 200, 8, 0.0, Bound(20, 5), Bound(5, 2)),
            StreamWorkload("drip", 200, 8, 2.0, Bound(6, 5), Bound(2, 2)),
        ]
    return [
        StreamWorkload("burst", 200, 8, 0.0, Bound(60, 20), Bound(10, 5)),
        StreamWorkload("drip", 200, 8, 2.0, Bound(16, 15), Bound(3, 5)),
    ]


# --- processes -------------------------------------------------------------------------


class GatewayCpu:
    """CPU time (user + system) of the gateway process, from /proc/<pid>/stat."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.pid = proc.pid

    def verify(self) -> str:
        """Check that the pid is the gateway itself (taskset execs it, so it should be), not a
        wrapper; return its command line."""
        try:
            comm = Path(f"/proc/{self.pid}/comm").read_text().strip()
            argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError as exc:
            raise BenchError(f"cannot read /proc/{self.pid}: {exc}") from exc
        cmdline = " ".join(arg.decode(errors="replace") for arg in argv)
        if comm == "taskset" or b"serve" not in argv or any(Path(a.decode()).name == "taskset" for a in argv):
            raise BenchError(f"pid {self.pid} is not the gateway: comm {comm!r}, cmdline {cmdline!r}")
        return f"pid {self.pid}, comm {comm!r}: {cmdline}"

    def seconds(self) -> float:
        return wire_bench.cpu_seconds(self.pid)


class GatewayLog:
    """The gateway's access lines for the windowed profile, read as the run goes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def windowed_lines(self) -> list[dict[str, Any]]:
        """The complete windowed access lines written since the last call."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except OSError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = []
        for raw in complete.splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if line.get("event") == "request" and line.get("release") == "windowed":
                    lines.append(line)
        return lines


@dataclass(frozen=True)
class WindowFacts:
    """What the windowed profile's access lines say about a workload's streams."""

    streams: int
    window: int
    window_cap: int
    capped_rules: int
    median_checks: float
    median_released_early: float
    median_bytes_out: float

    def describe(self) -> str:
        return (
            f"windowed: window {self.window} chars (cap {self.window_cap}, {self.capped_rules} rules capped); "
            f"per stream (median of {self.streams}): {self.median_checks:g} window checks, "
            f"{self.median_released_early:,.0f} of {self.median_bytes_out:,.0f} B released early"
        )


def window_facts(lines: list[dict[str, Any]]) -> WindowFacts | None:
    if not lines:
        return None
    last = lines[-1]
    return WindowFacts(
        len(lines),
        int(last.get("window", 0)),
        int(last.get("window_cap", 0)),
        int(last.get("window_capped_rules", 0)),
        statistics.median(float(line.get("window_checks", 0)) for line in lines),
        statistics.median(float(line.get("released_early", 0)) for line in lines),
        statistics.median(float(line.get("bytes_out", 0)) for line in lines),
    )


@dataclass
class StreamStack:
    stack: wire_bench.Stack
    gateway: GatewayCpu
    log: GatewayLog


def _profiles(mock_url: str) -> list[dict[str, Any]]:
    return [
        mock_profile(BUFFERED_PROFILE, "openai", mock_url),
        mock_profile(WINDOWED_PROFILE, "openai", mock_url, release="windowed"),
    ]


@contextlib.contextmanager
def running_stack(secret_count: int, pinning: wire_bench.Pinning) -> Iterator[StreamStack]:
    """The mock provider and a gateway with a buffered and a windowed profile against it."""
    with wire_bench.running_stack(secret_count, pinning, _profiles, prefix="stream-bench-") as stack:
        assert stack.gateway is not None and stack.workdir is not None
        yield StreamStack(stack, GatewayCpu(stack.gateway), GatewayLog(stack.workdir / "gateway.log"))


# --- client targets --------------------------------------------------------------------


class StreamTargets:
    """`direct` (wire_bench's session) and one HTTPS session per gateway profile."""

    def __init__(self, stack: wire_bench.Stack) -> None:
        self.base = wire_bench.Targets(stack, limit=8)  # for readiness and the mock's admin API
        tls = ssl.create_default_context(cafile=str(stack.env.ca))
        timeout = aiohttp.ClientTimeout(total=wire_bench.REQUEST_TIMEOUT_S)

        def gateway(name: str, profile: str) -> Target:
            connector = aiohttp.TCPConnector(limit=8, keepalive_timeout=wire_bench.KEEPALIVE_S, ssl=tls)
            session = aiohttp.ClientSession(connector=connector, timeout=timeout)
            headers = {
                "content-type": "application/json",
                "authorization": f"Bearer {stack.env.gateway_key}",
                PROFILE_HEADER: profile,
            }
            return Target(name, session, stack.gateway_url, headers)

        self.direct = self.base.direct
        self.buffered = gateway(BUFFERED, BUFFERED_PROFILE)
        self.windowed = gateway(WINDOWED, WINDOWED_PROFILE)

    @property
    def all(self) -> list[Target]:
        return [self.direct, self.buffered, self.windowed]

    async def close(self) -> None:
        await self.base.close()
        await self.buffered.session.close()
        await self.windowed.session.close()


# --- measurement -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One stream's timings, from just before the request was sent."""

    total_ms: float
    first_byte_ms: float
    first_content_ms: float


@dataclass(frozen=True)
class Response:
    sample: Sample | None
    body: bytes
    error: str | None


async def stream_once(target: Target, body: bytes) -> Response:
    """Send one streamed request and read the response as it arrives."""
    start = time.perf_counter()
    first_byte: float | None = None
    first_content: float | None = None
    received = bytearray()
    try:
        async with target.session.post(target.base_url + wire_bench.CHAT_PATH, data=body, headers=target.headers) as r:
            if r.status != 200:
                payload = await r.read()
                return Response(None, payload, f"HTTP {r.status}: {payload[:300]!r}")
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                if not chunk:
                    continue
                if first_byte is None:
                    first_byte = now
                scan_from = max(0, len(received) - CONTENT_LOOKBEHIND)
                received += chunk
                if first_content is None and CONTENT_RE.search(received, scan_from):
                    first_content = now
            end = time.perf_counter()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Response(None, bytes(received), f"{type(exc).__name__}: {exc}")
    payload = bytes(received)
    if not payload.rstrip().endswith(DONE):
        return Response(None, payload, f"no {DONE.decode()} at the end: ...{payload[-200:]!r}")
    if first_byte is None or first_content is None:
        return Response(None, payload, "no content text in the stream")
    ms = 1000.0
    return Response(Sample((end - start) * ms, (first_byte - start) * ms, (first_content - start) * ms), payload, None)


def stream_text(payload: bytes) -> str:
    """The chat content deltas of an SSE body, joined."""
    parts: list[str] = []
    for line in payload.splitlines():
        if not line.startswith(b"data:") or line.strip() == DONE:
            continue
        event = json.loads(line[len(b"data:") :])
        for choice in event.get("choices") or []:
            parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


@dataclass
class Measurement:
    """Everything measured for one (workload, target) over its timed rounds."""

    samples: list[Sample] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    error_kinds: Counter[str] = field(default_factory=Counter)
    cpu_s: float | None = None  # the gateway's CPU time over the timed rounds (gateway targets)

    def record_error(self, error: str) -> None:
        self.errors += 1
        if error in self.error_kinds or len(self.error_kinds) < MAX_ERROR_KINDS:
            self.error_kinds[error] += 1


async def run_round(target: Target, body: bytes, bound: Bound, into: Measurement, *, timed: bool) -> None:
    """Sequential requests until the bound; samples kept only when `timed` (errors always)."""
    deadline = time.perf_counter() + bound.seconds
    sent = 0
    while time.perf_counter() < deadline and (bound.requests is None or sent < bound.requests):
        response = await stream_once(target, body)
        sent += 1
        if response.error is not None:
            into.record_error(response.error)
        elif timed and response.sample is not None:
            into.samples.append(response.sample)
    if timed:
        into.requests += sent


@dataclass
class Probe:
    response_bytes: int
    events: int
    text_ok: bool


async def probe(target: Target, workload: StreamWorkload, body: bytes, into: Measurement) -> Probe:
    """One untimed response per target: its size, its events, and its text against the scenario's."""
    response = await stream_once(target, body)
    if response.error is not None:
        into.record_error(response.error)
        return Probe(len(response.body), 0, False)
    events = sum(1 for line in response.body.splitlines() if line.startswith(b"data:"))
    text_ok = stream_text(response.body) == workload.text
    if not text_ok:
        into.record_error("probe: the streamed text differs from the scenario's")
    return Probe(len(response.body), events, text_ok)


@dataclass
class WorkloadResult:
    workload: StreamWorkload
    rounds: int
    measurements: dict[str, Measurement]
    probes: dict[str, Probe]
    window: WindowFacts | None = None


async def run_workload(
    targets: StreamTargets, gateway: GatewayCpu, workload: StreamWorkload, rounds: int
) -> WorkloadResult:
    """Register the scenario, probe and warm up every target, then interleave the timed rounds."""
    body = wire_bench.stream_body()
    await wire_bench.mock_admin(targets.direct, "POST", "/_mock/scenarios", workload.scenario())
    measurements = {t.name: Measurement() for t in targets.all}
    probes = {t.name: await probe(t, workload, body, measurements[t.name]) for t in targets.all}
    async with wire_bench.mock_records_kept_small(targets.base):
        for target in targets.all:
            await run_round(target, body, workload.warmup, measurements[target.name], timed=False)
        for _ in range(rounds):
            for target in targets.all:
                m = measurements[target.name]
                before = gateway.seconds()
                await run_round(target, body, workload.round, m, timed=True)
                if target is not targets.direct:
                    m.cpu_s = (m.cpu_s or 0.0) + gateway.seconds() - before
    return WorkloadResult(workload, rounds, measurements, probes)


# --- statistics and report -------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    ok: int
    errors: int
    p50_total_ms: float | None
    p90_total_ms: float | None
    p50_first_byte_ms: float | None
    p90_first_byte_ms: float | None
    p50_first_content_ms: float | None
    p90_first_content_ms: float | None
    gateway_cpu_ms_per_stream: float | None
    total_ratio: float | None = None  # p50 total / direct's
    first_byte_added_ms: float | None = None  # p50 first byte - direct's
    first_content_added_ms: float | None = None  # p50 first content - direct's


def _minus(a: float | None, b: float | None) -> float | None:
    return a - b if a is not None and b is not None else None


def summarize(result: WorkloadResult) -> dict[str, Stats]:
    stats: dict[str, Stats] = {}
    for name, m in result.measurements.items():
        totals = [s.total_ms for s in m.samples]
        firsts = [s.first_byte_ms for s in m.samples]
        contents = [s.first_content_ms for s in m.samples]
        cpu = m.cpu_s * 1000 / m.requests if m.cpu_s is not None and m.requests else None
        stats[name] = Stats(
            len(m.samples),
            m.errors,
            wire_bench.percentile(totals, 50),
            wire_bench.percentile(totals, 90),
            wire_bench.percentile(firsts, 50),
            wire_bench.percentile(firsts, 90),
            wire_bench.percentile(contents, 50),
            wire_bench.percentile(contents, 90),
            cpu,
        )
    direct = stats[DIRECT]
    for name, s in stats.items():
        if name == DIRECT:
            continue
        ratio = s.p50_total_ms / direct.p50_total_ms if s.p50_total_ms and direct.p50_total_ms else None
        stats[name] = Stats(
            **{
                **asdict(s),
                "total_ratio": ratio,
                "first_byte_added_ms": _minus(s.p50_first_byte_ms, direct.p50_first_byte_ms),
                "first_content_added_ms": _minus(s.p50_first_content_ms, direct.p50_first_content_ms),
            }
        )
    return stats


def _fmt(value: float | None, spec: str, suffix: str = "", none: str = "-") -> str:
    return none if value is None else format(value, spec) + suffix


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return [line, rule, *(b + " |" for b in body)]


def format_tables(result: WorkloadResult, stats: dict[str, Stats]) -> str:
    w = result.workload
    probes = ", ".join(f"{name} {p.response_bytes:,} B / {p.events} events" for name, p in result.probes.items())
    main = _markdown(
        [
            "target",
            "p50 total ms",
            "ratio vs direct",
            "p50 first byte ms",
            "p50 first content ms",
            "gateway CPU ms/stream",
        ],
        [
            [
                name,
                _fmt(s.p50_total_ms, ".2f"),
                _fmt(s.total_ratio, ".2f", "x", none="1.00x" if name == DIRECT else "-"),
                _fmt(s.p50_first_byte_ms, ".2f"),
                _fmt(s.p50_first_content_ms, ".2f"),
                _fmt(s.gateway_cpu_ms_per_stream, ".2f", none="n/a"),
            ]
            for name, s in stats.items()
        ],
    )
    detail = _markdown(
        [
            "target",
            "ok",
            "err",
            "p90 total ms",
            "p90 first byte ms",
            "p90 first content ms",
            "first byte added ms",
            "first content added ms",
        ],
        [
            [
                name,
                str(s.ok),
                str(s.errors),
                _fmt(s.p90_total_ms, ".2f"),
                _fmt(s.p90_first_byte_ms, ".2f"),
                _fmt(s.p90_first_content_ms, ".2f"),
                _fmt(s.first_byte_added_ms, "+.2f"),
                _fmt(s.first_content_added_ms, "+.2f"),
            ]
            for name, s in stats.items()
        ],
    )
    return "\n".join(
        [
            f"### {w.name}: {w.describe()}",
            f"{result.rounds} round(s) x {w.round.describe()} per target, c=1, "
            f"after a {w.warmup.describe()} warm-up; response: {probes}",
            *([result.window.describe()] if result.window else []),
            "",
            *main,
            "",
            *detail,
        ]
    )


def write_json(
    path: Path, info: dict[str, Any], results: list[WorkloadResult], stats: dict[str, dict[str, Stats]], errors: int
) -> None:
    document = {
        "machine": info,
        "workloads": [
            {
                "name": r.workload.name,
                "scenario": r.workload.describe(),
                "rounds": r.rounds,
                "round": r.workload.round.describe(),
                "warmup": r.workload.warmup.describe(),
                "probes": {name: asdict(p) for name, p in r.probes.items()},
                "windowed": asdict(r.window) if r.window else None,
                "targets": {name: asdict(s) for name, s in stats[r.workload.name].items()},
            }
            for r in results
        ],
        "errors": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


# --- main ------------------------------------------------------------------------------


async def measure(streams: StreamStack, plan: list[StreamWorkload], rounds: int) -> list[WorkloadResult]:
    targets = StreamTargets(streams.stack)
    try:
        await wire_bench.wait_ready(streams.stack, targets.base)
        print(f"gateway process: {streams.gateway.verify()}\n", flush=True)
        results = []
        for workload in plan:
            streams.log.windowed_lines()  # skip the lines of the workloads before
            results.append(await run_workload(targets, streams.gateway, workload, rounds))
            streams.stack.processes.check_alive()
            await asyncio.sleep(LOG_SETTLE_S)
            results[-1].window = window_facts(streams.log.windowed_lines())
            print(format_tables(results[-1], summarize(results[-1])) + "\n", flush=True)
        return results
    finally:
        await targets.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, well under a minute")
    parser.add_argument("--rounds", type=int, help="timed rounds per target (default 5, quick 2)")
    parser.add_argument("--secrets", type=int, default=DEFAULT_SECRETS, help="secret values to configure")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.rounds < 1 or args.secrets < 0:
        parser.error("--rounds must be >= 1 and --secrets >= 0")
    return args


@wire_bench.bench_main("stream_bench")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wire_bench.exit_on_sigterm()
    pinning = wire_bench.pin_client()
    modes = (
        "strict (before_send=enforce, before_release=enforce), full catalogue; profiles bench-buffered + bench-windowed"
    )
    info = wire_bench.machine_info(pinning, args.secrets) | {
        "modes": modes,
        "quick": args.quick,
        "rounds": args.rounds,
    }
    wire_bench.print_header(info, "wiregate stream benchmark")
    started = time.monotonic()
    with running_stack(args.secrets, pinning) as streams:
        results = asyncio.run(measure(streams, workloads(args.quick), args.rounds))
    stats = {r.workload.name: summarize(r) for r in results}
    print(f"Total time {time.monotonic() - started:.0f} s")
    errors = wire_bench.print_errors(results)
    if args.json:
        write_json(args.json, info, results, stats, errors)
        print(f"Results written to {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
