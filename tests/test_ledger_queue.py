"""The ledgers' queues while a batch is being written (the usage and the attribution ledger,
on PostgreSQL, and on SQLite where no server lock is needed): the batch leaves the queue when
its write starts, records queued meanwhile wait for the next write and are bounded among
themselves (a record is dropped only when `max_pending` records wait that no write has taken,
and each drop is counted once), a write that fails or is cancelled before its commit puts its
batch back in front (trimmed to the bound, oldest first, counted), and the flush task writes
what was queued during its own write."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from gateway.attribution.ledger import Record
from gateway.context.store.database import Database
from gateway.ledgers.attribution import ATTRIBUTION_MIGRATIONS, AttributionLedger
from gateway.ledgers.stored import LEDGER_MIGRATIONS, StoredUsageLedger
from gateway.usage import KINDS, Count, UsageRecord
from tests.context.conftest import PG_DSN, replica_databases

pytestmark = pytest.mark.asyncio

MIGRATIONS = LEDGER_MIGRATIONS + ATTRIBUTION_MIGRATIONS
NOT_FLUSHED = 3600.0  # only the test (or a stop) writes


class Usage:
    """The usage ledger, its records named r0, r1, …"""

    table = "wg_usage_totals"  # the write's first statement needs it

    def __init__(self, db: Database, *, max_pending: int = 10_000, flush_after_s: float = NOT_FLUSHED) -> None:
        self.ledger = StoredUsageLedger(db, max_pending=max_pending, flush_after_s=flush_after_s)

    async def add(self, n: int) -> None:
        await self.ledger.add(
            UsageRecord(f"r{n}", 1, "p", "openai.chat", "released", 200, {k: Count(1, "known") for k in KINDS})
        )

    def queued(self) -> list[str]:
        return [r.request_id for r in self.ledger._pending]

    @staticmethod
    async def stored(db: Database) -> list[str]:
        """The records written, oldest first (read through another replica's handle)."""
        reader = StoredUsageLedger(db)
        recent = [r.request_id for r in await reader.recent()]
        report = await reader.report()
        assert report["profiles"].get("p", {}).get("records", 0) == len(recent)  # totals agree, none twice
        return recent


class Attribution:
    """The attribution ledger (its purge kept out of the way), its records named r0, r1, …"""

    table = "wg_attr_records"

    def __init__(self, db: Database, *, max_pending: int = 10_000, flush_after_s: float = NOT_FLUSHED) -> None:
        self.ledger = AttributionLedger(db, max_pending=max_pending, flush_after_s=flush_after_s)
        self.ledger._next_purge = math.inf

    async def add(self, n: int) -> None:
        self.ledger.add("s", Record(time.time(), (), invocation=f"r{n}", profile="p"))

    def queued(self) -> list[str]:
        return [str(r.invocation) for _, r in self.ledger._pending]

    @staticmethod
    async def stored(db: Database) -> list[str]:
        reader = AttributionLedger(db)
        reader._next_purge = math.inf
        now = time.time()
        records, _ = await reader.records(None, now + 60, now=now)
        return [str(r.invocation) for r in records]


LEDGERS = [pytest.param(Usage, id="usage"), pytest.param(Attribution, id="attribution")]
Ledger = type[Usage] | type[Attribution]


def names(ns: range | list[int]) -> list[str]:
    return [f"r{n}" for n in ns]


@asynccontextmanager
async def locked(db: Database, table: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """Another session holds `table` exclusively until the block ends: a write to it waits."""
    assert db.postgres is not None
    locker = await psycopg.AsyncConnection.connect(PG_DSN)
    try:
        await locker.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(db.postgres._schema or "", table))
        )
        yield locker
    finally:
        await locker.rollback()
        await locker.close()


