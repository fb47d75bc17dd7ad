"""Context-store fixtures: one store per backend (SQLite file in tmp; PostgreSQL in a fresh schema, dropped after)."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from gateway.context.store.database import Database, open_database
from gateway.context.store.migrations import Migration
from gateway.context.store.postgres import PostgresContextStore, PostgresDatabase
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
BACKENDS = ["sqlite", "postgres"]


def pg_available() -> bool:
    try:
        with psycopg.connect(PG_DSN) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


class Backend:
    """Makes stores of one backend that share one database (SQLite file or PostgreSQL schema)."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = str(tmp_path / "context.db")
        self.schema = "wgt_" + secrets.token_hex(6)
        self.stores: list[ContextStore] = []
        self._pg: list[PostgresDatabase] = []

    async def store(self, **kw: Any) -> ContextStore:
        store: ContextStore
        if self.kind == "sqlite":
            store = SqliteContextStore(SqliteDatabase(self.path, **kw))
        else:
            db = PostgresDatabase(PG_DSN, schema=self.schema, **kw)
            self._pg.append(db)
            store = PostgresContextStore(db)
        await store.open()
        self.stores.append(store)
        return store

    async def cleanup(self) -> None:
        for store in self.stores:
            await store.close()
        if self._pg:
            await self._pg[0].drop_schema()


def require_pg() -> None:
    """PostgreSQL tests skip where no server runs, except in CI (WIREGATE_REQUIRE_PG=1),
    where a missing server is a failure."""
    if not pg_available():
        if os.environ.get("WIREGATE_REQUIRE_PG") == "1":
            pytest.fail("PostgreSQL is required here but not reachable on 127.0.0.1:5432")
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")


@pytest_asyncio.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    if request.param == "postgres":
        require_pg()
    b = Backend(request.param, tmp_path)
    try:
        yield b
    finally:
        await b.cleanup()


@pytest_asyncio.fixture
async def store(backend: Backend) -> ContextStore:
    return await backend.store()


def allow_all(texts: list[str]) -> tuple[str, ...]:
    return ()


class Counter:
    """A deterministic random source and clock for services under test."""

    def __init__(self) -> None:
        self.n = 0
        self.t = 1_790_000_000.0

    def random_bytes(self, k: int) -> bytes:
        self.n += 1
        return self.n.to_bytes(k, "big")

    def clock(self) -> float:
        self.t += 0.001
        return self.t


def make_service(store: ContextStore, **kw: Any) -> ContextService:
    c = Counter()
    kw.setdefault("check_write", allow_all)
    return ContextService(store, clock=c.clock, random_bytes=c.random_bytes, **kw)


@pytest_asyncio.fixture
async def service(store: ContextStore) -> ContextService:
    svc = make_service(store)
    await svc.start()
    return svc


def yes(scope_id: str) -> bool:
    return True


MayRead = Callable[[str], bool]


def drop_schema(schema: str) -> None:
    """Remove a test's own PostgreSQL schema."""
    with psycopg.connect(PG_DSN, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@asynccontextmanager
async def replica_databases(
    backend: str, tmp_path: Path, migrations: Sequence[Migration], prefix: str
) -> AsyncIterator[tuple[Database, Database]]:
    """Two handles on one database (SQLite file or a PostgreSQL schema of the test's own), as
    two replicas hold them; closed, and the schema dropped, afterwards."""
    schema = ""
    if backend == "postgres":
        require_pg()
        schema = f"{prefix}_{secrets.token_hex(4)}"
        kw: dict[str, Any] = {"dsn": PG_DSN, "schema": schema}
    else:
        kw = {"path": tmp_path / "wiregate.db"}
    one = await open_database(backend, migrations=migrations, **kw)
    two = await open_database(backend, migrations=migrations, **kw)
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()
        if schema:
            drop_schema(schema)
