"""Context routes over HTTP: wiregate against the real PowerContext 1.4.1 server, same run.

    .venv/bin/python bench/context_bench.py [--sizes 1000,10000,100000] [--pc-fill-budget 180]
        [--no-snapshots] [--corpus pc45|zipf] [--json PATH]

Needs the PowerContext venv of tests/pcserver.py (built on first use, about 1-1.5 min). Both
servers get the same deterministic synthetic atomic memories (context_store_bench's 45-word
vocabulary, fixed seed; `--corpus zipf`: its 10,000 words drawn by Zipf's law) in one scope,
through their HTTP APIs, except wiregate's memories beyond 10,000, which go straight through
its service layer into its SQLite file while the gateway is stopped (synchronous=NORMAL, write
inspection skipped). PowerContext is filled past 1,000 only when the rate measured so far says
it takes at most --pc-fill-budget seconds. A PowerContext store filled to a size is kept in
.cache/powercontext-1.4.1/bench/[zipf-]seed<S>-<size>/
and restored by later runs instead of being filled again (--no-snapshots: neither).

Per store size and server, sequential requests on one keep-alive connection, in rounds that
alternate between the servers, each segment started with every server at rest (past a
gateway's idle FTS merge, see `at_rest`): prepare p50/p99 (wiregate also with include_receipt, which
PowerContext does not have), write p50 (a new memory; also on a second wiregate process with
`[store] sqlite_sync = "normal"`, whose store holds only those writes), search p50 per mode (/v1/memory/search
auto and fts, /v1/atomic-memory/search text; neither server has embeddings configured, so
vector and hybrid are not measured: wiregate refuses them with 422, PowerContext answers 500).
wiregate is the real gateway process over HTTPS; PowerContext is `powercontext server run`
over loopback HTTP (its default SQLite storage). Ratio = PowerContext / wiregate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import random
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import context_store_bench  # noqa: E402
from wire_bench import _child_setup, free_port, set_https_port, tree_cpu_seconds, wait_quiet  # noqa: E402

from gateway.context.service import ContextService  # noqa: E402
from gateway.context.store.sqlite import MERGE_IDLE_S, SqliteContextStore, SqliteDatabase  # noqa: E402
from tests import pcserver  # noqa: E402
from tests.harness import build_env, mock_profile  # noqa: E402

SEED = 1435
HTTP_FILL_MAX = 10_000  # wiregate is filled over HTTP up to this many memories
CONCURRENCY = 8  # parallel writes while filling (PowerContext answers 503 when pushed harder)
WARMUP_N = 20
PREPARE_N = 200  # a p50 of 40 moved by a quarter with which queries they were (2026-12-03)
SEARCH_N = 60
WRITE_N = 100
ROUNDS = 2
PC_START_TIMEOUT = 600.0
SEARCHES = [("auto", "/v1/memory/search", "auto"), ("fts", "/v1/memory/search", "fts")]
SEARCHES.append(("atomic text", "/v1/atomic-memory/search", "text"))


def memories(count: int) -> list[tuple[str, str]]:
    rng = random.Random(SEED)
    out = []
    for i in range(count):
        kind = rng.choice(["fact", "decision"])
        out.append((kind, context_store_bench.memory_text(rng, i)))
    return out


def queries(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [context_store_bench.query(rng) for _ in range(count)]


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000


class Http:
    """The timing client: one aiohttp session, keep-alive, the same for both servers. (httpx,
    which this benchmark used first, spent about 0.8 ms of its own per request on this machine:
    wiregate's /healthz p50 1.38 ms through httpx against 0.62 ms through aiohttp, and a
    write 2.60 against 1.82 ms, one gateway, alternating requests, 2026-12-03.) The session is
    made on first use, inside the running loop."""

    def __init__(self, base_url: str, headers: dict[str, str], tls: ssl.SSLContext | None = None) -> None:
        self.base_url = base_url
        self._headers = headers
        self._tls = tls
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: Any) -> tuple[int, str]:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=60)
            self._session = aiohttp.ClientSession(headers=self._headers, timeout=timeout)
        async with self._session.post(self.base_url + path, json=body, ssl=self._tls or True) as r:
            return r.status, await r.text()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class Server:
    name: str
    http: Http
    scope: str = ""
    count: int = 0
    fill_s: float = 0.0
    samples: dict[str, list[float]] = field(default_factory=dict)
    pid: int | None = None  # its server process (a quiet neighbour is awaited before the other is timed)
    settle_s: float = 0.0  # waited, before this server's timed segments, for the others to go quiet
    others_cpu_s: float = 0.0  # CPU the other servers' processes used while this one was timed

    async def post(self, path: str, body: Any, expect: int = 200) -> Any:
        status, text = await self.http.post(path, body)
        if status != expect:
            raise RuntimeError(f"{self.name} {path}: {status} {text[:300]}")
        return json.loads(text)

    async def write(self, kind: str, text: str) -> None:
        body = {"family": "atomic-memory", "content": {"kind": kind, "text": text}}
        await self.post(f"/v1/scopes/{self.scope}/artifacts", body, 201)


async def fill_http(server: Server, items: list[tuple[str, str]]) -> None:
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(kind: str, text: str) -> None:
        async with sem:
            await server.write(kind, text)

    t = time.perf_counter()
    await asyncio.gather(*(one(k, x) for k, x in items))
    server.fill_s += time.perf_counter() - t
    server.count += len(items)


async def fill_store(config_dir: Path, scope: str, items: list[tuple[str, str]]) -> float:
    """wiregate past HTTP_FILL_MAX: through its service layer, gateway stopped."""
    db = SqliteDatabase(str(config_dir / "data" / "wiregate.db"), synchronous="NORMAL")
    store = SqliteContextStore(db)
    await store.open()
    svc = ContextService(store, check_write=lambda texts: ())
    t = time.perf_counter()
    try:
        for base in range(0, len(items), 64):
            batch = items[base : base + 64]
            await asyncio.gather(
                *(svc.create_artifact(scope, "atomic-memory", {"kind": k, "text": x}) for k, x in batch)
            )
    finally:
        await store.close()
    return time.perf_counter() - t


# --- the wiregate process --------------------------------------------------------------


@dataclass
class Gateway:
    config: Path
    url: str
    ca: Path
    key: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        wiregate = str(Path(sys.executable).with_name("wiregate"))
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [wiregate, "serve", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup(None),
            )
        deadline = time.monotonic() + 60
        tls = ssl.create_default_context(cafile=str(self.ca))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"wiregate exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", verify=tls, timeout=2).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("wiregate not ready after 60 s")

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def gateway(config_extra: str = "") -> Iterator[Gateway]:
    workdir = Path(tempfile.mkdtemp(prefix="context-bench-"))
    try:
        mock = "http://127.0.0.1:9"  # never called: only the context routes are used
        env = build_env(
            workdir / "config", mock, profiles=[mock_profile("bench-openai", "openai", mock)], config_extra=config_extra
        )
        port = free_port()
        set_https_port(env.config, port)
        gw = Gateway(env.config, f"https://127.0.0.1:{port}", env.ca, env.gateway_key, workdir / "gateway.log")
        gw.start()
        try:
            yield gw
        finally:
            gw.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def wiregate_client(gw: Gateway) -> Http:
    tls = ssl.create_default_context(cafile=str(gw.ca))
    return Http(gw.url, {"authorization": f"Bearer {gw.key}"}, tls)


# --- measuring -------------------------------------------------------------------------


async def timed(server: Server, key: str, path: str, bodies: list[Any], expect: int = 200) -> None:
    out = server.samples.setdefault(key, [])
    for body in bodies:
        t = time.perf_counter()
        await server.post(path, body, expect)
        out.append(time.perf_counter() - t)


async def timed_writes(server: Server, out: list[float], items: list[tuple[str, str]]) -> None:
    for kind, text in items:
        t = time.perf_counter()
        await server.write(kind, text)
        out.append(time.perf_counter() - t)


def others_cpu(others: list[Server]) -> float:
    return sum(tree_cpu_seconds(o.pid) for o in others if o.pid is not None)


SETTLE_S = MERGE_IDLE_S + 0.25  # past a gateway's idle-merge timer, before its rest is judged


async def at_rest(servers: list[Server]) -> float:
    """Wait until every process of `servers` is at rest; returns the seconds waited. A gateway
    merges its FTS index once its writes pause (MERGE_IDLE_S after the last one): that merge,
    after a fill or after the previous segment's writes, must land neither in its own timed
    requests nor in its neighbours' (it did, on a 10,000-memory store: a write p50 of 3.3 ms
    on the gateway and 2.6 ms on the sync=normal one beside it, against 2.0 and 1.5 at 1,000)."""
    await asyncio.sleep(SETTLE_S)
    return SETTLE_S + await wait_quiet(*(s.pid for s in servers if s.pid is not None))


@contextlib.asynccontextmanager
async def timed_segment(server: Server, others: list[Server], beside: list[Server]) -> AsyncIterator[None]:
    """A server's timed segment, it, its neighbours and `beside` (timed within the segment) at
    rest at its start (a server that goes on working after its own requests must not take the
    CPU the next one is timed on); what the neighbours used during it anyway is added to
    `server.others_cpu_s` (reported beside the figures)."""
    server.settle_s += await at_rest([server, *others, *beside])
    before = others_cpu(others)
    yield
    server.others_cpu_s += others_cpu(others) - before


async def measure(servers: list[Server], size: int, writer: Server | None = None) -> None:
    """`writer`: a second wiregate (`sqlite_sync = "normal"`) whose writes are timed beside the others'."""
    qs = queries(PREPARE_N + SEARCH_N * len(SEARCHES), seed=size)
    writes = memories(size + WRITE_N)[size:]
    warm = queries(WARMUP_N, seed=size + 1)  # other queries than the timed ones, same vocabulary
    for s in servers:
        s.samples, s.settle_s, s.others_cpu_s = {}, 0.0, 0.0
        ready = 0
        for q in warm:  # not timed: a server answers many prepares before these in its life
            ready += (await s.post("/v1/context/prepare", {"scope_id": s.scope, "query": q}))["status"] == "ready"
        if ready < len(warm) // 2:  # the queries must find something in both stores
            print(f"warning: {s.name}: only {ready}/{len(warm)} warm-up prepares were ready", flush=True)
    per = PREPARE_N // ROUNDS
    for r in range(ROUNDS):
        for s in servers:
            async with timed_segment(s, [o for o in servers if o is not s], [writer] if writer else []):
                await timed_round(s, r, per, qs, writes, writer)
    for s in servers:
        s.count += WRITE_N