async def waiting_writer(locker: psycopg.AsyncConnection[Any], db: Database, table: str, *, not_pid: int = 0) -> int:
    """The server process of the ledger's write, once it waits for the lock on `table`
    (another than `not_pid`)."""
    assert db.postgres is not None
    name = sql.Identifier(db.postgres._schema or "", table).as_string(locker)
    for _ in range(500):
        cur = await locker.execute(
            "SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass AND pid <> %s", (name, not_pid)
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("the write never waited for the lock")


async def settled(work: Awaitable[Any]) -> None:
    await asyncio.wait_for(work, timeout=10)


class Tasks:
    """The test's own tasks on a ledger (see `opened`)."""

    def __init__(self) -> None:
        self.all: list[asyncio.Task[Any]] = []

    def start(self, work: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.create_task(work)
        self.all.append(task)
        return task


@asynccontextmanager
async def opened(
    kind: Ledger, backend: str, tmp_path: Path, **kw: Any
) -> AsyncIterator[tuple[Usage | Attribution, Database, Database, Tasks]]:
    """A ledger on one handle of a database, another handle to read what it wrote, and the
    test's tasks. Whatever the test's outcome, those tasks and the ledger end before the
    database closes: a write left open would hold up the schema's drop, which waits on the
    event loop's own thread."""
    async with replica_databases(backend, tmp_path, MIGRATIONS, "queue") as (db, other):
        ledger = kind(db, **kw)
        tasks = Tasks()
        try:
            yield ledger, db, other, tasks
        finally:
            if tasks.all:
                await asyncio.wait(tasks.all, timeout=10)
            for task in tasks.all:
                if task.done() and not task.cancelled():
                    task.exception()  # seen (the test looked at the ones it meant to)
            with contextlib.suppress(Exception):
                await settled(ledger.ledger.close())


# --- the probes' scenario: records queued while a batch is written ----------------------


@pytest.mark.parametrize("kind", LEDGERS)
@pytest.mark.parametrize("added", [3, 7], ids=["within-bound", "past-bound"])
async def test_records_queued_while_a_batch_is_written_are_written(kind: Ledger, added: int, tmp_path: Path) -> None:
    """The batch r0..r4 waits for a table lock; records added meanwhile are bounded among
    themselves (5): none is dropped for the batch in flight, the oldest new ones only past
    the bound, counted exactly; all the others are written."""
    async with opened(kind, "postgres", tmp_path, max_pending=5) as (ledger, db, other, tasks):
        for n in range(5):
            await ledger.add(n)
        kept = list(range(5, 5 + added))[-5:]
        async with locked(db, kind.table) as locker:
            flush = tasks.start(ledger.ledger.flush())
            await waiting_writer(locker, db, kind.table)
            assert ledger.queued() == []  # the batch is out of the queue while it is written
            for n in range(5, 5 + added):
                await ledger.add(n)
            assert ledger.queued() == names(kept)
            assert ledger.ledger.dropped == added - len(kept)
        await settled(flush)
        assert ledger.queued() == names(kept)  # the committed batch took nothing else with it
        await ledger.ledger.close()
        assert await kind.stored(other) == names(list(range(5)) + kept)
        assert ledger.ledger.dropped == added - len(kept)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("kind", LEDGERS)
async def test_records_queued_while_a_batch_is_written_are_written_on_either_backend(
    kind: Ledger, backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, the write held (before it starts) by the test instead of a server lock."""
    async with opened(kind, backend, tmp_path, max_pending=5) as (ledger, db, other, tasks):
        store: Any = db.sqlite if db.sqlite is not None else db.postgres
        original, started, go = store.write, asyncio.Event(), asyncio.Event()

        async def held_write(fn: Any) -> Any:
            started.set()
            await go.wait()
            return await original(fn)

        monkeypatch.setattr(store, "write", held_write)
        for n in range(5):
            await ledger.add(n)
        flush = tasks.start(ledger.ledger.flush())
        try:
            await settled(started.wait())
            for n in range(5, 8):
                await ledger.add(n)
        finally:
            go.set()
        await settled(flush)
        assert ledger.queued() == names(range(5, 8))
        await ledger.ledger.close()
        assert await kind.stored(other) == names(range(8))
        assert ledger.ledger.dropped == 0


# --- a write that fails or is cancelled before its commit --------------------------------


@pytest.mark.parametrize("kind", LEDGERS)
@pytest.mark.parametrize(
    ("max_pending", "kept", "dropped"),
    [(10, range(8), 0), (6, range(2, 8), 2)],
    ids=["within-bound", "trimmed"],
)
async def test_a_failed_write_puts_its_batch_back_in_front(
    kind: Ledger, max_pending: int, kept: range, dropped: int, tmp_path: Path
) -> None:
    """The write of r0..r4 fails (its server process is ended while it waits for a lock);
    r5..r7 were queued meanwhile. The batch goes back in front, in its order: nothing lost
    within the bound; past it the oldest are dropped, each counted once."""
    async with opened(kind, "postgres", tmp_path, max_pending=max_pending) as (ledger, db, other, tasks):
        for n in range(5):
            await ledger.add(n)
        async with locked(db, kind.table) as locker:
            flush = tasks.start(ledger.ledger.flush())
            pid = await waiting_writer(locker, db, kind.table)
            for n in range(5, 8):
                await ledger.add(n)
            assert ledger.ledger.dropped == 0
            await locker.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                await settled(flush)
        assert ledger.queued() == names(kept)
        assert ledger.ledger.dropped == dropped
        await ledger.ledger.close()  # the retry writes them, once
        assert await kind.stored(other) == names(kept)
        assert ledger.ledger.dropped == dropped


@pytest.mark.parametrize("kind", LEDGERS)
async def test_a_write_cancelled_before_its_commit_is_written_by_the_stop(kind: Ledger, tmp_path: Path) -> None:
    """A stop cancels the flush task while its write waits for a lock, and the write then
    fails: its batch goes back in front of what was queued meanwhile, and the stop's own
    flush writes everything, once."""
    async with opened(kind, "postgres", tmp_path, flush_after_s=0.0) as (ledger, db, other, tasks):
        async with locked(db, kind.table) as locker:
            for n in range(5):
                await ledger.add(n)
            pid = await waiting_writer(locker, db, kind.table)  # the flush task's write
            for n in range(5, 8):
                await ledger.add(n)
            closing = tasks.start(ledger.ledger.close())
            await asyncio.sleep(0.05)  # the stop has cancelled the flush task; its write goes on
            await locker.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await waiting_writer(locker, db, kind.table, not_pid=pid)  # the stop's flush, with every record
        await settled(closing)
        assert ledger.queued() == []
        assert await kind.stored(other) == names(range(8))
        assert ledger.ledger.dropped == 0


# --- the flush task ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", LEDGERS)
async def test_the_flush_task_writes_what_was_queued_during_its_write(kind: Ledger, tmp_path: Path) -> None:
    """Records added while the flush task writes (their `add` starts no task: one runs) are
    written by it soon after, with no further add, report or stop."""
    async with opened(kind, "postgres", tmp_path, flush_after_s=0.05) as (ledger, db, other, _):
        async with locked(db, kind.table) as locker:
            for n in range(5):
                await ledger.add(n)
            await waiting_writer(locker, db, kind.table)
            for n in range(5, 8):
                await ledger.add(n)
        flusher = ledger.ledger._flusher
        assert flusher is not None
        await asyncio.wait_for(asyncio.shield(flusher), 5)  # it ends once nothing waits: no add, report or stop
        assert ledger.queued() == [] and ledger.ledger._pending.writing == 0
        assert await kind.stored(other) == names(range(8))  # read once every write has committed


# --- the queue itself -------------------------------------------------------------------


async def test_only_records_not_being_written_count_against_the_bound() -> None:
    from gateway.ledgers.batches import BatchQueue

    told: list[int] = []
    queue: BatchQueue[int] = BatchQueue(3, on_drop=told.append)
    for n in range(3):
        queue.put(n)
    with queue.batch() as batch:
        assert batch.items == [0, 1, 2] and len(queue) == 0 and queue.writing == 3
        for n in range(3, 7):
            queue.put(n)  # 3 is dropped for 6, not a record being written
        batch.written()
    assert list(queue) == [4, 5, 6] and queue.writing == 0
    assert queue.dropped == 1 and told == [1]


@pytest.mark.parametrize("failure", [RuntimeError, asyncio.CancelledError])
async def test_a_batch_left_unwritten_goes_back_in_front_trimmed_to_the_bound(failure: type[BaseException]) -> None:
    from gateway.ledgers.batches import BatchQueue

    told: list[int] = []
    queue: BatchQueue[int] = BatchQueue(4, on_drop=told.append)
    for n in range(3):
        queue.put(n)
    with pytest.raises(failure), queue.batch():
        queue.put(3)
        queue.put(4)
        raise failure
    assert list(queue) == [1, 2, 3, 4]  # the oldest, 0, dropped to the bound
    assert queue.dropped == 1 and told == [1]
    with queue.batch() as batch:  # a batch within the bound comes back whole
        pass
    assert batch.items == [1, 2, 3, 4] and list(queue) == [1, 2, 3, 4] and queue.dropped == 1


async def test_a_written_batch_is_never_queued_again() -> None:
    from gateway.ledgers.batches import BatchQueue

    queue: BatchQueue[int] = BatchQueue(4)
    queue.put(0)
    with pytest.raises(asyncio.CancelledError), queue.batch() as batch:
        batch.written()
        raise asyncio.CancelledError  # a stop delivered after the commit
    assert list(queue) == [] and queue.dropped == 0
    with queue.batch(), pytest.raises(RuntimeError), queue.batch():
        pass  # one batch at a time
