"""Wire benchmark: the gateway's added latency and throughput against the mock provider.

One run starts the bundled mock provider and a real `wiregate serve` (strict mode, secret-value
inspection on) as subprocesses, then sends the same request bodies, interleaved round by round,
to three targets:

* ``direct``         -- the mock provider itself (TCP, plain HTTP, the upstream key);
* ``gateway-https``  -- the gateway's HTTPS listener (trusting the generated dev CA);
* ``gateway-uds``    -- the gateway's Unix socket.

Pinning: the client (this process) and the mock share core 0, the gateway runs on core 1.

    .venv/bin/python bench/wire_bench.py [--quick] [--rounds N] [--secrets N] [--json PATH]

Timing results are informational: the exit status is non-zero only when a request failed
(anything but a 200) or the set-up did not come up.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import json
import math
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import ssl
import string
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.harness import Env, build_env, mock_profile  # noqa: E402

MODEL = "gpt-4.1"
CHAT_PATH = "/v1/chat/completions"
STREAM_SCENARIO = "bench-stream"
CLIENT_CORE, MOCK_CORE, GATEWAY_CORE = 0, 0, 1
READY_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 2.0  # one readiness probe
REQUEST_TIMEOUT_S = 60.0
KEEPALIVE_S = 120.0  # idle client connections outlive the other targets' rounds
# The speed issue's targets (informational: printed PASS / MISS, never failing the run)
ADDED_P50_TARGET_MS = 0.5  # 1 KB c=1, added p50 over direct
THROUGHPUT_TARGET_RPS = 2000.0  # 1 KB c=32, gateway on one core
ADDED_P50_200KB_TARGET_MS = 1.5  # 200 KB c=1, added p50 over direct
STREAM_RATIO_TARGET = 1.3  # 210-chunk stream c=1, p50 over direct's


class BenchError(RuntimeError):
    """The benchmark could not run (set-up failed, a process died)."""


# --- request bodies --------------------------------------------------------------------

SENTENCES = (
    "The committee met on Tuesday to review the budget for the coming year.",
    "Most of the discussion focused on the cost of repairing the roof over the east reading room.",
    "Several members pointed out that the heating system is now more than twenty years old.",
    "A volunteer offered to compare quotes from three local builders before the next meeting.",
    "Visitors have asked for longer opening hours on weekends, especially during exam season.",
    "The children's section will move to the ground floor so that families can reach it easily.",
    "Our delivery van covers the northern villages twice a week and returns by late afternoon.",
    "When the river floods in spring, the lower car park is closed and staff park by the school.",
    "The new catalogue lets readers reserve a title online and collect it at any branch.",
    "Late fees were abolished last autumn, and more books have come back on time since then.",
    "A small grant from the county paid for twelve new study desks and better lighting.",
    "The reading group chose a historical novel about a lighthouse keeper and his daughter.",
    "Please remember that the meeting room must be booked at least two days in advance.",
    "The printer on the first floor jams whenever someone feeds it heavier card.",
    "We are still looking for someone to lead the Saturday morning story hour.",
    "Attendance at the evening language classes doubled after they moved to the larger hall.",
    "The garden behind the building needs weeding before the summer fair in July.",
    "Donated books are sorted on Mondays, and worn copies go to the recycling centre.",
    "The local history archive holds maps of the town going back almost two centuries.",
    "Staff training on the new accessibility guidelines will take place over two afternoons.",
    "The coffee shop next door has agreed to serve drinks at the author talk in October.",
    "Each branch keeps a simple log of the questions visitors ask at the front desk.",
    "Parking permits for staff will be renewed at the start of the next financial year.",
    "The annual report will be printed in a larger font this time, after several requests.",
    "The wireless signal in the basement is weak, so a second access point is planned.",
)


def prose(chars: int, seed: int = 0, paragraph: int = 5) -> str:
    """Deterministic English prose of exactly `chars` characters (cut at the end)."""
    parts: list[str] = []
    size = 0
    for i in itertools.count():
        if size >= chars:
            break
        sentence = SENTENCES[(seed + 7 * i) % len(SENTENCES)]  # 7 is coprime with 25
        sep = "" if i == 0 else ("\n\n" if i % paragraph == 0 else " ")
        parts.append(sep + sentence)
        size += len(sep) + len(sentence)
    return "".join(parts)[:chars]


def _encode(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


def _sized(make: Callable[[int], dict[str, Any]], target_bytes: int) -> bytes:
    """Encode `make(budget)`, adjusting the prose budget until the body is ~`target_bytes`."""
    budget = target_bytes
    body = _encode(make(budget))
    for _ in range(4):
        budget += target_bytes - len(body)
        body = _encode(make(max(budget, 0)))
    return body


def chat_body(target_bytes: int) -> bytes:
    """A system + user message of ordinary prose."""

    def make(budget: int) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant for a town library."},
                {"role": "user", "content": prose(budget, seed=3, paragraph=1000)},
            ],
        }

    return _sized(make, target_bytes)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_catalogue",
            "description": "Search the library catalogue.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "branch": {"type": "string"},
                    "formats": {"type": "array", "items": {"type": "string"}},
                    "limit": {"type": "integer"},
                },
                "required": ["query"],
            },
        },
    },
]


def _words(index: int, count: int) -> str:
    return " ".join(SENTENCES[index % len(SENTENCES)].split()[:count])


def _tool_round(index: int, summary_chars: int) -> list[dict[str, Any]]:
    """One assistant tool call and its JSON result, as chat history."""
    call_id = f"call_bench_{index:03d}"
    arguments = {"query": _words(index, 6), "branch": "Riverside", "formats": ["book", "audiobook"], "limit": 8}
    results = [
        {
            "id": f"cat-{index:03d}-{n:02d}",
            "title": _words(index + n, 4),
            "available": n % 3 != 0,
            "copies": n + 1,
            "summary": prose(summary_chars // 8, seed=index + n),
        }
        for n in range(8)
    ]
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "search_catalogue", "arguments": json.dumps(arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"results": results})},
    ]


def long_chat_body(target_bytes: int) -> bytes:
    """Long prose in a few messages plus tool-call history (about a quarter of the bytes)."""

    def make(budget: int) -> dict[str, Any]:
        history = [m for i in range(4) for m in _tool_round(i, budget // 16)]
        return {
            "model": MODEL,
            "tools": TOOLS,
            "messages": [
                {"role": "system", "content": prose(budget // 10, seed=1)},
                {"role": "user", "content": prose(budget * 4 // 10, seed=2)},
                *history,
                {"role": "assistant", "content": prose(budget // 10, seed=4)},
                {"role": "user", "content": prose(budget // 6, seed=5)},
            ],
        }

    return _sized(make, target_bytes)


def stream_body() -> bytes:
    return _encode(
        {
            "model": MODEL,
            "stream": True,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant for a town library."},
                {"role": "user", "content": f"Summarise the minutes. mock-scenario:{STREAM_SCENARIO}"},
            ],
        }
    )


def stream_scenario(chunks: int, chunk_size: int = 8) -> dict[str, Any]:
    """Mock scenario: `chunks` SSE content events of `chunk_size` characters each."""
    return {"id": STREAM_SCENARIO, "steps": [{"text": prose(chunks * chunk_size, seed=9), "chunk_size": chunk_size}]}


# --- workloads -------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """A round ends after `requests` requests (if set) or `seconds`, whichever comes first."""

    requests: int | None
    seconds: float

    def describe(self) -> str:
        return f"{self.requests} requests" if self.requests else f"{self.seconds:g} s"


@dataclass(frozen=True)
class Workload:
    name: str
    body: bytes
    concurrency: int
    round: Bound
    warmup: Bound
    stream: bool = False


def workloads(quick: bool) -> list[Workload]:
    def pick(full: Bound, smoke: Bound) -> Bound:
        return smoke if quick else full

    small, large, stream = chat_body(1024), long_chat_body(200 * 1024), stream_body()
    return [
        Workload("chat-1KB c=1", small, 1, pick(Bound(300, 15), Bound(100, 3)), pick(Bound(50, 5), Bound(20, 2))),
        Workload(
            "chat-1KB c=32", small, 32, pick(Bound(None, 3), Bound(None, 1)), pick(Bound(None, 1), Bound(None, 0.5))
        ),
        Workload("chat-200KB c=1", large, 1, pick(Bound(100, 20), Bound(30, 3)), pick(Bound(10, 5), Bound(5, 2))),
        Workload(
            "stream-200 c=1", stream, 1, pick(Bound(60, 20), Bound(25, 3)), pick(Bound(10, 5), Bound(5, 2)), stream=True
        ),
    ]


# --- processes and configuration -------------------------------------------------------


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago: the sockets are held
    together until all are chosen (closed one by one, the kernel may hand out the same
    port twice, and two servers of one run would then race for it)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def secret_values(count: int) -> list[str]:
    """Random 20-40 character tokens: configured as secrets, never present in the traffic."""
    alphabet = string.ascii_letters + string.digits + "-_"
    return ["".join(secrets.choice(alphabet) for _ in range(20 + secrets.randbelow(21))) for _ in range(count)]


def set_https_port(config: Path, port: int) -> None:
    text = config.read_text()
    pattern = r"(\[server\.https\][^\[]*?^port\s*=\s*)\d+"
    new, replaced = re.subn(pattern, rf"\g<1>{port}", text, count=1, flags=re.M | re.S)
    if replaced != 1:
        raise BenchError(f"no [server.https] port in {config}")
    config.write_text(new)


def uds_path(config: Path) -> Path:
    with config.open("rb") as fh:
        path = Path(tomllib.load(fh)["server"]["uds"]["path"])
    return path if path.is_absolute() else config.parent / path


@dataclass(frozen=True)
class Pinning:
    applied: bool
    how: str

    def describe(self) -> str:
        if not self.applied:
            return f"not applied ({self.how})"
        return f"applied via {self.how}: core {CLIENT_CORE} = client + mock, core {GATEWAY_CORE} = gateway"


def pin_client() -> Pinning:
    """Pin this process to the client core, if the cores of the layout are available."""
    try:
        available = os.sched_getaffinity(0)
    except (AttributeError, OSError) as exc:
        return Pinning(False, f"no sched_setaffinity: {exc}")
    if not {CLIENT_CORE, MOCK_CORE, GATEWAY_CORE} <= available:
        return Pinning(False, f"needs cores 0 and 1, have {sorted(available)}")
    os.sched_setaffinity(0, {CLIENT_CORE})
    return Pinning(True, "taskset" if shutil.which("taskset") else "sched_setaffinity")


def _libc_prctl() -> Callable[[int, int], int] | None:
    with contextlib.suppress(OSError, AttributeError):
        prctl: Callable[[int, int], int] = ctypes.CDLL(None, use_errno=True).prctl
        return prctl
    return None


_PRCTL = _libc_prctl()
_PR_SET_PDEATHSIG = 1


def _child_setup(core: int | None) -> Callable[[], None]:
    """Runs in the child before exec: die with this process; pin if taskset is missing."""

    def setup() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if core is not None:
            os.sched_setaffinity(0, {core})

    return setup


class Processes:
    """Subprocesses this benchmark started; all stopped on `stop_all` (and at exit)."""

    def __init__(self, pin: bool) -> None:
        self._pin = pin
        self._taskset = shutil.which("taskset")
        self._running: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        atexit.register(self.stop_all)

    def start(self, name: str, argv: list[str], core: int, log: Path) -> subprocess.Popen[bytes]:
        fallback_core: int | None = None
        if self._pin and self._taskset:
            argv = [self._taskset, "-c", str(core), *argv]
        elif self._pin:
            fallback_core = core
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(fallback_core),
            )
        self._running.append((name, proc, log))
        return proc

    def check_alive(self) -> None:
        for name, proc, log in self._running:
            if proc.poll() is not None:
                raise BenchError(f"{name} exited with {proc.returncode}:\n{_tail(log)}")

    def stop_all(self) -> None:
        while self._running:
            _, proc, _ = self._running.pop()
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _tail(log: Path, lines: int = 20) -> str:
    """The end of a process's output, without the gateway's one-line-per-request log."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no output)"
    kept = [line for line in text.splitlines() if '"event":"request"' not in line]
    return "\n".join(kept[-lines:]) or "(no output)"


CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/<pid>/stat from its third field on (the command name may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()


def _cpu(fields: list[str]) -> float:
    return (int(fields[14 - 3]) + int(fields[15 - 3])) / CLOCK_TICK  # utime + stime


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of one process so far, from /proc."""
    return _cpu(_stat(pid))


def tree_cpu_seconds(root: int) -> float:
    """CPU time (user + system) of `root` and every process below it, from /proc."""
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
        except OSError:
            continue  # gone meanwhile
        parent[int(entry.name)] = int(fields[4 - 3])
        spent[int(entry.name)] = _cpu(fields)
    tree, grew = {root}, True
    while grew:
        below = {pid for pid, ppid in parent.items() if ppid in tree} - tree
        tree |= below
        grew = bool(below)
    return sum(spent.get(pid, 0.0) for pid in tree)


@dataclass
class Stack:
    """The temporary configuration directory, the mock provider and the gateway."""

    env: Env
    mock_url: str
    gateway_url: str
    uds: Path
    processes: Processes
    gateway: subprocess.Popen[bytes] | None = None  # the gateway process (its /proc entry)
    workdir: Path | None = None  # logs: mock.log, gateway.log


def bench_profiles(mock_url: str) -> list[dict[str, Any]]:
    return [mock_profile("bench-openai", "openai", mock_url)]


@contextlib.contextmanager
def running_stack(
    secret_count: int,
    pinning: Pinning,
    profiles: Callable[[str], list[dict[str, Any]]] = bench_profiles,
    prefix: str = "wire-bench-",
) -> Iterator[Stack]:
    """The mock provider and a gateway in front of it with `profiles(mock_url)` (retry and
    timeouts left at the product defaults)."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)
    processes = Processes(pin=pinning.applied)
    try:
        mock_port, gateway_port = free_ports(2)
        mock_url = f"http://127.0.0.1:{mock_port}"
        docs = profiles(mock_url)
        for profile in docs:
            for tuned_for_tests in ("retry", "timeouts"):  # benchmark with the product defaults
                profile.pop(tuned_for_tests, None)
        env = build_env(workdir / "config", mock_url, secrets_=secret_values(secret_count), profiles=docs)
        set_https_port(env.config, gateway_port)
        wiregate = str(Path(sys.executable).with_name("wiregate"))
        mock_argv = [wiregate, "mock-provider", "--port", str(mock_port), "--api-key", env.upstream_key]
        processes.start("mock provider", mock_argv, MOCK_CORE, workdir / "mock.log")
        gateway = processes.start(
            "gateway", [wiregate, "serve", "--config", str(env.config)], GATEWAY_CORE, workdir / "gateway.log"
        )
        url = f"https://127.0.0.1:{gateway_port}"
        yield Stack(env, mock_url, url, uds_path(env.config), processes, gateway, workdir)
    finally:
        processes.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


# --- client targets --------------------------------------------------------------------


@dataclass
class Target:
    name: str
    session: aiohttp.ClientSession
    base_url: str
    headers: dict[str, str]

    async def get(self, path: str) -> int:
        async with self.session.get(self.base_url + path) as resp:
            await resp.read()
            return resp.status


class Targets:
    """The three client sessions (keep-alive, connection limit above the concurrency)."""

    def __init__(self, stack: Stack, limit: int) -> None:
        tls = ssl.create_default_context(cafile=str(stack.env.ca))
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

        def session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
            return aiohttp.ClientSession(connector=connector, timeout=timeout)

        def headers(key: str) -> dict[str, str]:
            return {"content-type": "application/json", "authorization": f"Bearer {key}"}

        direct = aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S)
        https = aiohttp.TCPConnector(limit=limit, keepalive_timeout=KEEPALIVE_S, ssl=tls)
        uds = aiohttp.UnixConnector(str(stack.uds), limit=limit, keepalive_timeout=KEEPALIVE_S)
        gateway_key = stack.env.gateway_key
        self.direct = Target("direct", session(direct), stack.mock_url, headers(stack.env.upstream_key))
        self.https = Target("gateway-https", session(https), stack.gateway_url, headers(gateway_key))
        self.uds = Target("gateway-uds", session(uds), "http://localhost", headers(gateway_key))

    @property
    def all(self) -> list[Target]:
        return [self.direct, self.https, self.uds]

    async def close(self) -> None:
        for target in self.all:
            await target.session.close()


