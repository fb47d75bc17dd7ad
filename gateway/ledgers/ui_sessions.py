"""The /ui/ pages' sessions in the gateway's one database, so that every process serving the
same configuration knows them: the workers of `wiregate serve --workers N` (the kernel
spreads a browser's connections over them) and replicas that share a database.

Owns: `StoredUiSessions` (create, find, end, end those of lapsed keys) and its migration.
A session is found by the SHA-256 of its cookie's token (the token itself is never stored)
and holds the SHA-256 of the gateway key it was exchanged for (never the key), its CSRF
token and its expiry. Bounds: at most `per_key` sessions for one gateway key (its own
oldest end first, so one key signing in again and again cannot sign anyone else out) and
`max_sessions` in all (the oldest end first); expired ones are deleted at every sign-in.
Must not: store a token or a key; log what it stores.
"""

from __future__ import annotations

import hashlib
import secrets
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from gateway.context.store.database import Database
from gateway.context.store.migrations import Migration
from gateway.context.store.postgres import Conn

UI_SESSION_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "ui_sessions",
        1,
        sqlite=(
            "CREATE TABLE wg_ui_sessions(seq INTEGER PRIMARY KEY AUTOINCREMENT, token_digest TEXT NOT NULL UNIQUE,"
            " key_digest TEXT NOT NULL, csrf TEXT NOT NULL, expires REAL NOT NULL)",
            "CREATE INDEX wg_ui_sessions_key ON wg_ui_sessions(key_digest, seq)",
        ),
        postgres=(
            "CREATE TABLE wg_ui_sessions(seq bigserial PRIMARY KEY, token_digest text NOT NULL UNIQUE,"
            " key_digest text NOT NULL, csrf text NOT NULL, expires double precision NOT NULL)",
            "CREATE INDEX wg_ui_sessions_key ON wg_ui_sessions(key_digest, seq)",
        ),
    ),
)


@dataclass(frozen=True, slots=True)
class UiSession:
    key_digest: bytes  # sha256 of the gateway key it was exchanged for (never the key)
    csrf: str
    expires: float


def token_digest(token: str) -> str:
    """What a session is found by. A presented cookie is any header text (undecodable bytes
    arrive as lone surrogates): it digests, and finds nothing, rather than fail."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


_SIGN_IN_LOCK = 0x77675F7569  # "wg_ui": the advisory lock sign-ins take on PostgreSQL
_END_SESSION = "DELETE FROM wg_ui_sessions WHERE token_digest = {p}"
_END_KEY_SESSIONS = "DELETE FROM wg_ui_sessions WHERE key_digest = {p}"


class StoredUiSessions:
    def __init__(self, db: Database, *, ttl_s: float = 900.0, max_sessions: int = 1024, per_key: int = 8) -> None:
        self._db = db
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.per_key = per_key

    async def create(self, key_digest: bytes, now: float) -> tuple[str, UiSession]:
        token = secrets.token_urlsafe(32)
        session = UiSession(key_digest, secrets.token_urlsafe(24), now + self.ttl_s)
        row = (token_digest(token), key_digest.hex(), session.csrf, session.expires)
        keep_same, keep_all = max(0, self.per_key - 1), max(0, self.max_sessions - 1)
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> None:
                conn.execute("DELETE FROM wg_ui_sessions WHERE expires <= ?", (now,))
                conn.execute(
                    "DELETE FROM wg_ui_sessions WHERE seq IN (SELECT seq FROM wg_ui_sessions WHERE key_digest = ?"
                    " ORDER BY seq DESC LIMIT -1 OFFSET ?)",
                    (row[1], keep_same),
                )
                conn.execute(
                    "DELETE FROM wg_ui_sessions WHERE seq IN (SELECT seq FROM wg_ui_sessions"
                    " ORDER BY seq DESC LIMIT -1 OFFSET ?)",
                    (keep_all,),
                )
                conn.execute(
                    "INSERT INTO wg_ui_sessions(token_digest, key_digest, csrf, expires) VALUES (?, ?, ?, ?)", row
                )

            await self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> None:
                # One sign-in at a time (as SQLite's writer runs them): concurrent ones would
                # each see the same old count and together exceed the bounds.
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SIGN_IN_LOCK,))
                await conn.execute("DELETE FROM wg_ui_sessions WHERE expires <= %s", (now,))
                await conn.execute(
                    "DELETE FROM wg_ui_sessions WHERE seq IN (SELECT seq FROM wg_ui_sessions WHERE key_digest = %s"
                    " ORDER BY seq DESC OFFSET %s)",
                    (row[1], keep_same),
                )
                await conn.execute(
                    "DELETE FROM wg_ui_sessions WHERE seq IN (SELECT seq FROM wg_ui_sessions"
                    " ORDER BY seq DESC OFFSET %s)",
                    (keep_all,),
                )
                await conn.execute(
                    "INSERT INTO wg_ui_sessions(token_digest, key_digest, csrf, expires) VALUES (%s, %s, %s, %s)", row
                )

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)
        return token, session

    async def get(self, token: str, now: float) -> UiSession | None:
        query = "SELECT key_digest, csrf, expires FROM wg_ui_sessions WHERE token_digest = {p} AND expires > {p}"
        args = (token_digest(token), now)
        if self._db.sqlite is not None:
            found = await self._db.sqlite.read(lambda c: c.execute(query.format(p="?"), args).fetchone())
        else:

            async def pg(conn: Conn) -> tuple[str, str, float] | None:
                cur = await conn.execute(query.format(p="%s"), args)
                return await cur.fetchone()

            assert self._db.postgres is not None
            found = await self._db.postgres.read(pg)
        if found is None:
            return None
        return UiSession(bytes.fromhex(found[0]), str(found[1]), float(found[2]))

    async def drop(self, token: str) -> None:
        await self._delete(_END_SESSION, [token_digest(token)])

    async def keep_only(self, allowed: Callable[[bytes], bool]) -> None:
        """End every session whose key `allowed` refuses (after a reload, and at start: a key
        removed, or no longer allowed to observe, must not come back to life if it is
        restored later)."""
        query = "SELECT DISTINCT key_digest FROM wg_ui_sessions"
        if self._db.sqlite is not None:
            keys = await self._db.sqlite.read(lambda c: [str(r[0]) for r in c.execute(query)])
        else:

            async def pg(conn: Conn) -> list[str]:
                cur = await conn.execute(query)
                return [str(r[0]) for r in await cur.fetchall()]

            assert self._db.postgres is not None
            keys = await self._db.postgres.read(pg)
        await self._delete(_END_KEY_SESSIONS, [k for k in keys if not allowed(bytes.fromhex(k))])

    async def _delete(self, query: str, values: list[str]) -> None:
        if not values:
            return
        if self._db.sqlite is not None:

            def lite(conn: sqlite3.Connection) -> None:
                conn.executemany(query.format(p="?"), [(v,) for v in values])

            await self._db.sqlite.write(lite)
        else:

            async def pg(conn: Conn) -> None:
                for value in values:
                    await conn.execute(query.format(p="%s"), (value,))

            assert self._db.postgres is not None
            await self._db.postgres.write(pg)
