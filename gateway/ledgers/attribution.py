"""The attribution ledger in the gateway's one database (beside the context store and the
usage ledger): raw boundary records and the collection switch.

Owns: its migrations (component `attribution`), the batched write of records (queued by
the flow, written off the response path in one transaction a second — a report flushes
first; a stop flushes; a SIGKILL loses at most the last second of diagnostics), the retention purge (raw records at
most `retention_s`, seven days by default and at most), the bounded read a report makes
(the newest rows, by count and by bytes), and the runtime collection switch shared by
every replica on the database (each process reads it again at most every `refresh_s`;
the process that switches knows at once).
Must not: store text, paths or raw ids (records hold block ids, keyed digests and
estimates only), block a call, or raise into one (`add` and `defer` only queue).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from gateway.attribution.ledger import Record
from gateway.context.store.database import Database
from gateway.context.store.migrations import Migration
from gateway.context.store.postgres import Conn
from gateway.ledgers.batches import BatchQueue, flush_soon, to_the_end
from gateway.obs import logging as log

ATTRIBUTION_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "attribution",
        1,
        sqlite=(
            "CREATE TABLE wg_attr_records(seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL,"
            " scope TEXT NOT NULL, session TEXT, invocation TEXT, profile TEXT NOT NULL, record TEXT NOT NULL)",
            "CREATE INDEX wg_attr_records_ts ON wg_attr_records(ts)",
            "CREATE INDEX wg_attr_records_scope_ts ON wg_attr_records(scope, ts)",
            "CREATE TABLE wg_attr_settings(name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
        ),
        postgres=(
            "CREATE TABLE wg_attr_records(seq bigserial PRIMARY KEY, ts double precision NOT NULL,"
            " scope text NOT NULL, session text, invocation text, profile text NOT NULL, record text NOT NULL)",
            "CREATE INDEX wg_attr_records_ts ON wg_attr_records(ts)",
            "CREATE INDEX wg_attr_records_scope_ts ON wg_attr_records(scope, ts)",
            "CREATE TABLE wg_attr_settings(name text PRIMARY KEY, value text NOT NULL)",
        ),
    ),
)

RETENTION_S = 7 * 86400.0  # raw records are kept at most seven days (SPEC §11)
MAX_DEFERRED_BYTES = 8 * 1024 * 1024  # request bytes held by records still to be made (see `defer`)
SLICE_S = 0.002  # deferred records are made in slices of the loop this long, yielding between
MAX_RECORDS = 100_000  # records one report reads; more makes the report `limited`
# Stored record text one report reads (more makes it `limited` too): about 14,000 calls of a
# long agent session (100 turns of history), so the rows, not their count, bound its memory.
MAX_SCAN_BYTES = 64 * 1024 * 1024
MIN_PURGE_INTERVAL_S = 1.0  # the idle purge's shortest period


Row = tuple[Any, ...]  # a stored record as `rows` reads it: ts, invocation, session, profile, record text, …


def decode(row: Row) -> Record:
    """One stored row as its Record."""
    ts, invocation, session, profile, doc = row[:5]
    return Record.from_json(float(ts), invocation, session, str(profile), json.loads(doc))


def decoded(rows: list[Row]) -> Iterator[Record]:
    """The rows' records in their order, each decoded just before it is wanted (never all at
    once); `rows` is emptied as it goes, so each row's text is let go once it is decoded."""
    rows.reverse()
    while rows:
        yield decode(rows.pop())