async def timed_round(
    s: Server, r: int, per: int, qs: list[str], writes: list[tuple[str, str]], writer: Server | None
) -> None:
    chunk = qs[r * per : (r + 1) * per]
    if s.name != "wiregate":
        await timed(s, "prepare", "/v1/context/prepare", [{"scope_id": s.scope, "query": q} for q in chunk])
    else:  # each query with and without the receipt, back to back, the order swapped every query
        for i, q in enumerate(chunk):
            plain = {"scope_id": s.scope, "query": q}
            pair = [("prepare", plain), ("prepare+receipt", {**plain, "include_receipt": True})]
            for key, body in pair if i % 2 == 0 else pair[::-1]:
                await timed(s, key, "/v1/context/prepare", [body])
    for i, (label, path, mode) in enumerate(SEARCHES):
        n = SEARCH_N // ROUNDS
        start = PREPARE_N + i * SEARCH_N + r * n
        bodies = [{"scope_id": s.scope, "query": q, "mode": mode, "limit": 10} for q in qs[start : start + n]]
        await timed(s, f"search {label}", path, bodies)
    n = WRITE_N // ROUNDS
    batch = writes[r * n : (r + 1) * n]
    await timed_writes(s, s.samples.setdefault("write", []), batch)
    if writer is not None and s.name == "wiregate":  # the same writes, the other sync setting
        writer.settle_s += await at_rest([s, writer])
        await timed_writes(writer, s.samples.setdefault("write normal", []), batch)


