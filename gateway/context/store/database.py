"""The gateway's one database: SQLite (embedded default) or PostgreSQL (replicas).

Every table owner — the context store, the ledgers, attribution, cache pace — exports its
`Migration` tuple; the app opens one database with all of them and hands each owner the
handle. Owners speak to the handle they get: `SqliteDatabase.read/write(fn(conn))` runs a
plain function on the database's own threads; `PostgresDatabase.read/write(async fn(conn))`
runs on a pooled connection.

Owns: choosing the backend from settings, the migration set per backend, opening and closing.
Must not: hold table logic (each owner has its own), or log the DSN — nor let it out in an
exception: a driver's message can quote it (`invalid connection option "..."`), so a store
that cannot be opened is `StoreUnavailable`, which names the backend and the error's class.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gateway.context.store import postgres, sqlite
from gateway.context.store.base import ContextStore
from gateway.context.store.migrations import Migration


class StoreUnavailable(Exception):
    """The database could not be opened (or migrated). Content-free: the driver's own error,
    whose text can carry the DSN, is neither the message nor chained."""

    def __init__(self, backend: str, error: BaseException) -> None:
        super().__init__(f"the {backend} store could not be opened ({type(error).__name__})")
        self.error_class = type(error).__name__


@dataclass(frozen=True)
class Database:
    backend: str  # "sqlite" | "postgres"
    sqlite: sqlite.SqliteDatabase | None
    postgres: postgres.PostgresDatabase | None
    context: ContextStore

    async def close(self) -> None:
        if self.sqlite is not None:
            await self.sqlite.close()
        if self.postgres is not None:
            await self.postgres.close()

    async def ping(self) -> bool:
        """Readiness: can a trivial read run now?"""
        try:
            if self.sqlite is not None:
                return bool(await self.sqlite.read(lambda conn: conn.execute("SELECT 1").fetchone()))

            async def one(conn: postgres.Conn) -> bool:
                cur = await conn.execute("SELECT 1")
                return (await cur.fetchone()) is not None

            assert self.postgres is not None
            return await self.postgres.read(one)
        except Exception:  # any failure means not ready; the reason is logged by the caller's class name
            return False


def _owner_only(path: Path) -> None:
    """The store holds memory text: the file and its WAL side files are the owner's alone."""
    for candidate in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if candidate.exists():
            candidate.chmod(0o600)


async def open_database(
    backend: str,
    *,
    path: Path | None = None,
    dsn: str | None = None,
    schema: str | None = None,
    pool_max: int = 8,
    migrations: Sequence[Migration] = (),
    sqlite_sync: Literal["full", "normal"] = "full",
) -> Database:
    """Open the database and apply every migration (the context store's first, then `migrations`).
    `sqlite_sync` is SQLite's `synchronous` for the writer: "full" or "normal"."""
    if backend == "sqlite":
        if path is None:
            raise ValueError("the SQLite store needs a path")
        lite = sqlite.SqliteDatabase(
            str(path), (*sqlite.CONTEXT_MIGRATIONS, *migrations), synchronous=sqlite_sync.upper()
        )
        try:
            await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True, mode=0o700)
            await lite.open()
            await asyncio.to_thread(_owner_only, path)
        except Exception as exc:
            await _close_quietly(lite)
            raise StoreUnavailable(backend, exc) from None
        return Database("sqlite", lite, None, sqlite.SqliteContextStore(lite))
    if backend == "postgres":
        if not dsn:
            raise ValueError("the PostgreSQL store needs a DSN")
        pg = postgres.PostgresDatabase(
            dsn, (*postgres.CONTEXT_MIGRATIONS, *migrations), schema=schema, max_size=pool_max
        )
        try:
            await pg.open()
        except Exception as exc:
            await _close_quietly(pg)
            raise StoreUnavailable(backend, exc) from None
        return Database("postgres", None, pg, postgres.PostgresContextStore(pg))
    raise ValueError(f"unknown store backend {backend!r}")


async def _close_quietly(db: sqlite.SqliteDatabase | postgres.PostgresDatabase) -> None:
    """Whatever a failed open started (threads, a pool) is stopped; a second failure there
    changes nothing about the first."""
    with contextlib.suppress(Exception):  # the open already failed: that is the error reported
        await db.close()
