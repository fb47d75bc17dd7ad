"""The cache pace ledger in the one database (SQLite and PostgreSQL): two ledger objects on
one database stand for two replicas sharing it. A session's record is bounded (events per
session, sessions by recency and idleness), content-free (a keyed digest, times and token
counts), and what one replica appends the other plans from."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gateway import caching
from gateway.cachepace import MAX_EVENTS, PaceEvent
from gateway.context.store.database import Database
from gateway.context.store.postgres import Conn
from gateway.ledgers.pace import PACE_MIGRATIONS, StoredPaceLedger, session_digest
from tests.context.conftest import replica_databases

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def databases(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Database, Database]]:
    """Two handles on one database, as two replicas hold them."""
    async with replica_databases(request.param, tmp_path, PACE_MIGRATIONS, "pace") as pair:
        yield pair


async def test_replicas_share_a_sessions_pace(databases: tuple[Database, Database]) -> None:
    t = [1_000.0]
    a, b = (StoredPaceLedger(db, clock=lambda: t[0]) for db in databases)
    await a.add("s1", PaceEvent(1_000.0, read=0, write_5m=4000, write_1h=0))
    t[0] = 1_400.0
    await b.add("s1", PaceEvent(1_400.0, read=0, write_5m=0, write_1h=4200))
    expected = (PaceEvent(1_000.0, 0, 4000, 0), PaceEvent(1_400.0, 0, 0, 4200))
    assert await a.get("s1") == expected and await b.get("s1") == expected
    assert await a.get("other") == ()


async def test_events_per_session_are_bounded(databases: tuple[Database, Database]) -> None:
    ledger = StoredPaceLedger(databases[0], clock=lambda: 0.0)
    for i in range(MAX_EVENTS + 8):
        await ledger.add("s1", PaceEvent(float(i), read=i, write_5m=None, write_1h=None))
    kept = await ledger.get("s1")
    assert len(kept) == MAX_EVENTS and kept[0].at == 8.0 and kept[-1].at == MAX_EVENTS + 7.0
    assert await ledger.sizes() == (1, MAX_EVENTS)


async def test_sessions_are_bounded_least_recent_and_idle_first(databases: tuple[Database, Database]) -> None:
    t = [10_000.0]
    ledger = StoredPaceLedger(databases[0], max_sessions=3, idle_s=3_600.0, purge_every_s=1e9, clock=lambda: t[0])
    for i, at in enumerate((9_000.0, 9_100.0, 9_200.0, 9_300.0, 9_400.0)):
        await ledger.add(f"s{i}", PaceEvent(at, read=0))
        await ledger.add(f"s{i}", PaceEvent(at + 1, read=0))
    await ledger.purge()
    assert await ledger.sizes() == (3, 6)
    assert await ledger.get("s0") == () and await ledger.get("s1") == ()
    assert len(await ledger.get("s4")) == 2
    t[0] = 9_302.0 + 3_600.0 + 1  # s2 and s3 have been idle past an hour; s4 has not
    await ledger.purge()
    assert await ledger.sizes() == (1, 2) and len(await ledger.get("s4")) == 2


async def test_the_record_is_content_free(databases: tuple[Database, Database]) -> None:
    db = databases[0]
    ledger = StoredPaceLedger(db, clock=lambda: 0.0)
    ctx = caching.CacheContext("alice@example.com", "team-a", "mock-anthropic", "session-secret-id")
    digest = session_digest(b"k" * 32, caching.cache_key(ctx, "principal"))
    assert digest != session_digest(b"j" * 32, caching.cache_key(ctx, "principal"))  # keyed
    await ledger.add(digest, PaceEvent(1.0, read=10, write_5m=20, write_1h=30))
    if db.sqlite is not None:
        cols = await db.sqlite.read(
            lambda c: {
                t: [r[1] for r in c.execute(f"PRAGMA table_info({t})")]
                for t in ("wg_cache_pace_sessions", "wg_cache_pace_events")
            }
        )
        rows = await db.sqlite.read(
            lambda c: (
                [tuple(r) for r in c.execute("SELECT * FROM wg_cache_pace_events")]
                + [tuple(r) for r in c.execute("SELECT * FROM wg_cache_pace_sessions")]
            )
        )
    else:
        assert db.postgres is not None

        async def pg(conn: Conn) -> tuple[dict[str, list[str]], list[tuple[object, ...]]]:
            out: dict[str, list[str]] = {}
            for t in ("wg_cache_pace_sessions", "wg_cache_pace_events"):
                cur = await conn.execute(f"SELECT * FROM {t} LIMIT 0")
                out[t] = [d.name for d in cur.description or ()]
            found: list[tuple[object, ...]] = []
            for t in ("wg_cache_pace_events", "wg_cache_pace_sessions"):
                cur = await conn.execute(f"SELECT * FROM {t}")
                found += [tuple(r) for r in await cur.fetchall()]
            return out, found

        cols, rows = await db.postgres.read(pg)
    assert cols == {
        "wg_cache_pace_sessions": ["session", "last_at"],
        "wg_cache_pace_events": ["seq", "session", "at", "read", "write_5m", "write_1h"],
    }
    text = repr(rows)
    for raw in ("alice", "team-a", "session-secret-id"):
        assert raw not in text
    assert all(isinstance(v, int | float) or v == digest for row in rows for v in row)