METRICS = [
    ("prepare p50", "prepare", 50),
    ("prepare p99", "prepare", 99),
    ("prepare+receipt p50", "prepare+receipt", 50),
    ("prepare+receipt p99", "prepare+receipt", 99),
    ("write p50", "write", 50),
    ("write p50, sqlite_sync normal*", "write normal", 50),
    *((f"search {label} p50", f"search {label}", 50) for label, _, _ in SEARCHES),
]


def summarize(size: int, servers: dict[str, Server | None], notes: dict[str, str]) -> dict[str, Any]:
    wg, pc = servers["wiregate"], servers.get("powercontext")
    rows = []
    for label, key, p in METRICS:
        w = pct(wg.samples[key], p) if wg and key in wg.samples else None
        ckey = "write" if key == "write normal" else key  # PowerContext has one write figure
        c = pct(pc.samples[ckey], p) if pc and ckey in pc.samples else None
        rows.append({"metric": label, "wiregate_ms": w, "powercontext_ms": c, "ratio": c / w if w and c else None})
    fills = {name: round(s.fill_s, 1) for name, s in servers.items() if s is not None}
    quiet = {
        name: {"settled_s": round(s.settle_s, 2), "others_cpu_while_timed_s": round(s.others_cpu_s, 3)}
        for name, s in servers.items()
        if s is not None
    }
    return {"memories": size, "rows": rows, "fill_s": fills, "notes": notes, "neighbours": quiet}


