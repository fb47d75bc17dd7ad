"""The ledgers in the gateway's one database: shared by every replica that shares it, and
kept across restarts.

Owns: the release ledger for bindings a caller presents (`StoredReleaseLedger`: one payload
per send binding, whichever replica sees it first wins, the rest get the same answer) and the
usage ledger (`StoredUsageLedger`: per-profile totals as counters, the most recent records,
bounded), their migrations for SQLite and PostgreSQL, and the batching that keeps a usage
write off the response path.
Must not: hold content, or anything keyed by scope or principal; log what it stores.

Why two release ledgers: a binding a client carries (the check API's `request_binding`) may
come back to any replica, so it is admitted here. A proxied call's send binding is minted,
used and released inside one exchange on one replica and never leaves it; that one stays in
the process (`MemoryReleaseLedger`), and costs no database write per call.

Usage writes are batched: `add` queues the record and a flush task writes every queued record
in one transaction soon after (`flush_after_s`). A stop (SIGTERM, app cleanup) flushes; a
SIGKILL can lose at most the records of the last `flush_after_s`. A write takes its batch out
of the queue; records added meanwhile wait for the next write, which the flush task makes
`flush_after_s` after it. If the database is down the queue is kept up to `max_pending`
records not yet being written (a failed write puts its batch back in front); past that the
oldest are dropped and counted (`dropped`), never blocking a call (`BatchQueue`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any

from gateway.context.store.database import Database
from gateway.context.store.migrations import Migration
from gateway.context.store.postgres import Conn
from gateway.ledgers.batches import BatchQueue, flush_soon, to_the_end
from gateway.ledgers.release import PURGE_GRACE_S
from gateway.obs import logging as log
from gateway.usage import KINDS, UsageRecord

LEDGER_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "release_ledger",
        1,
        sqlite=(
            "CREATE TABLE wg_release_ledger(binding_id TEXT PRIMARY KEY, payload_digest TEXT NOT NULL,"
            " until_ts REAL NOT NULL) WITHOUT ROWID",
            "CREATE INDEX wg_release_ledger_until ON wg_release_ledger(until_ts)",
        ),
        postgres=(
            "CREATE TABLE wg_release_ledger(binding_id text PRIMARY KEY, payload_digest text NOT NULL,"
            " until_ts double precision NOT NULL)",
            "CREATE INDEX wg_release_ledger_until ON wg_release_ledger(until_ts)",
        ),
    ),
    Migration(
        "usage_ledger",
        1,
        sqlite=(
            "CREATE TABLE wg_usage_totals(profile TEXT NOT NULL, metric TEXT NOT NULL, value INTEGER NOT NULL,"
            " PRIMARY KEY(profile, metric)) WITHOUT ROWID",
            "CREATE TABLE wg_usage_recent(seq INTEGER PRIMARY KEY AUTOINCREMENT, record TEXT NOT NULL)",
        ),
        postgres=(
            "CREATE TABLE wg_usage_totals(profile text NOT NULL, metric text NOT NULL, value bigint NOT NULL,"
            " PRIMARY KEY(profile, metric))",
            "CREATE TABLE wg_usage_recent(seq bigserial PRIMARY KEY, record text NOT NULL)",
        ),
    ),
)


class StoredReleaseLedger:
    """`ReleaseLedger` in the database. Expired entries are purged every `purge_every_s`,
    `PURGE_GRACE_S` after their deadline: a replica's clock (or a request that read its
    clock before waiting for the database) may still admit under a binding a moment past
    another replica's idea of its deadline, and must find the payload it already holds."""

    def __init__(self, db: Database, *, purge_every_s: float = 60.0) -> None:
        self._db = db
        self._purge_every = purge_every_s
        self._next_purge = 0.0

    async def admit(self, binding_id: str, payload_digest: str, until: float, now: float) -> bool:
        if now >= self._next_purge:
            self._next_purge = now + self._purge_every
            await self._purge(now)
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> str:
                conn.execute(
                    "INSERT INTO wg_release_ledger(binding_id, payload_digest, until_ts) VALUES (?, ?, ?)"
                    " ON CONFLICT(binding_id) DO NOTHING",
                    (binding_id, payload_digest, until),
                )
                row = conn.execute(
                    "SELECT payload_digest FROM wg_release_ledger WHERE binding_id = ?", (binding_id,)
                ).fetchone()
                return str(row[0])

            known = await self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> str:
                cur = await conn.execute(
                    "INSERT INTO wg_release_ledger(binding_id, payload_digest, until_ts) VALUES (%s, %s, %s)"
                    " ON CONFLICT (binding_id) DO NOTHING RETURNING payload_digest",
                    (binding_id, payload_digest, until),
                )
                row = await cur.fetchone()
                if row is None:  # another replica (or an earlier check) admitted it first
                    cur = await conn.execute(
                        "SELECT payload_digest FROM wg_release_ledger WHERE binding_id = %s", (binding_id,)
                    )
                    row = await cur.fetchone()
                assert row is not None
                return str(row[0])

            assert self._db.postgres is not None
            known = await self._db.postgres.write(pg)
        return known == payload_digest

    async def _purge(self, now: float) -> None:
        if self._db.sqlite is not None:
            before = now - PURGE_GRACE_S
            await self._db.sqlite.write(
                lambda c: c.execute("DELETE FROM wg_release_ledger WHERE until_ts < ?", (before,))
            )
        else:

            async def pg(conn: Conn) -> None:
                await conn.execute("DELETE FROM wg_release_ledger WHERE until_ts < %s", (now - PURGE_GRACE_S,))

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)

    async def size(self) -> int:
        """Entries held (tests, soak figures)."""
        if self._db.sqlite is not None:
            return int(
                await self._db.sqlite.read(lambda c: c.execute("SELECT count(*) FROM wg_release_ledger").fetchone()[0])
            )

        async def pg(conn: Conn) -> int:
            cur = await conn.execute("SELECT count(*) FROM wg_release_ledger")
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        assert self._db.postgres is not None
        return await self._db.postgres.read(pg)