async def wait_ready(stack: Stack, targets: Targets) -> None:
    checks = [(targets.direct, "/_mock/healthz"), (targets.https, "/healthz"), (targets.uds, "/healthz")]
    await wait_answering(stack.processes, checks)
    if stack.gateway is not None:
        await wait_quiet(stack.gateway.pid)


async def wait_answering(processes: Processes, checks: Sequence[tuple[Target, str]]) -> None:
    """Until each (target, path) answers 200, within READY_TIMEOUT_S for all of them."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    for target, path in checks:
        while True:
            processes.check_alive()
            # each probe bounded: a port some other listener took accepts and never answers, and
            # the server that wanted it has exited meanwhile (check_alive says so on the next turn)
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                if await asyncio.wait_for(target.get(path), PROBE_TIMEOUT_S) == 200:
                    break
            if time.monotonic() > deadline:
                raise BenchError(f"{target.name} not ready after {READY_TIMEOUT_S:g} s")
            await asyncio.sleep(0.05)


QUIET_SHARE = 0.05  # of one core: the gateway's tree is at rest below it
QUIET_WINDOW_S = 0.5
QUIET_TIMEOUT_S = 120.0


async def wait_quiet(*roots: int) -> float:
    """Wait until the process trees under `roots` are at rest; returns the seconds waited.
    After `healthz` answers, a gateway's check workers still load and compile the runtime for
    seconds (at full speed on both cores of a small machine), and a server may go on working
    after its own requests: either would land in whatever is measured next."""
    started = time.monotonic()
    while True:
        before = sum(tree_cpu_seconds(root) for root in roots)
        await asyncio.sleep(QUIET_WINDOW_S)
        if sum(tree_cpu_seconds(root) for root in roots) - before <= QUIET_SHARE * QUIET_WINDOW_S:
            return time.monotonic() - started
        if time.monotonic() - started > QUIET_TIMEOUT_S:
            raise BenchError(f"the processes did not come to rest within {QUIET_TIMEOUT_S:g} s")


async def mock_admin(target: Target, method: str, path: str, payload: Any = None) -> None:
    try:
        async with target.session.request(method, target.base_url + path, json=payload) as resp:
            if resp.status != 200:
                raise BenchError(f"mock {method} {path}: {resp.status} {await resp.text()}")
    except aiohttp.ClientError as exc:
        raise BenchError(f"mock {method} {path}: {type(exc).__name__}: {exc}") from exc


# --- measurement -----------------------------------------------------------------------

MAX_ERROR_KINDS = 5


@dataclass
class Measurement:
    """Everything measured for one (workload, target), summed over the timed rounds."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0
    error_kinds: Counter[str] = field(default_factory=Counter)  # the first few distinct ones
    cpu_s: float = 0.0  # the serving process's CPU over the timed rounds (when measured)

    def record(self, ms: float, error: str | None) -> None:
        if error is None:
            self.latencies_ms.append(ms)
        else:
            self.record_error(error)

    def record_error(self, error: str, count: int = 1) -> None:
        self.errors += count
        if error in self.error_kinds or len(self.error_kinds) < MAX_ERROR_KINDS:
            self.error_kinds[error] += count

    def add(self, other: Measurement, *, timings: bool = True) -> None:
        """Sum `other` into this one; without `timings` only its errors count (warm-up)."""
        if timings:
            self.latencies_ms += other.latencies_ms
            self.elapsed_s += other.elapsed_s
            self.cpu_s += other.cpu_s
        for error, count in other.error_kinds.items():
            self.record_error(error, count)
        self.errors += other.errors - other.error_kinds.total()


