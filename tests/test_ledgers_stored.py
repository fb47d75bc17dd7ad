"""The ledgers in the database (SQLite and PostgreSQL): two ledger objects on one database
stand for two replicas sharing it. One payload per send binding whichever replica admits it;
usage totals that agree with the in-memory ledger's arithmetic; a stop flushes queued usage."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.app import STORE_MIGRATIONS
from gateway.context.store.database import Database, open_database
from gateway.ledgers.release import PURGE_GRACE_S, MemoryReleaseLedger
from gateway.ledgers.stored import LEDGER_MIGRATIONS, StoredReleaseLedger, StoredUsageLedger
from gateway.ledgers.usage import MemoryUsageLedger
from gateway.usage import KINDS, UNKNOWN, Count, UsageRecord
from tests.context.conftest import PG_DSN, drop_schema, replica_databases, require_pg

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def databases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Database, Database]]:
    """Two handles on one database, as two replicas hold them."""
    async with replica_databases(request.param, tmp_path, LEDGER_MIGRATIONS, "ledgers") as pair:
        yield pair


async def test_one_payload_per_binding_across_replicas(databases: tuple[Database, Database]) -> None:
    a, b = (StoredReleaseLedger(db) for db in databases)
    now = 1_000.0
    assert await a.admit("bind-1", "digest-x", now + 60, now)
    assert await b.admit("bind-1", "digest-x", now + 60, now), "the same payload again is idempotent"
    assert not await b.admit("bind-1", "digest-y", now + 60, now), "another payload under the binding"
    assert not await a.admit("bind-1", "digest-y", now + 60, now)
    assert await b.admit("bind-2", "digest-y", now + 60, now)


async def test_racing_replicas_admit_exactly_one_payload(databases: tuple[Database, Database]) -> None:
    a, b = (StoredReleaseLedger(db) for db in databases)
    now = 1_000.0
    for n in range(20):
        binding = f"race-{n}"
        results = await asyncio.gather(
            a.admit(binding, "left", now + 60, now), b.admit(binding, "right", now + 60, now)
        )
        assert sorted(results) == [False, True], results


async def test_expired_entries_are_purged(databases: tuple[Database, Database]) -> None:
    ledger = StoredReleaseLedger(databases[0], purge_every_s=10)
    assert await ledger.admit("old", "d", 100.0, 50.0)
    assert await ledger.admit("live", "d", 10_000.0, 50.0)
    assert await ledger.size() == 2
    assert await ledger.admit("new", "d", 10_000.0, 200.0)  # the purge runs first, but "old" ended only now
    assert await ledger.size() == 3
    assert await ledger.admit("newer", "d", 10_000.0, 100.0 + PURGE_GRACE_S + 1)  # "old" is past its grace
    assert await ledger.size() == 3


async def test_a_purge_never_opens_a_binding_for_a_second_payload(databases: tuple[Database, Database]) -> None:
    """Replica B (its clock a little ahead, or a later request) purges just past a binding's
    deadline while replica A, whose request read its clock just before it, admits another
    payload under the binding: A finds the first payload and refuses."""
    a, b = StoredReleaseLedger(databases[0]), StoredReleaseLedger(databases[1])
    deadline = 1_010.0
    assert await a.admit("bind", "d1", deadline, 1_009.0)
    assert await b.admit("other", "x", 5_000.0, 1_011.0)  # B's purge runs at 1_011
    assert not await a.admit("bind", "d2", deadline, 1_009.5)
    memory = MemoryReleaseLedger()
    assert await memory.admit("bind", "d1", deadline, 1_009.0)
    assert await memory.admit("other", "x", 5_000.0, 1_011.0)
    assert not await memory.admit("bind", "d2", deadline, 1_009.5)


def _record(n: int, profile: str) -> UsageRecord:
    counts = {k: Count(n * (i + 1), "known") for i, k in enumerate(KINDS)}
    if n % 3 == 0:
        counts["cache_write_1h"] = UNKNOWN
    if n % 4 == 0:
        counts["output"] = Count(n, "estimated")
    return UsageRecord(
        request_id=f"r{n}",
        attempt=n % 2,
        profile=profile,
        carrier="openai.chat",
        outcome=["released", "blocked", "withheld"][n % 3],
        status=200 if n % 3 == 0 else None,
        counts=counts,
        estimator="chars4@1" if n % 4 == 0 else None,
    )


async def test_usage_totals_agree_with_the_memory_ledger_across_replicas(
    databases: tuple[Database, Database],
) -> None:
    a, b = (StoredUsageLedger(db, keep_recent=5) for db in databases)
    memory = MemoryUsageLedger(keep_recent=5)
    records = [_record(n, ["p-one", "p-two"][n % 2]) for n in range(1, 40)]
    for n, record in enumerate(records):
        await (a if n % 2 else b).add(record)
        await memory.add(record)
    await a.flush()
    await b.flush()
    want = await memory.report()
    assert await a.report() == want
    assert await b.report() == want
    assert want["profiles"]["p-one"]["records"] == 19  # n = 2, 4, …, 38
    recent = await a.recent()
    assert len(recent) == 5 and {r.request_id for r in recent} <= {r.request_id for r in records}
    assert all(r == next(x for x in records if x.request_id == r.request_id) for r in recent)


async def test_a_stop_flushes_queued_usage(databases: tuple[Database, Database]) -> None:
    writer = StoredUsageLedger(databases[0], flush_after_s=3600)  # only a stop writes
    for n in range(1, 8):
        await writer.add(_record(n, "p"))
    reader = StoredUsageLedger(databases[1])
    assert (await reader.report())["profiles"] == {}
    await writer.close()
    assert (await reader.report())["profiles"]["p"]["records"] == 7


def slow_acknowledgement(db: Database, monkeypatch: pytest.MonkeyPatch, seconds: float = 0.3) -> None:
    """The database commits a write, and its acknowledgement takes `seconds` to arrive."""
    store: Any = db.sqlite if db.sqlite is not None else db.postgres
    original = store.write

    async def write(fn: Any) -> Any:
        result = await original(fn)
        await asyncio.sleep(seconds)  # committed: the reply is still on its way
        return result

    monkeypatch.setattr(store, "write", write)


async def test_a_stop_during_a_commit_counts_nothing_twice(
    databases: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop cancels the flush task while its COMMIT is on its way: the batch it wrote is
    not written again by the stop's own flush."""
    db, other = databases
    slow_acknowledgement(db, monkeypatch)
    ledger = StoredUsageLedger(db, flush_after_s=0.0)
    record = UsageRecord("req-1", 1, "p", "openai", "ok", 200, {kind: Count(5, "known") for kind in KINDS})
    await ledger.add(record)
    await asyncio.sleep(0.1)  # the flush task is waiting for its acknowledgement
    await ledger.close()
    report = await StoredUsageLedger(other).report()
    assert report["profiles"]["p"]["records"] == 1
    assert [r.request_id for r in await StoredUsageLedger(other).recent()] == ["req-1"]


