"""Large decisions off the event loop.

Parsing and inspecting a body of tens of megabytes takes long enough (JSON decoding holds
the interpreter lock throughout) to stall every other connection. Bodies of at least
`limits.offload_bytes` are therefore decided in a small pool of worker processes
(`server.check_workers`), each holding the runtime loaded from the same configuration
files, running exactly the functions of `decide` the loop runs for small bodies: parse,
then plan + admit + before_send per profile; read + before_release checks for a large
response. The send binding and the release ledger stay in the gateway (they are its own
state).

A worker checks that its runtime is the one the call is pinned to (generation, policy
version, profile digests, key ring); a worker that cannot load that same runtime reports
it stale and the call is decided on the loop instead — never under another policy. The
pool is bounded: past `2 × workers` decisions in flight a call gets 503
`capacity_exceeded`. The pool starts on first use (or when `wiregate serve` starts) and
stops with the app. Loading the runtime in a worker takes seconds (it compiles the
inspection databases), so `wiregate serve` warms every worker at start and after each
reload, at a lower CPU priority than the serving process; a large call that still finds
them cold waits for that warm-up (metric outcome `cold`) instead of stalling the loop.

Owns: the pool, the worker-side entry points and the runtime identity check.
Must not: decide anything itself (decide.py does), or send content anywhere but to its
own workers over their pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from gateway.attribution.blocks import Attributed
from gateway.cachepace import SessionPace
from gateway.carriers import CARRIERS
from gateway.carriers.base import ParsedRequest
from gateway.checks.destination import Target
from gateway.checks.prepared import Replay
from gateway.checks.runner import Party
from gateway.config.runtime import Runtime
from gateway.errors import GatewayError, ServiceError
from gateway.obs import logging as log
from gateway.obs.metrics import Metrics
from gateway.proxy import decide, projections
from gateway.vocab import Mode, ReasonCode

T = TypeVar("T")

# Stands for "the bytes the gateway sent you" in a worker's answer (never a real body: a
# provider body is never this short and never starts with NUL).
SAME = b"\x00same"


def runtime_key(runtime: Runtime) -> str:
    return runtime.decision_key


@dataclass(frozen=True, slots=True)
class Failure:
    """A GatewayError, as data (exceptions with their own arguments do not cross a pipe)."""

    kind: str
    status: int
    code: str
    reason_codes: tuple[str, ...]
    retryable: bool

    @classmethod
    def of(cls, err: GatewayError) -> Failure:
        return cls(type(err).__name__, err.status, err.code, err.reason_codes, err.retryable)

    def raise_(self) -> None:
        from gateway import errors

        kind = getattr(errors, self.kind, GatewayError)
        raise kind(self.status, self.code, self.reason_codes, retryable=self.retryable)


class Stale(Exception):
    """The worker cannot load the runtime the call is pinned to."""


class Cold(Stale):
    """The workers could not be warmed with the call's runtime: the call is decided on the loop."""


@dataclass(frozen=True, slots=True)
class Summary:
    model: str
    stream: bool
    attributed: Attributed | None = None  # when asked: the attribution split of the document parsed here


# --- the worker side -------------------------------------------------------------------


_WORKER: dict[str, Any] = {}


PARENT_CHECK_S = 1.0  # how often a worker looks whether its gateway process is still there


def _init(config_path: str, parent: int | None = None) -> None:
    _WORKER["config"] = config_path
    log.configure("warning")  # a spawned process starts unconfigured: no record may reach stderr raw
    if parent is not None:
        threading.Thread(target=_orphan_watch, args=(parent,), name="parent-watch", daemon=True).start()
    # Below the serving process: a worker loading a runtime (seconds of Hyperscan compiling,
    # at start and after each reload) or checking a large body never takes the core from
    # the event loop that answers every other call.
    with contextlib.suppress(OSError):
        os.nice(10)


