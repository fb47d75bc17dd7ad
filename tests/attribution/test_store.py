"""The attribution ledger in the one database, SQLite and PostgreSQL: records round-trip
without content, a report reads at most its bound (then it is `limited`), raw records are
purged after the retention, and the collection switch is shared by every process on the
database (two handles stand for two replicas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway.app import STORE_MIGRATIONS
from gateway.attribution import registry
from gateway.attribution.blocks import Block
from gateway.attribution.ledger import Record, aggregate
from gateway.context.store.database import Database
from gateway.ledgers.attribution import AttributionLedger
from tests.context.conftest import replica_databases
from tests.test_ledgers_stored import slow_acknowledgement

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def databases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Database, Database]]:
    """Two handles on one database, as two replicas hold them."""
    async with replica_databases(request.param, tmp_path, STORE_MIGRATIONS, "attr") as pair:
        yield pair


def _record(ts: float, n: int) -> Record:
    return Record(
        ts,
        (Block("prompt.system_instructions", "h:aa", 10), Block("prompt.current_user_turn", f"h:{n:02x}", n)),
        invocation=f"h:inv{n}",
        session="h:s",
        usage={"input_total": (20 + n, "known"), "output": (None, "unknown")},
        profile="p",
    )


async def test_records_round_trip_and_the_report_is_limited_at_its_bound(databases: tuple[Database, Database]) -> None:
    db, _ = databases
    ledger = AttributionLedger(db, max_records=3, flush_after_s=0.0)
    now = time.time()
    for n in range(5):
        ledger.add("h:scope", _record(now - 10 + n, n))
    ledger.add("h:other", _record(now - 1, 9))
    records, limited = await ledger.records("h:scope", now, now=now)
    assert limited and [r.invocation for r in records] == ["h:inv2", "h:inv3", "h:inv4"]  # the newest, oldest first
    assert records[0] == _record(now - 8, 2)
    everything, limited_all = await AttributionLedger(db, max_records=10).records(None, now, now=now)
    assert not limited_all and len(everything) == 6
    report = aggregate(records, registry.build(), limited_scan=limited)
    assert report["limited"] is True and report["limitReasons"] == ["record_bound"]
    await ledger.close()


async def test_raw_records_older_than_the_retention_are_purged(databases: tuple[Database, Database]) -> None:
    db, _ = databases
    ledger = AttributionLedger(db, retention_s=60.0, flush_after_s=0.0)
    now = time.time()
    ledger.add("h:scope", _record(now - 120, 1))
    ledger.add("h:scope", _record(now - 5, 2))
    await ledger.flush()
    assert await ledger.count() == 1
    assert AttributionLedger(db, retention_s=30 * 86400).retention_s == 7 * 86400  # never past seven days
    await ledger.close()


async def test_the_switch_is_off_by_default_and_shared(databases: tuple[Database, Database]) -> None:
    one, two = databases
    first = AttributionLedger(one, refresh_s=0.0)
    second = AttributionLedger(two, refresh_s=0.0)
    await first.load()
    await second.load()
    assert not first.collecting and not second.collecting
    await first.set_collecting(True)
    assert first.collecting
    await second.load()
    assert second.collecting
    await second.set_collecting(False)
    await first.load()
    assert not first.collecting
    await first.close()
    await second.close()


async def test_the_purge_runs_while_collection_is_off(databases: tuple[Database, Database]) -> None:
    db, _ = databases
    now = time.time()
    writer = AttributionLedger(db, flush_after_s=0.0)
    writer._next_purge = float("inf")  # this writer never purges by itself
    writer.add("h:scope", _record(now - 8 * 86400, 1))
    writer.add("h:scope", _record(now, 2))
    await writer.flush()
    assert await writer.count() == 2
    reader = AttributionLedger(db, refresh_s=0.0, purge_every_s=0.0)
    await reader.load()  # collection off; the start purges
    assert await writer.count() == 1
    writer.add("h:scope", _record(now - 8 * 86400, 3))
    await writer.flush()
    assert await writer.count() == 2
    assert not reader.collecting  # a stale switch is re-read in the background, with a purge
    for _ in range(50):
        await asyncio.sleep(0.02)
        if await writer.count() == 1:
            break
    assert await writer.count() == 1
    await reader.close()


async def test_an_idle_ledger_still_purges(databases: tuple[Database, Database]) -> None:
    """No call and no report for a while: raw records still leave at their retention."""
    db, other = databases
    ledger = AttributionLedger(db, retention_s=1.0, flush_after_s=0.0, purge_every_s=0.0)
    await ledger.load()
    ledger.add("h:scope", _record(time.time(), 1))
    await ledger.flush()
    observer = AttributionLedger(other)  # another replica's handle: counting it never purges
    observer._next_purge = float("inf")
    assert await observer.count() == 1
    for _ in range(80):
        await asyncio.sleep(0.05)
        if await observer.count() == 0:
            break
    assert await observer.count() == 0
    await ledger.close()


async def test_reloaded_bounds_apply_at_once(databases: tuple[Database, Database]) -> None:
    db, _ = databases
    ledger = AttributionLedger(db, flush_after_s=0.0)
    await ledger.load()
    now = time.time()
    ledger.add("h:scope", _record(now - 2 * 86400, 1))
    ledger.add("h:scope", _record(now - 60, 2))
    await ledger.flush()
    assert await ledger.count() == 2
    ledger.configure(retention_s=86400.0, max_records=10)
    assert (ledger.retention_s, ledger.max_records) == (86400.0, 10)
    records, _ = await ledger.records(None, now, now=now)
    assert [r.invocation for r in records] == ["h:inv2"] and await ledger.count() == 1
    ledger.configure(retention_s=30 * 86400.0, max_records=10)
    assert ledger.retention_s == 7 * 86400  # never past seven days
    await ledger.close()


async def test_the_queue_is_bounded_and_says_what_it_dropped(databases: tuple[Database, Database]) -> None:
    db, _ = databases
    ledger = AttributionLedger(db, max_pending=2, flush_after_s=60.0)
    now = time.time()
    for n in range(3):
        ledger.add("h:scope", _record(now, n))
    assert ledger.dropped == 1
    records, _ = await ledger.records(None, now + 1, now=now)
    assert [r.invocation for r in records] == ["h:inv1", "h:inv2"]
    await ledger.close()


async def test_deferred_records_are_made_by_the_batched_write_within_their_budget(
    databases: tuple[Database, Database],
) -> None:
    """`defer`: records are made, in order, by the next write (a report writes first), with
    the time their call ended; a `make` that fails or returns None leaves the others; past
    the budget of held request bytes `defer` says no (the caller makes the record now)."""
    db, _ = databases
    ledger = AttributionLedger(db, flush_after_s=60.0, max_deferred_bytes=1000)
    now = time.time()
    made: list[int] = []

    def make(n: int) -> tuple[str, Record] | None:
        made.append(n)
        if n == 2:
            raise RuntimeError("a record that cannot be made")
        return None if n == 3 else ("h:scope", _record(now - 10 + n, n))

    assert all(ledger.defer(lambda n=n: make(n), 200) for n in range(5))
    assert not ledger.defer(lambda: make(99), 1)  # 1,000 bytes held: full
    assert made == []  # nothing made on the calls' path
    records, _ = await ledger.records("h:scope", now, now=now)
    assert made == [0, 1, 2, 3, 4]
    assert [r.invocation for r in records] == ["h:inv0", "h:inv1", "h:inv4"]
    assert records[0] == _record(now - 10, 0)  # made later, stamped with its call's time
    assert ledger.defer(lambda: make(5), 1000)  # the budget is free again
    await ledger.close()  # a stop makes and writes what is deferred
    again, _ = await AttributionLedger(db).records("h:scope", now, now=now)
    assert [r.invocation for r in again] == ["h:inv0", "h:inv1", "h:inv4", "h:inv5"]


async def test_a_stop_during_a_commit_writes_nothing_twice(
    databases: tuple[Database, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop cancels the batched write while its COMMIT is on its way: the records it
    wrote are not written again by the stop's own flush."""
    db, other = databases
    slow_acknowledgement(db, monkeypatch)
    ledger = AttributionLedger(db, flush_after_s=0.0)
    ledger.add("h:scope", _record(time.time(), 1))
    await asyncio.sleep(0.1)  # the batched write is waiting for its acknowledgement
    await ledger.close()
    observer = AttributionLedger(other)
    observer._next_purge = float("inf")
    assert await observer.count() == 1