async def send(target: Target, body: bytes) -> tuple[float, bytes, str | None]:
    """One request, timed until the whole response body is read: (ms, body, error)."""
    start = time.perf_counter()
    try:
        async with target.session.post(target.base_url + CHAT_PATH, data=body, headers=target.headers) as resp:
            payload = await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0.0, b"", f"{type(exc).__name__}: {exc}"
    ms = (time.perf_counter() - start) * 1000
    if status != 200:
        return ms, payload, f"HTTP {status}: {payload[:300]!r}"
    return ms, payload, None


async def run_round(target: Target, workload: Workload, bound: Bound) -> Measurement:
    result = Measurement()
    issued = itertools.count()
    start = time.perf_counter()
    deadline = start + bound.seconds

    async def worker() -> None:
        while time.perf_counter() < deadline and (bound.requests is None or next(issued) < bound.requests):
            ms, _, error = await send(target, workload.body)
            result.record(ms, error)

    await asyncio.gather(*(worker() for _ in range(workload.concurrency)))
    result.elapsed_s = time.perf_counter() - start
    return result


@dataclass
class Probe:
    """One response per target, sent before timing: its size and SSE data events."""

    response_bytes: int
    events: int


async def probe(target: Target, workload: Workload, into: Measurement) -> Probe:
    _, payload, error = await send(target, workload.body)
    if error is not None:
        into.record_error(error)
    events = sum(1 for line in payload.splitlines() if line.startswith(b"data:"))
    return Probe(len(payload), events)