class AttributionLedger:
    def __init__(
        self,
        db: Database,
        *,
        retention_s: float = RETENTION_S,
        max_records: int = MAX_RECORDS,
        flush_after_s: float = 1.0,  # diagnostics: one write a second, not one per call
        max_pending: int = 10_000,
        refresh_s: float = 1.0,
        purge_every_s: float = 300.0,
        on_write: Callable[[float], None] | None = None,
        max_deferred_bytes: int = MAX_DEFERRED_BYTES,
    ) -> None:
        self._db = db
        # Told the CPU seconds this process spent on each batch written: serialising it, and on
        # SQLite the statements (on PostgreSQL they run in the server, and only the first counts).
        self._on_write = on_write
        self.retention_s = min(retention_s, RETENTION_S)
        self.max_records = max_records
        self._after = flush_after_s
        self._refresh_s = refresh_s
        self._purge_every = purge_every_s
        self._next_purge = 0.0
        # Records not yet written, at most `max_pending` besides the batch being written
        # (`BatchQueue`); a record dropped from it makes this process's reports `limited`.
        self._pending: BatchQueue[tuple[str, Record]] = BatchQueue(max_pending)
        self._deferred: deque[tuple[Callable[[], tuple[str, Record] | None], int]] = deque()
        self._deferred_bytes = 0  # request bytes the deferred records hold
        self._max_deferred_bytes = max_deferred_bytes
        self._flusher: asyncio.Task[None] | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._purger: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # One report at a time in this process (held by the report around its read and its
        # pass): concurrent observers never hold the rows of several reports at once.
        self.report_lock = asyncio.Lock()
        self._held: set[asyncio.Task[None]] = set()  # records being made off the loop
        self._enabled = False  # off by default (SPEC §11)
        self._read_at = float("-inf")

    @property
    def dropped(self) -> int:
        """Records dropped from a full queue (never written): reports say `limited`."""
        return self._pending.dropped

    # --- the switch --------------------------------------------------------------------

    async def load(self) -> None:
        """Read the switch now and purge what is past the retention (at start); from then
        on the purge also runs on an idle gateway (every `purge_every_s`)."""
        self._enabled = await self._read_switch()
        self._read_at = time.monotonic()
        await self.flush()
        if self._purger is None:
            self._purger = asyncio.create_task(self._purge_periodically(), name="attribution-purge")

    def configure(self, *, retention_s: float, max_records: int) -> None:
        """The `[attribution]` bounds of a reloaded configuration (retention capped at seven
        days): a shorter retention is applied by the next write or purge, at once."""
        retention = min(retention_s, RETENTION_S)
        if retention < self.retention_s:
            self._next_purge = 0.0
        self.retention_s = retention
        self.max_records = max_records

    async def _purge_periodically(self) -> None:
        """Raw records never outlive the retention, calls or none: the purge's own clock."""
        while True:
            await asyncio.sleep(max(self._purge_every, MIN_PURGE_INTERVAL_S))
            try:
                await self.flush()
            except Exception as exc:  # the database is away: the next round retries
                log.error("attribution_flush_failed", error_class=type(exc).__name__, count=len(self._pending))

    @property
    def collecting(self) -> bool:
        """The switch as last read; a stale value starts a re-read in the background
        (the call in hand is never held up by it)."""
        if time.monotonic() - self._read_at > self._refresh_s and (self._refresher is None or self._refresher.done()):
            self._read_at = time.monotonic()
            self._refresher = asyncio.create_task(self._refresh(), name="attribution-switch")
        return self._enabled

    async def _refresh(self) -> None:
        """Re-read the switch; and purge when due, collecting or not (raw records never
        outlive the retention because collection was switched off)."""
        try:
            self._enabled = await self._read_switch()
            await self.flush()
        except Exception as exc:  # keep the last known value
            log.error("attribution_switch_read_failed", error_class=type(exc).__name__)

    async def _read_switch(self) -> bool:
        if self._db.sqlite is not None:
            row = await self._db.sqlite.read(
                lambda c: c.execute("SELECT value FROM wg_attr_settings WHERE name = 'collection'").fetchone()
            )
        else:

            async def pg(conn: Conn) -> Any:
                cur = await conn.execute("SELECT value FROM wg_attr_settings WHERE name = 'collection'")
                return await cur.fetchone()

            assert self._db.postgres is not None
            row = await self._db.postgres.read(pg)
        return row is not None and row[0] == "on"

    async def set_collecting(self, on: bool) -> None:
        """Switch collection for every process on this database. Switching on does not
        back-fill: only calls that end from now on are recorded."""
        value = "on" if on else "off"
        if self._db.sqlite is not None:
            await self._db.sqlite.write(
                lambda c: c.execute(
                    "INSERT INTO wg_attr_settings(name, value) VALUES ('collection', ?)"
                    " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                    (value,),
                )
            )
        else:

            async def pg(conn: Conn) -> None:
                await conn.execute(
                    "INSERT INTO wg_attr_settings(name, value) VALUES ('collection', %s)"
                    " ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    (value,),
                )

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)
        self._enabled = on
        self._read_at = time.monotonic()

    # --- writing -----------------------------------------------------------------------

    def hold(self, task: asyncio.Task[None]) -> None:
        """Keep a task that will `add` a record (made off the loop) until it is done; a
        stop waits for it."""
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    def add(self, scope: str, record: Record) -> None:
        """Queue a record (never waits, never touches the database on the caller's path)."""
        self._queue(scope, record)
        self._schedule()

    def defer(self, make: Callable[[], tuple[str, Record] | None], weight: int) -> bool:
        """Queue a record to be made by the next batched write (`make` returns it, or None for
        none; it must not raise), holding `weight` request bytes until then. Made one after
        another, records cost a fraction of what each costs right after its own call. False
        (make it now and `add` it) when the bodies already held reach `max_deferred_bytes` or
        the queue is full."""
        if (
            self._deferred_bytes + weight > self._max_deferred_bytes
            or len(self._deferred) + len(self._pending) >= self._pending.max_pending
        ):
            return False
        self._deferred.append((make, weight))
        self._deferred_bytes += weight
        self._schedule()
        return True

    def _queue(self, scope: str, record: Record) -> None:
        self._pending.put((scope, record))  # a drop: reports from this process say `limited` from now on

    def _schedule(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon(), name="attribution-flush")

    async def _make_deferred(self) -> None:
        """Make the records deferred so far, in slices of at most SLICE_S of the loop (a
        second of calls at a few hundred a second is several milliseconds of work)."""
        left = len(self._deferred)  # records deferred meanwhile wait for the next write
        while left:
            until = time.perf_counter() + SLICE_S
            while left and time.perf_counter() < until:
                make, weight = self._deferred.popleft()
                left -= 1
                self._deferred_bytes -= weight
                try:
                    made = make()
                except Exception as exc:  # `make` logs its own failures; this is the backstop
                    log.error("attribution_record_failed", error_class=type(exc).__name__)
                    continue
                if made is not None:
                    self._queue(*made)
            if left:
                await asyncio.sleep(0)

    async def _flush_soon(self) -> None:
        await flush_soon(self._after, self.flush, self._waiting, "attribution_flush_failed")

    def _waiting(self) -> int:
        """Records not yet written: queued, or deferred to be made with the next write."""
        return len(self._pending) + len(self._deferred)

    async def flush(self) -> None:
        async with self._lock:
            await self._make_deferred()
            now = time.time()
            purge_before = now - self.retention_s if now >= self._next_purge else None
            if not self._pending and purge_before is None:
                return
            with self._pending.batch() as taken:  # back in front unless it is committed
                await self._write(taken.items, taken.written, now, purge_before)

    async def _write(
        self, batch: list[tuple[str, Record]], written: Callable[[], None], now: float, purge_before: float | None
    ) -> None:
        """Write `batch` (and purge what is older than `purge_before`) in one transaction;
        `written()` once it is committed."""
        started = time.thread_time()
        rows = [(r.ts, scope, r.session, r.invocation, r.profile, r.as_text()) for scope, r in batch]
        spent = [time.thread_time() - started]  # the loop's part, then each thread's
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> None:
                started = time.thread_time()
                conn.executemany(
                    "INSERT INTO wg_attr_records(ts, scope, session, invocation, profile, record)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
                if purge_before is not None:
                    conn.execute("DELETE FROM wg_attr_records WHERE ts < ?", (purge_before,))
                spent.append(time.thread_time() - started)

            committed = self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> None:
                async with conn.cursor() as cur:
                    if rows:
                        await cur.executemany(
                            "INSERT INTO wg_attr_records(ts, scope, session, invocation, profile, record)"
                            " VALUES (%s, %s, %s, %s, %s, %s)",
                            rows,
                        )
                    if purge_before is not None:
                        await cur.execute("DELETE FROM wg_attr_records WHERE ts < %s", (purge_before,))

            assert self._db.postgres is not None
            committed = self._db.postgres.write(pg)

        async def write() -> None:
            await committed
            written()
            if self._on_write is not None and batch:
                self._on_write(sum(spent))
            if purge_before is not None:
                self._next_purge = now + self._purge_every

        await to_the_end(write())  # a stop mid-COMMIT never leaves the batch queued to be written again

    async def close(self) -> None:
        if self._held:
            await asyncio.wait(set(self._held), timeout=5.0)
        for task in (self._flusher, self._refresher, self._purger):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        await self.flush()

    # --- reading -----------------------------------------------------------------------

    async def rows(self, scope: str | None, until: float, *, now: float) -> tuple[list[Row], bool]:
        """The raw rows a report reads, oldest first, and whether more were there (the report
        is then `limited`, reason `record_bound`): of the retention window up to `until`, the
        newest rows up to `max_records` and up to MAX_SCAN_BYTES of stored record text (at
        least the newest row, however long). Nothing is decoded here: `decoded` makes each
        record as it is wanted, off the loop (see `gateway.api.attribution.build_report`).

        The byte bound is counted in SQL (the same text for SQLite and PostgreSQL): a window
        sum of `length(record)` over the newest `max_records + 1` rows, newest first; only
        those rows' own text is then fetched, with one row past either bound to tell whether
        the read was limited. Stored records are ASCII JSON: characters are bytes."""
        await self.flush()
        start = now - self.retention_s
        budget = MAX_SCAN_BYTES
        where = "ts >= ? AND ts <= ?" + (" AND scope = ?" if scope is not None else "")
        params: tuple[Any, ...] = (start, until, scope) if scope is not None else (start, until)
        sql = (
            "SELECT r.ts, r.invocation, r.session, r.profile, r.record, c.rn, c.scanned FROM ("  # noqa: S608 -- fixed text
            " SELECT seq, n, ROW_NUMBER() OVER w AS rn, SUM(n) OVER w AS scanned FROM ("
            f"  SELECT seq, ts, length(record) AS n FROM wg_attr_records WHERE {where}"
            "   ORDER BY ts DESC, seq DESC LIMIT ?"
            " ) AS newest WINDOW w AS (ORDER BY ts DESC, seq DESC ROWS UNBOUNDED PRECEDING)"
            ") AS c JOIN wg_attr_records AS r ON r.seq = c.seq"
            " WHERE c.rn <= 2 OR c.scanned - c.n <= ?"  # the rows within both bounds, and the first past them
            " ORDER BY c.rn DESC"
        )
        args = (*params, self.max_records + 1, budget)
        if self._db.sqlite is not None:
            rows = await self._db.sqlite.read(lambda c: c.execute(sql, args).fetchall())
        else:
            pg_sql = sql.replace("?", "%s")

            async def pg(conn: Conn) -> list[Row]:
                cur = await conn.execute(pg_sql, args)
                return list(await cur.fetchall())

            assert self._db.postgres is not None
            rows = await self._db.postgres.read(pg)
        # Oldest first: a row past a bound can only be the first (the newest rows are kept).
        limited = False
        if rows:
            rn, scanned = int(rows[0][5]), int(rows[0][6])
            if rn > self.max_records or (rn > 1 and scanned > budget):
                del rows[0]
                limited = True
        return rows, limited

    async def records(self, scope: str | None, until: float, *, now: float) -> tuple[list[Record], bool]:
        """`rows`, each decoded (tests; a report uses `rows` and `decoded`)."""
        rows, limited = await self.rows(scope, until, now=now)
        return list(decoded(rows)), limited

    async def count(self) -> int:
        """Records held (tests)."""
        await self.flush()
        if self._db.sqlite is not None:
            return int(
                await self._db.sqlite.read(lambda c: c.execute("SELECT count(*) FROM wg_attr_records").fetchone()[0])
            )

        async def pg(conn: Conn) -> int:
            cur = await conn.execute("SELECT count(*) FROM wg_attr_records")
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        assert self._db.postgres is not None
        return await self._db.postgres.read(pg)
