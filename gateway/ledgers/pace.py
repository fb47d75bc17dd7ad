"""The cache pace ledger: per session, when its recent requests started and how many tokens
the provider said each read and wrote — in the gateway's one database, so every replica that
shares it plans a session from the same record.

Owns: the `cache_pace` migration, the keyed session digest (`session_digest`: an HMAC of the
planner's stable cache key, so neither a session id nor a principal is ever stored), and
`StoredPaceLedger` with its bounds: at most `cachepace.MAX_EVENTS` events per session, at most
`max_sessions` sessions (least recently seen dropped first) and none idle longer than
`idle_s`. A row holds a digest, a time and three token counts: nothing from the content.
Must not: hold content or raw identifiers; fail a request (callers catch and log).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from gateway.cachepace import MAX_EVENTS, PaceEvent
from gateway.context.store.database import Database
from gateway.context.store.migrations import Migration
from gateway.context.store.postgres import Conn
from gateway.obs.logging import hmac_sha256

PACE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "cache_pace",
        1,
        sqlite=(
            "CREATE TABLE wg_cache_pace_sessions(session TEXT PRIMARY KEY, last_at REAL NOT NULL) WITHOUT ROWID",
            "CREATE INDEX wg_cache_pace_sessions_last ON wg_cache_pace_sessions(last_at)",
            "CREATE TABLE wg_cache_pace_events(seq INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT NOT NULL,"
            " at REAL NOT NULL, read INTEGER, write_5m INTEGER, write_1h INTEGER)",
            "CREATE INDEX wg_cache_pace_events_session ON wg_cache_pace_events(session, at)",
        ),
        postgres=(
            "CREATE TABLE wg_cache_pace_sessions(session text PRIMARY KEY, last_at double precision NOT NULL)",
            "CREATE INDEX wg_cache_pace_sessions_last ON wg_cache_pace_sessions(last_at)",
            "CREATE TABLE wg_cache_pace_events(seq bigserial PRIMARY KEY, session text NOT NULL,"
            " at double precision NOT NULL, read bigint, write_5m bigint, write_1h bigint)",
            "CREATE INDEX wg_cache_pace_events_session ON wg_cache_pace_events(session, at)",
        ),
    ),
)

_DOMAIN = b"wiregate/cache-pace/v1\x1f"


def session_digest(secret: bytes, cache_key: str) -> str:
    """The stored name of a session: keyed (with the key ring's digest secret, which a
    binding-key rotation leaves alone), so a digest cannot be tested against guessed ids."""
    return hmac_sha256(secret, _DOMAIN + cache_key.encode("utf-8", "surrogatepass")).hex()[:40]


_Row = tuple[float, int | None, int | None, int | None]


class StoredPaceLedger:
    """Session pace records in the database (see the module docstring). `clock` is the wall
    clock the flow stamps requests with (tests and the bench replace it)."""

    def __init__(
        self,
        db: Database,
        *,
        max_sessions: int = 100_000,  # bounds the table: ~32 small rows each at most
        idle_s: float = 24 * 3600.0,  # a session silent for a day has no pace worth knowing
        purge_every_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._purge_every = purge_every_s
        self._next_purge = 0.0
        self.clock = clock

    async def get(self, session: str) -> tuple[PaceEvent, ...]:
        """The session's events, oldest first."""
        query = "SELECT at, read, write_5m, write_1h FROM wg_cache_pace_events WHERE session = {p} ORDER BY at, seq"
        if self._db.sqlite is not None:
            rows: list[_Row] = await self._db.sqlite.read(
                lambda c: [tuple(r) for r in c.execute(query.format(p="?"), (session,))]
            )
        else:

            async def pg(conn: Conn) -> list[_Row]:
                cur = await conn.execute(query.format(p="%s"), (session,))
                return [tuple(r) for r in await cur.fetchall()]

            assert self._db.postgres is not None
            rows = await self._db.postgres.read(pg)
        return tuple(PaceEvent(float(at), r, w5, w1) for at, r, w5, w1 in rows[-MAX_EVENTS:])

    async def add(self, session: str, event: PaceEvent) -> None:
        """Append one event, keep the session's newest MAX_EVENTS, and now and then drop idle
        and least recently seen sessions beyond the cap."""
        now = self.clock()
        purge = now >= self._next_purge
        if purge:
            self._next_purge = now + self._purge_every
        values = (session, event.at, event.read, event.write_5m, event.write_1h)
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT INTO wg_cache_pace_events(session, at, read, write_5m, write_1h) VALUES (?, ?, ?, ?, ?)",
                    values,
                )
                conn.execute(
                    "DELETE FROM wg_cache_pace_events WHERE session = ? AND seq NOT IN (SELECT seq FROM"
                    " wg_cache_pace_events WHERE session = ? ORDER BY at DESC, seq DESC LIMIT ?)",
                    (session, session, MAX_EVENTS),
                )
                conn.execute(
                    "INSERT INTO wg_cache_pace_sessions(session, last_at) VALUES (?, ?) ON CONFLICT(session)"
                    " DO UPDATE SET last_at = max(last_at, excluded.last_at)",
                    (session, event.at),
                )
                if purge:
                    self._purge_lite(conn, now)

            await self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> None:
                await conn.execute(
                    "INSERT INTO wg_cache_pace_events(session, at, read, write_5m, write_1h)"
                    " VALUES (%s, %s, %s, %s, %s)",
                    values,
                )
                await conn.execute(
                    "DELETE FROM wg_cache_pace_events WHERE session = %s AND seq NOT IN (SELECT seq FROM"
                    " wg_cache_pace_events WHERE session = %s ORDER BY at DESC, seq DESC LIMIT %s)",
                    (session, session, MAX_EVENTS),
                )
                await conn.execute(
                    "INSERT INTO wg_cache_pace_sessions(session, last_at) VALUES (%s, %s) ON CONFLICT (session)"
                    " DO UPDATE SET last_at = greatest(wg_cache_pace_sessions.last_at, excluded.last_at)",
                    (session, event.at),
                )
                if purge:
                    await self._purge_pg(conn, now)

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)

    def _purge_lite(self, conn: sqlite3.Connection, now: float) -> None:
        gone = [
            (r[0],)
            for r in conn.execute(
                "SELECT session FROM wg_cache_pace_sessions WHERE last_at < ? UNION SELECT session FROM"
                " (SELECT session FROM wg_cache_pace_sessions ORDER BY last_at DESC LIMIT -1 OFFSET ?)",
                (now - self.idle_s, self.max_sessions),
            )
        ]
        conn.executemany("DELETE FROM wg_cache_pace_events WHERE session = ?", gone)
        conn.executemany("DELETE FROM wg_cache_pace_sessions WHERE session = ?", gone)

    async def _purge_pg(self, conn: Conn, now: float) -> None:
        await conn.execute(
            "WITH gone AS (DELETE FROM wg_cache_pace_sessions WHERE last_at < %s OR session IN (SELECT session"
            " FROM wg_cache_pace_sessions ORDER BY last_at DESC OFFSET %s) RETURNING session)"
            " DELETE FROM wg_cache_pace_events WHERE session IN (SELECT session FROM gone)",
            (now - self.idle_s, self.max_sessions),
        )

    async def purge(self) -> None:
        """Apply the session bounds now (otherwise every `purge_every_s`)."""
        now = self.clock()
        self._next_purge = now + self._purge_every
        if self._db.sqlite is not None:
            await self._db.sqlite.write(lambda c: self._purge_lite(c, now))
        else:

            async def pg(conn: Conn) -> None:
                await self._purge_pg(conn, now)

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)

    async def sizes(self) -> tuple[int, int]:
        """(sessions, events) held (tests, soak figures)."""
        q = "SELECT (SELECT count(*) FROM wg_cache_pace_sessions), (SELECT count(*) FROM wg_cache_pace_events)"
        if self._db.sqlite is not None:
            row = await self._db.sqlite.read(lambda c: c.execute(q).fetchone())
            return int(row[0]), int(row[1])

        async def pg(conn: Conn) -> tuple[int, int]:
            cur = await conn.execute(q)
            r = await cur.fetchone()
            assert r is not None
            return int(r[0]), int(r[1])

        assert self._db.postgres is not None
        return await self._db.postgres.read(pg)