@dataclass
class WorkloadResult:
    workload: Workload
    rounds: int
    measurements: dict[str, Measurement]
    probes: dict[str, Probe]


async def run_workload(
    targets: Targets, workload: Workload, rounds: int, cpu: Callable[[Target], float | None] | None = None
) -> WorkloadResult:
    """Probe, warm up every target, then interleave the timed rounds target by target. With
    `cpu`, each timed round also takes the CPU seconds `cpu(target)` reads (None: not measured
    for that target) before and after it."""
    measurements = {t.name: Measurement() for t in targets.all}
    probes = {t.name: await probe(t, workload, measurements[t.name]) for t in targets.all}
    async with mock_records_kept_small(targets):
        for target in targets.all:
            warmup = await run_round(target, workload, workload.warmup)
            measurements[target.name].add(warmup, timings=False)
        for _ in range(rounds):
            for target in targets.all:
                before = cpu(target) if cpu is not None else None
                timed = await run_round(target, workload, workload.round)
                after = cpu(target) if cpu is not None else None
                if before is not None and after is not None:
                    timed.cpu_s = after - before
                measurements[target.name].add(timed)
    return WorkloadResult(workload, rounds, measurements, probes)


MOCK_CLEAR_EVERY_S = 0.25


@contextlib.asynccontextmanager
async def mock_records_kept_small(targets: Targets) -> AsyncIterator[None]:
    """The mock records every request (body included) and finds a record by a linear scan,
    so during a long round it would slow down as it goes: empty the record regularly."""

    async def clear_forever() -> None:
        while True:
            await mock_admin(targets.direct, "DELETE", "/_mock/requests")
            await asyncio.sleep(MOCK_CLEAR_EVERY_S)

    task = asyncio.create_task(clear_forever())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- statistics and report -------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = min(max(1, math.ceil(q / 100 * len(ordered))), len(ordered))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Stats:
    ok: int
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    rps: float | None
    p50_ratio: float | None = None
    rps_ratio: float | None = None
    added_p50_ms: float | None = None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(result: WorkloadResult) -> dict[str, Stats]:
    stats: dict[str, Stats] = {}
    for name, m in result.measurements.items():
        ok = len(m.latencies_ms)
        stats[name] = Stats(
            ok,
            m.errors,
            percentile(m.latencies_ms, 50),
            percentile(m.latencies_ms, 99),
            ok / m.elapsed_s if m.elapsed_s else None,
        )
    direct = stats["direct"]
    for name, s in stats.items():
        if name != "direct" and s.p50_ms is not None and direct.p50_ms is not None:
            stats[name] = dataclasses.replace(
                s,
                p50_ratio=_ratio(s.p50_ms, direct.p50_ms),
                rps_ratio=_ratio(s.rps, direct.rps),
                added_p50_ms=s.p50_ms - direct.p50_ms,
            )
    return stats


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def format_table(result: WorkloadResult, stats: dict[str, Stats]) -> str:
    w = result.workload
    probes = ", ".join(
        f"{name} {p.response_bytes:,} B" + (f" / {p.events} events" if w.stream else "")
        for name, p in result.probes.items()
    )
    lines = [
        f"== {w.name}: body {len(w.body):,} B, concurrency {w.concurrency}, "
        f"{result.rounds} round(s) x {w.round.describe()} per target "
        f"(after a {w.warmup.describe()} warm-up)",
        f"   response: {probes}",
        f"   {'target':<14}{'ok':>7}{'err':>5}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}"
        f"{'p50 x':>8}{'req/s x':>9}{'added p50':>11}",
    ]
    for name, s in stats.items():
        lines.append(
            f"   {name:<14}{s.ok:>7}{s.errors:>5}{_fmt(s.p50_ms, '.3f'):>9}"
            f"{_fmt(s.p99_ms, '.3f'):>9}{_fmt(s.rps, ',.0f'):>9}"
            f"{_fmt(s.p50_ratio, '.2f', 'x'):>8}{_fmt(s.rps_ratio, '.2f', 'x'):>9}"
            f"{_fmt(s.added_p50_ms, '+.3f', ' ms'):>11}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Check:
    title: str
    target: str
    measured: str
    passed: bool


def target_checks(stats: dict[str, dict[str, Stats]]) -> list[Check]:
    """The speed issue's targets, per gateway listener (a workload this run did not measure
    is left out)."""
    targets: list[tuple[str, str, Callable[[Stats], float | None], tuple[str, str], Callable[[float], bool]]] = [
        (
            "chat-1KB c=1",
            f"added p50 <= {ADDED_P50_TARGET_MS:g} ms at 1 KB c=1",
            lambda s: s.added_p50_ms,
            ("+.3f", " ms"),
            lambda v: v <= ADDED_P50_TARGET_MS,
        ),
        (
            "chat-200KB c=1",
            f"added p50 <= {ADDED_P50_200KB_TARGET_MS:g} ms at 200 KB c=1",
            lambda s: s.added_p50_ms,
            ("+.3f", " ms"),
            lambda v: v <= ADDED_P50_200KB_TARGET_MS,
        ),
        (
            "chat-1KB c=32",
            f">= {THROUGHPUT_TARGET_RPS:,.0f} req/s at c=32, gateway on one core",
            lambda s: s.rps,
            (",.0f", " req/s"),
            lambda v: v >= THROUGHPUT_TARGET_RPS,
        ),
        (
            "stream-200 c=1",
            f"stream p50 <= {STREAM_RATIO_TARGET:g}x direct's",
            lambda s: s.p50_ratio,
            (".2f", "x"),
            lambda v: v <= STREAM_RATIO_TARGET,
        ),
    ]
    checks = []
    for workload, title, read, (spec, suffix), meets in targets:
        for name in ("gateway-https", "gateway-uds"):
            if name not in stats.get(workload, {}):
                continue
            value = read(stats[workload][name])
            checks.append(Check(title, name, _fmt(value, spec, suffix), value is not None and meets(value)))
    return checks


def machine_info(pinning: Pinning, secret_count: int) -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "aiohttp": aiohttp.__version__,
        "pinning": pinning.describe(),
        "pinning_applied": pinning.applied,
        "secret_values": secret_count,
        "modes": "before_send=enforce, before_release=enforce (strict, buffered)",
    }