def fmt(v: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{suffix}"


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"\n### {result['memories']:,} memories"
        + "".join(f" — {k}: {v}" for k, v in result["notes"].items())
        + f" (cumulative fill s: {result['fill_s']})",
        "",
        "| metric | wiregate ms | PowerContext ms | PC / wiregate |",
        "|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['metric']} | {fmt(r['wiregate_ms'])} | {fmt(r['powercontext_ms'])} | {fmt(r['ratio'], '.1f', 'x')} |"
        )
    lines.append(
        "\nneighbours: "
        + "; ".join(
            f"before {name}'s segments waited {q['settled_s']} s for every server (itself included) to come to rest, "
            f"which then used {q['others_cpu_while_timed_s']} s of CPU while {name} was timed"
            for name, q in result["neighbours"].items()
        )
    )
    lines.append(
        '\n\\* a second wiregate with `[store] sqlite_sync = "normal"` (durable across a killed process, '
        "not a power loss), its store holding only these timed writes"
    )
    return "\n".join(lines)


async def new_scope(server: Server) -> None:
    body = {"title": "bench", "summary": "context bench", "idempotency_key": uuid.uuid4().hex}
    server.scope = (await server.post("/v1/scopes", body, 201))["scope_id"]


class PowerContextSide:
    """The PowerContext server of this run, on a home directory of ours, so that a filled
    store can be kept as a snapshot (`.cache/powercontext-1.4.1/bench/`) and served again by
    a later run instead of being filled again."""

    def __init__(self) -> None:
        # a fixed path: a 1.4.1 home records where it lives and will not start elsewhere, so a
        # snapshot is always copied back to this same place (one benchmark run at a time)
        self.home = pcserver.CACHE / "bench" / "home"
        self.home.parent.mkdir(parents=True, exist_ok=True)
        self.lock = (self.home.parent / "run.lock").open("w")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit("another context_bench.py run holds .cache/powercontext-1.4.1/bench/run.lock") from None
        shutil.rmtree(self.home, ignore_errors=True)
        self.home.mkdir()
        self.stack = contextlib.ExitStack()
        self.server: Server | None = None

    async def start(self) -> Server:
        t = time.perf_counter()  # a 1.4.1 server checks its whole store at start: ~2 min at 10k
        pcs = self.stack.enter_context(pcserver.running_server(home=self.home, start_timeout=PC_START_TIMEOUT))
        print(f"PowerContext server ready in {time.perf_counter() - t:.0f} s", flush=True)
        http = Http(pcs.base_url, dict(pcs.headers))
        if self.server is None:
            self.server = Server("powercontext", http)
        else:
            self.server.http = http
        self.server.pid = pcs.pid
        return self.server

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.http.aclose()
        self.stack.close()
        self.stack = contextlib.ExitStack()

    async def restore(self, snap: Path) -> Server:
        await self.stop()
        meta = json.loads((snap / "meta.json").read_text())
        shutil.rmtree(self.home)
        shutil.copytree(snap / "home", self.home)
        server = await self.start()
        server.scope, server.count, server.fill_s = meta["scope"], meta["count"], meta["fill_s"]
        return server

    async def save(self, snap: Path) -> None:
        assert self.server is not None
        server = self.server
        await self.stop()  # a stopped server: a consistent copy
        partial = snap.with_name(snap.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(self.home, partial / "home")
        meta = {"scope": server.scope, "count": server.count, "fill_s": server.fill_s, "seed": SEED}
        (partial / "meta.json").write_text(json.dumps(meta))
        shutil.rmtree(snap, ignore_errors=True)
        partial.rename(snap)
        await self.start()

    async def close(self) -> None:
        await self.stop()
        shutil.rmtree(self.home, ignore_errors=True)
        self.lock.close()


def snapshot_dir(size: int) -> Path:
    corpus = context_store_bench.CORPUS.kind
    return pcserver.CACHE / "bench" / (f"seed{SEED}-{size}" if corpus == "pc45" else f"{corpus}-seed{SEED}-{size}")


async def run(sizes: list[int], pc_fill_budget: float, http_fill_max: int, snapshots: bool) -> list[dict[str, Any]]:
    data = memories(max(sizes))
    results = []
    started = time.perf_counter()
    with gateway() as gw, gateway('[store]\nsqlite_sync = "normal"\n') as gw_normal:
        wg = Server("wiregate", wiregate_client(gw), pid=gw.pid)
        wn = Server("wiregate sqlite_sync=normal", wiregate_client(gw_normal), pid=gw_normal.pid)
        side = PowerContextSide()
        try:
            pc: Server | None = await side.start()
            print(f"wiregate {gw.url} (HTTPS, real gateway process); PowerContext over loopback HTTP", flush=True)
            await new_scope(wg)
            await new_scope(wn)
            assert pc is not None
            await new_scope(pc)
            for size in sizes:
                notes: dict[str, str] = {}
                need = data[wg.count : size] if size > wg.count else []
                if size <= http_fill_max:
                    await fill_http(wg, need)
                else:
                    await wg.http.aclose()
                    gw.stop()
                    wg.fill_s += await fill_store(gw.config.parent, wg.scope, need)
                    wg.count += len(need)
                    gw.start()
                    wg.http, wg.pid = wiregate_client(gw), gw.pid
                    notes["wiregate fill"] = f"{len(need):,} via the service layer (gateway stopped)"
                save = False
                snap = snapshot_dir(size)
                if pc is None:
                    notes["PowerContext"] = "not measured (not filled past a smaller size, see above)"
                elif snapshots and (snap / "meta.json").is_file() and pc.count < size:
                    pc = await side.restore(snap)
                    notes["PowerContext fill"] = f"restored from {snap.relative_to(ROOT)} (filled by an earlier run)"
                else:
                    more = data[pc.count : size] if size > pc.count else []
                    rate = pc.fill_s / pc.count if pc.count else None
                    projected = None if rate is None else rate * len(more)
                    if projected is not None and projected > pc_fill_budget:
                        notes["PowerContext"] = (
                            f"not filled to {size:,}: {len(more):,} more writes would take ~{projected:.0f} s "
                            f"at its measured {rate * 1000:.0f} ms/write (> --pc-fill-budget {pc_fill_budget:.0f} s)"
                        )
                        await side.stop()
                        pc = None
                    else:
                        await fill_http(pc, more)
                        save = snapshots
                if save:  # before measuring: the snapshot holds exactly the first `size` memories
                    await side.save(snap)
                active = [s for s in (wg, pc) if s is not None]
                print(f"{size:,}: filled ({', '.join(f'{s.name} {s.fill_s:.0f} s' for s in active)})", flush=True)
                await measure(active, size, wn)
                notes["corpus"] = context_store_bench.CORPUS.kind
                result = summarize(size, {"wiregate": wg, "powercontext": pc}, notes)
                results.append(result)
                print(markdown(result), flush=True)
        finally:
            await wg.http.aclose()
            await wn.http.aclose()
            await side.close()
    print(f"\ntotal {time.perf_counter() - started:.0f} s", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--pc-fill-budget", type=float, default=180, help="seconds PowerContext may spend on one fill step")
    ap.add_argument("--http-fill-max", type=int, default=HTTP_FILL_MAX, help="wiregate: fill over HTTP up to this")
    ap.add_argument(
        "--no-snapshots", action="store_true", help="neither reuse nor keep filled PowerContext stores in .cache/"
    )
    ap.add_argument(
        "--corpus", choices=context_store_bench.CORPORA, default="pc45", help="see context_store_bench.Corpus"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    context_store_bench.use_corpus(args.corpus)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop both servers on the way out
    t = time.perf_counter()
    try:
        pcserver.ensure_venv()
    except pcserver.PowerContextUnavailable as exc:
        print(f"PowerContext {pcserver.VERSION} unavailable: {exc}", file=sys.stderr)
        return 2
    print(f"PowerContext venv ready in {time.perf_counter() - t:.1f} s ({pcserver.VENV})", flush=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = asyncio.run(run(sizes, args.pc_fill_budget, args.http_fill_max, not args.no_snapshots))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