def increments(record: UsageRecord) -> dict[str, int]:
    """The counters one record adds to its profile's totals (names as the report spells them)."""
    out = {"records": 1, f"outcome:{record.outcome}": 1}
    for kind in KINDS:
        count = record.counts[kind]
        if count.value is None:
            out[f"tokens:{kind}:unknown_records"] = 1
        else:
            out[f"tokens:{kind}:{count.provenance}"] = count.value
    return out


def report_from_totals(rows: list[tuple[str, str, int]]) -> dict[str, Any]:
    """The usage report (the in-memory ledger's shape) from (profile, metric, value) rows."""
    profiles: dict[str, dict[str, Any]] = {}
    for profile, metric, value in rows:
        entry = profiles.setdefault(profile, {"records": 0, "outcomes": {}, "tokens": {}})
        if metric == "records":
            entry["records"] = int(value)
        elif metric.startswith("outcome:"):
            entry["outcomes"][metric.removeprefix("outcome:")] = int(value)
        elif metric.startswith("tokens:"):
            _, kind, slot = metric.split(":", 2)
            entry["tokens"].setdefault(kind, {"known": 0, "estimated": 0, "unknown_records": 0})[slot] = int(value)
    for entry in profiles.values():
        entry["outcomes"] = dict(sorted(entry["outcomes"].items()))
        entry["tokens"] = {k: entry["tokens"][k] for k in KINDS if k in entry["tokens"]}
    return {
        "schema": "wiregate.usage-report.v1",
        "kinds": list(KINDS),
        "profiles": dict(sorted(profiles.items())),
    }


def _log_dropped(count: int) -> None:
    log.error("usage_dropped", count=count)