def print_header(info: dict[str, Any], title: str = "wiregate wire benchmark") -> None:
    print(title)
    print(f"  machine: {info['nproc']} CPUs, {info['cpu_model']}")
    print(f"  python {info['python']}, aiohttp {info['aiohttp']}")
    print(f"  pinning: {info['pinning']}")
    print(f"  gateway: {info['modes']}, {info['secret_values']} secret values, inspection on")
    print(flush=True)


def print_checks(checks: list[Check]) -> None:
    print("Targets (informational, never fail the run):")
    for c in checks:
        verdict = "PASS" if c.passed else "MISS"
        print(f"  {c.title:<48} {c.target:<14} {c.measured:>14}  {verdict}")


def print_errors(results: Sequence[Any]) -> int:
    """Every failed request of `results` (anything with `.workload.name` and
    `.measurements`, a name → measurement with `errors` and `error_kinds`), on stderr."""
    total = 0
    for result in results:
        for name, m in result.measurements.items():
            total += m.errors
            for error, count in m.error_kinds.items():
                print(f"ERROR [{result.workload.name} / {name}] x{count}: {error}", file=sys.stderr)
    if total:
        print(f"FAILED: {total} request(s) did not return 200", file=sys.stderr)
    return total


def write_json(
    path: Path,
    info: dict[str, Any],
    results: list[WorkloadResult],
    stats: dict[str, dict[str, Stats]],
    checks: list[Check],
    errors: int,
) -> None:
    document = {
        "machine": info,
        "workloads": [
            {
                "name": r.workload.name,
                "body_bytes": len(r.workload.body),
                "concurrency": r.workload.concurrency,
                "rounds": r.rounds,
                "round": r.workload.round.describe(),
                "targets": {name: vars(s) for name, s in stats[r.workload.name].items()},
            }
            for r in results
        ],
        "checks": [vars(c) for c in checks],
        "errors": errors,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")


# --- main ------------------------------------------------------------------------------


async def measure(stack: Stack, plan: list[Workload], rounds: int) -> list[WorkloadResult]:
    limit = max(64, 2 * max(w.concurrency for w in plan))
    targets = Targets(stack, limit)
    try:
        await wait_ready(stack, targets)
        await mock_admin(targets.direct, "POST", "/_mock/scenarios", stream_scenario(200))
        results = []
        for workload in plan:
            results.append(await run_workload(targets, workload, rounds))
            stack.processes.check_alive()
            print(format_table(results[-1], summarize(results[-1])) + "\n", flush=True)
        return results
    finally:
        await targets.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run, ~15-20 s")
    parser.add_argument("--rounds", type=int, help="timed rounds per target (default 5, quick 2)")
    parser.add_argument("--secrets", type=int, default=20, help="secret values to configure")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 2 if args.quick else 5
    if args.rounds < 1 or args.secrets < 0:
        parser.error("--rounds must be >= 1 and --secrets >= 0")
    return args


class Main(Protocol):
    def __call__(self, argv: list[str] | None = None) -> int: ...


def bench_main(name: str) -> Callable[[Main], Main]:
    """A benchmark's `main`: a set-up failure (`BenchError`) is printed and exits 1, an
    interrupt exits 130."""

    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except BenchError as exc:
                print(f"{name}: {exc}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                print(f"{name}: interrupted", file=sys.stderr)
                return 130

        return run

    return wrap


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the `finally` blocks stop the subprocesses."""

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@bench_main("wire_bench")
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    pinning = pin_client()
    info = machine_info(pinning, args.secrets) | {"quick": args.quick, "rounds": args.rounds}
    print_header(info)
    started = time.monotonic()
    with running_stack(args.secrets, pinning) as stack:
        results = asyncio.run(measure(stack, workloads(args.quick), args.rounds))
    stats = {r.workload.name: summarize(r) for r in results}
    checks = target_checks(stats)
    print_checks(checks)
    print(f"\nTotal time {time.monotonic() - started:.0f} s")
    errors = print_errors(results)
    if args.json:
        write_json(args.json, info, results, stats, checks, errors)
        print(f"Results written to {args.json}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