def _orphan_watch(parent: int) -> None:
    """End this worker once the gateway process that started it is gone (a SIGKILLed or
    OOM-killed process cannot stop its pool, and `--workers` replaces a dead process with
    a new one and a new pool: its old workers must not stay behind, holding memory)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _warm(seconds: float) -> None:
    time.sleep(seconds)  # holds this worker while the pool starts the others


def _w_warm(key: str, hold: float) -> int:
    """Load (and compile) the runtime `key` names; hold the worker a moment so that the
    other warm-up tasks of the same round land on the other workers."""
    _runtime(key)
    time.sleep(hold)
    return os.getpid()


def _runtime(key: str) -> Runtime:
    from gateway.config.load import load_runtime

    runtime: Runtime | None = _WORKER.get("runtime")
    if runtime is None or runtime_key(runtime) != key:
        try:
            runtime = load_runtime(Path(_WORKER["config"]))
        except Exception:  # a configuration being edited: the gateway decides on its loop
            raise Stale from None
        _WORKER["runtime"] = runtime
        if runtime_key(runtime) != key:
            raise Stale
    return runtime


def _party(runtime: Runtime, spec: tuple[str, str | None, str, str]) -> Party:
    principal, delegate, scope, profile_id = spec
    return Party(principal, delegate, scope, runtime.profiles[profile_id])


def _w_parse(key: str, carrier: str, raw: bytes, labels: Mapping[str, str] | None = None) -> Summary | Failure:
    """Parse (and, with `labels`, split for attribution: the loop never parses the body
    again for it). A failed split is left to the loop, which logs and drops it."""
    runtime = _runtime(key)
    try:
        parsed = decide.parse_request(CARRIERS[carrier], raw, runtime)
    except GatewayError as err:
        return Failure.of(err)
    attributed = None
    if labels is not None and carrier in projections.ATTRIBUTED_CARRIERS:
        with contextlib.suppress(Exception):
            attributed = projections.attribute(runtime, CARRIERS[carrier], parsed.doc, labels)
    return Summary(parsed.model, parsed.stream, attributed)


def _w_send(
    key: str,
    carrier: str,
    raw: bytes,
    party: tuple[str, str | None, str, str],
    target: Target,
    headers: dict[str, str],
    session: str | None,
    route: str,
    replays: tuple[Replay, ...] = (),
    eligible: dict[str, bool] | None = None,
    pace: SessionPace | None = None,
) -> decide.Prepared | Failure:
    runtime = _runtime(key)
    try:
        parsed = decide.parse_request(CARRIERS[carrier], raw, runtime)
        prepared = decide.prepare_send(
            runtime,
            CARRIERS[carrier],
            parsed,
            raw,
            _party(runtime, party),
            target,
            headers,
            session=session,
            route=route,
            replays=replays,
            eligible=eligible,
            pace=pace,
        )
    except GatewayError as err:
        return Failure.of(err)
    # The body goes back over the pipe only when planning changed it.
    return dataclasses.replace(prepared, body=SAME) if prepared.body is raw else prepared


def _w_read(
    key: str,
    carrier: str,
    body: bytes,
    is_stream: bool,
    usage_injected: bool,
    party: tuple[str, str | None, str, str],
    headers: dict[str, str],
    mode: Mode,
    now: float,
    incomplete: bool,
) -> decide.Read:
    runtime = _runtime(key)
    read = decide.read_response(
        runtime,
        CARRIERS[carrier],
        body,
        is_stream=is_stream,
        usage_injected=usage_injected,
        party=_party(runtime, party),
        headers=headers,
        mode=mode,
        now=now,
        incomplete=incomplete,
    )
    return dataclasses.replace(read, released=SAME) if read.released is body else read


# --- the gateway side ------------------------------------------------------------------


QUEUED_PER_WORKER = 4  # large decisions that may wait for a check worker, per worker


class Offload:
    def __init__(self, config_path: Path | None, workers: int, metrics: Metrics) -> None:
        self.config_path = config_path
        self.workers = workers
        self.metrics = metrics
        self._pool: ProcessPoolExecutor | None = None
        self._starting: asyncio.Future[ProcessPoolExecutor] | None = None
        self._closed = False
        self._in_flight = 0
        self._slots = asyncio.Semaphore(2 * max(workers, 1))  # decisions running at once
        self._waiting = 0  # decisions queued for a slot
        self._warm_key: str | None = None  # every worker holds this runtime
        self._warming: asyncio.Task[bool] | None = None

    @property
    def enabled(self) -> bool:
        return self.workers > 0 and self.config_path is not None

    def wanted(self, runtime: Runtime, size: int) -> bool:
        return self.enabled and size >= runtime.config.limits.offload_bytes

    def _start(self) -> ProcessPoolExecutor:
        """Build the pool and start every worker (off the loop: spawning a process blocks)."""
        pool = ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init,
            initargs=(str(self.config_path), os.getpid()),
        )
        for future in [pool.submit(_warm, 0.05) for _ in range(self.workers)]:
            future.result()
        return pool

    async def _executor(self) -> ProcessPoolExecutor:
        """The pool, started once. The start runs in a thread that a cancelled caller cannot
        stop, so it is shielded and kept: `close` waits for it and stops what it started."""
        if self._pool is not None:
            return self._pool
        if self._closed:
            raise ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,), retryable=True)
        if self._starting is None:
            self._starting = asyncio.ensure_future(asyncio.to_thread(self._start))
        try:
            pool = await asyncio.shield(self._starting)
        except Exception:
            self._starting = None  # the next call tries again
            raise
        if self._closed:  # closed while starting: close() disposes it
            raise ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,), retryable=True)
        self._pool = pool
        return pool

    async def _run(self, stage: str, fn: Callable[..., T], *args: Any) -> T:
        # 2 × workers decisions run at once and up to QUEUED_PER_WORKER × workers wait their turn in
        # order (a buffered answer the provider already produced is decided a little later, not
        # dropped because a burst of them arrived together); past the queue: 503 at once.
        if self._waiting >= QUEUED_PER_WORKER * self.workers:
            self.metrics.offloaded.labels(stage, "busy").inc()
            raise ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,), retryable=True)
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            return await self._decide(stage, fn, *args)
        finally:
            self._slots.release()

    async def _decide(self, stage: str, fn: Callable[..., T], *args: Any) -> T:
        self._in_flight += 1
        self.metrics.offload_in_flight.inc()
        outcome = "failed"
        pool: ProcessPoolExecutor | None = None
        try:
            pool = await self._executor()
            # Submitting writes to the workers' pipes: from a thread, never the loop.
            future = await asyncio.to_thread(pool.submit, fn, *args)
            result = await asyncio.wrap_future(future)
            outcome = "done"
            return result
        except Stale:
            outcome = "stale"
            raise
        except BrokenProcessPool:
            # A worker died (killed, out of memory): this call is not decided (fail closed);
            # the next one gets a fresh pool.
            log.error("check_worker_lost", stage=stage)
            await self._drop_broken(pool)
            raise ServiceError(503, "gateway_busy", (ReasonCode.CAPACITY_EXCEEDED,), retryable=True) from None
        finally:
            self._in_flight -= 1
            self.metrics.offload_in_flight.dec()
            self.metrics.offloaded.labels(stage, outcome).inc()

    async def _drop_broken(self, pool: ProcessPoolExecutor | None) -> None:
        """Forget a pool a worker died in (the next use starts a fresh one, cold) and stop
        what is left of it; a pool already replaced meanwhile is left to its replacer."""
        if pool is None or self._pool is not pool:
            return
        self._pool = None
        self._starting = None
        self._warm_key = None
        await asyncio.to_thread(_dispose, [pool])

    async def _ready(self, runtime: Runtime, stage: str) -> str:
        """The runtime's key once every worker holds it. A call that finds them cold waits for
        the warm-up (seconds, once per start or reload) rather than decide a large body on the
        loop; if they cannot load this runtime (the files on disk changed) it raises Stale and
        the call is decided on the loop under its pinned runtime."""
        key = runtime_key(runtime)
        if self._warm_key == key:
            return key
        self.warm_soon(runtime)
        self.metrics.offloaded.labels(stage, "cold").inc()
        assert self._warming is not None
        warmed = await asyncio.shield(self._warming)
        if warmed and self._warm_key == key:
            return key
        raise Cold

    def warm_soon(self, runtime: Runtime) -> None:
        """Warm the workers for `runtime` in the background (`wiregate serve` does this at
        start and after each reload, so that large calls rarely find them cold)."""
        if not self.enabled or self._warm_key == runtime_key(runtime):
            return
        if self._warming is None or self._warming.done():
            self._warming = asyncio.create_task(self._warm_quietly(runtime), name="offload-warm")

    async def _warm_quietly(self, runtime: Runtime) -> bool:
        try:
            return await self.warm(runtime)
        except Exception as exc:  # the next large call tries again
            log.error("check_worker_warm_failed", error_class=type(exc).__name__)
            return False

    async def warm(self, runtime: Runtime, rounds: int = 4) -> bool:
        """Start the pool and have every worker load `runtime`; True once all of them hold it
        (False when they cannot: the configuration on disk is not the one the gateway runs)."""
        key = runtime_key(runtime)
        if self._warm_key == key:
            return True
        pool = await self._executor()
        warmed: set[int] = set()
        for _ in range(rounds):
            try:
                futures = [await asyncio.to_thread(pool.submit, _w_warm, key, 0.2) for _ in range(self.workers)]
                warmed.update(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
            except Stale:
                return False
            except BrokenProcessPool:  # a worker died (while idle, or now): a fresh pool, warmed from the start
                log.error("check_worker_lost", stage="warm")
                await self._drop_broken(pool)
                pool = await self._executor()
                warmed = set()
                continue
            if len(warmed) >= self.workers:
                self._warm_key = key
                return True
        return False

    async def parse(
        self, runtime: Runtime, carrier: str, raw: bytes, labels: Mapping[str, str] | None = None
    ) -> Summary:
        """The model and stream flag; with `labels` (attribution is collecting) the split too."""
        await self._ready(runtime, "parse")
        result = await self._run("parse", _w_parse, runtime_key(runtime), carrier, raw, labels)
        if isinstance(result, Failure):
            result.raise_()
        assert isinstance(result, Summary)
        return result

    async def prepare_send(
        self,
        runtime: Runtime,
        carrier: str,
        raw: bytes,
        party: Party,
        target: Target,
        headers: dict[str, str],
        *,
        session: str | None,
        route: str,
        replays: tuple[Replay, ...] = (),
        eligible: Mapping[str, bool] | None = None,
        pace: SessionPace | None = None,
    ) -> decide.Prepared:
        await self._ready(runtime, "send")
        spec = (party.principal, party.delegate, party.scope, party.profile.profile.id)
        answers = dict(eligible) if eligible is not None else None
        result = await self._run(
            "send",
            _w_send,
            runtime_key(runtime),
            carrier,
            raw,
            spec,
            target,
            headers,
            session,
            route,
            replays,
            answers,
            pace,
        )
        if isinstance(result, Failure):
            result.raise_()
        assert isinstance(result, decide.Prepared)
        return dataclasses.replace(result, body=raw) if result.body == SAME else result

    async def read_response(
        self,
        runtime: Runtime,
        carrier: str,
        body: bytes,
        *,
        is_stream: bool,
        usage_injected: bool,
        party: Party,
        headers: dict[str, str],
        mode: Mode,
        incomplete: bool = False,
    ) -> decide.Read:
        await self._ready(runtime, "read")
        spec = (party.principal, party.delegate, party.scope, party.profile.profile.id)
        read = await self._run(
            "read",
            _w_read,
            runtime_key(runtime),
            carrier,
            body,
            is_stream,
            usage_injected,
            spec,
            headers,
            mode,
            time.time(),
            incomplete,
        )
        return dataclasses.replace(read, released=body) if read.released == SAME else read

    async def close(self) -> None:
        self._closed = True
        if self._warming is not None and not self._warming.done():
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming
        pool = self._pool
        if pool is None and self._starting is not None:
            try:
                pool = await self._starting  # a start in progress: let it finish, then stop it
            except Exception:
                pool = None
        self._pool = self._starting = None
        if pool is not None:
            await asyncio.to_thread(_dispose, [pool])


def _dispose(held: list[ProcessPoolExecutor]) -> None:
    """Stop a pool and free it here, off the loop: its queues' finalizers write to the
    multiprocessing resource tracker, which must not happen on the loop."""
    held.pop().shutdown(wait=True, cancel_futures=True)
    gc.collect()


OFFLOAD = web.AppKey("wiregate_offload", Offload)


def parsed_stub(carrier: str, summary: Summary) -> ParsedRequest:
    """What the loop keeps of a request a worker parsed: its model and stream flag (the
    content stays with the worker, which plans and checks it)."""
    return ParsedRequest(carrier=carrier, doc={}, model=summary.model, stream=summary.stream, units=())