async def test_the_queue_is_bounded_while_the_database_is_away(tmp_path: Path) -> None:
    db = await open_database("sqlite", path=tmp_path / "w.db", migrations=LEDGER_MIGRATIONS)
    ledger = StoredUsageLedger(db, flush_after_s=3600, max_pending=3)
    for n in range(1, 6):
        await ledger.add(_record(n, "p"))
    assert ledger.dropped == 2
    await ledger.close()
    assert (await ledger.report())["profiles"]["p"]["records"] == 3
    await db.close()


async def test_a_stop_while_the_database_is_away_counts_what_it_could_not_write(
    databases: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch, captured_logs: Any
) -> None:
    """The stop's last write fails: the queued records are never written, and they are
    counted (and logged) as dropped, never lost without a count."""
    db, other = databases
    ledger = StoredUsageLedger(db, flush_after_s=3600)
    for n in range(1, 6):
        await ledger.add(_record(n, "p"))
    store: Any = db.sqlite if db.sqlite is not None else db.postgres

    async def away(fn: Any) -> Any:
        raise ConnectionError("the database is away")

    monkeypatch.setattr(store, "write", away)
    mark = captured_logs.mark()
    with pytest.raises(ConnectionError):
        await ledger.close()
    assert ledger.dropped == 5 and len(ledger._pending) == 0
    assert '"event":"usage_dropped"' in captured_logs.since(mark).replace(" ", "")
    monkeypatch.undo()
    assert (await StoredUsageLedger(other).report())["profiles"] == {}


async def test_replicas_starting_together_on_an_empty_database_all_open() -> None:
    """Four replicas open one fresh PostgreSQL schema at the same moment: every one opens
    (the schema is created under the migrations' lock, not raced)."""
    require_pg()
    for _ in range(8):
        schema = f"together_{secrets.token_hex(4)}"
        try:
            opened = await asyncio.gather(
                *(open_database("postgres", dsn=PG_DSN, schema=schema, migrations=STORE_MIGRATIONS) for _ in range(4)),
                return_exceptions=True,
            )
            failures = [type(o).__name__ for o in opened if isinstance(o, BaseException)]
            for o in opened:
                if not isinstance(o, BaseException):
                    await o.close()
            assert failures == []
        finally:
            drop_schema(schema)