class StoredUsageLedger:
    """`UsageLedger` in the database, written in batches (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        *,
        keep_recent: int = 200,
        flush_after_s: float = 0.25,
        max_pending: int = 10_000,
    ) -> None:
        self._db = db
        self._keep = keep_recent
        self._after = flush_after_s
        self._pending: BatchQueue[UsageRecord] = BatchQueue(max_pending, on_drop=_log_dropped)
        self._flusher: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    @property
    def dropped(self) -> int:
        """Records dropped from a full queue (never written)."""
        return self._pending.dropped

    async def add(self, record: UsageRecord) -> None:
        self._pending.put(record)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon(), name="usage-flush")

    async def _flush_soon(self) -> None:
        await flush_soon(self._after, self.flush, lambda: len(self._pending), "usage_flush_failed")

    async def flush(self) -> None:
        """Write every queued record now (one transaction)."""
        async with self._lock:
            if not self._pending:
                return
            with self._pending.batch() as taken:  # back in front unless it is committed
                await self._write(taken.items, taken.written)

    async def _write(self, batch: list[UsageRecord], written: Callable[[], None]) -> None:
        """Write `batch` in one transaction; `written()` once it is committed."""
        totals: dict[tuple[str, str], int] = {}
        for record in batch:
            for metric, value in increments(record).items():
                key = (record.profile, metric)
                totals[key] = totals.get(key, 0) + value
        rows = [(p, m, v) for (p, m), v in totals.items()]
        docs = [json.dumps(r.as_json(), separators=(",", ":")) for r in batch[-self._keep :]]
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> None:
                conn.executemany(
                    "INSERT INTO wg_usage_totals(profile, metric, value) VALUES (?, ?, ?)"
                    " ON CONFLICT(profile, metric) DO UPDATE SET value = value + excluded.value",
                    rows,
                )
                conn.executemany("INSERT INTO wg_usage_recent(record) VALUES (?)", [(d,) for d in docs])
                conn.execute(
                    "DELETE FROM wg_usage_recent WHERE seq <= (SELECT max(seq) FROM wg_usage_recent) - ?",
                    (self._keep,),
                )

            committed = self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> None:
                async with conn.cursor() as cur:
                    await cur.executemany(
                        "INSERT INTO wg_usage_totals(profile, metric, value) VALUES (%s, %s, %s)"
                        " ON CONFLICT (profile, metric) DO UPDATE"
                        " SET value = wg_usage_totals.value + excluded.value",
                        sorted(rows),  # one lock order for every replica: no deadlock between batches
                    )
                    await cur.executemany("INSERT INTO wg_usage_recent(record) VALUES (%s)", [(d,) for d in docs])
                    await cur.execute(
                        "DELETE FROM wg_usage_recent WHERE seq <= (SELECT max(seq) FROM wg_usage_recent) - %s",
                        (self._keep,),
                    )

            assert self._db.postgres is not None
            committed = self._db.postgres.write(pg)

        async def write() -> None:
            await committed
            written()

        await to_the_end(write())  # a stop mid-COMMIT never leaves the batch queued to be added again

    async def close(self) -> None:
        """Flush what is queued (a stop loses nothing, and adds nothing twice); when that last
        write fails (the database away), what it held is counted as dropped (`usage_dropped`)."""
        if self._flusher is not None and not self._flusher.done():
            self._flusher.cancel()
            try:
                await self._flusher
            except asyncio.CancelledError:
                pass
        try:
            await self.flush()
        except BaseException:
            self._pending.drop_all()
            raise

    async def recent(self) -> list[UsageRecord]:
        await self.flush()
        if self._db.sqlite is not None:
            docs = await self._db.sqlite.read(
                lambda c: [
                    r[0]
                    for r in c.execute("SELECT record FROM wg_usage_recent ORDER BY seq DESC LIMIT ?", (self._keep,))
                ]
            )
        else:

            async def pg(conn: Conn) -> list[str]:
                cur = await conn.execute("SELECT record FROM wg_usage_recent ORDER BY seq DESC LIMIT %s", (self._keep,))
                return [r[0] for r in await cur.fetchall()]

            assert self._db.postgres is not None
            docs = await self._db.postgres.read(pg)
        return [UsageRecord.from_json(json.loads(d)) for d in reversed(docs)]

    async def report(self) -> dict[str, Any]:
        await self.flush()
        if self._db.sqlite is not None:
            rows = await self._db.sqlite.read(
                lambda c: [tuple(r) for r in c.execute("SELECT profile, metric, value FROM wg_usage_totals")]
            )
        else:

            async def pg(conn: Conn) -> list[tuple[Any, ...]]:
                cur = await conn.execute("SELECT profile, metric, value FROM wg_usage_totals")
                return [tuple(r) for r in await cur.fetchall()]

            assert self._db.postgres is not None
            rows = await self._db.postgres.read(pg)
        return report_from_totals([(str(p), str(m), int(v)) for p, m, v in rows])
