"""Subprocess for the crash test: write atomic memories in a loop, print each acknowledged id, never stop."""

from __future__ import annotations

import asyncio
import sys

from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from gateway.context.store.postgres import PostgresContextStore, PostgresDatabase
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase


def open_store(where: str) -> ContextStore:
    """`sqlite:<path>`, `sqlite-normal:<path>` (synchronous=NORMAL) or `postgres:<schema>` (the local test server)."""
    kind, _, arg = where.partition(":")
    if kind == "postgres":
        from tests.context.conftest import PG_DSN

        return PostgresContextStore(PostgresDatabase(PG_DSN, schema=arg))
    return SqliteContextStore(SqliteDatabase(arg, synchronous="NORMAL" if kind == "sqlite-normal" else "FULL"))


async def main(where: str) -> None:
    store = open_store(where)
    await store.open()
    svc = ContextService(store, check_write=lambda texts: ())
    await svc.start()
    i = 0
    while True:
        rev = await svc.create_artifact("default", "atomic-memory", {"kind": "fact", "text": f"memory number {i}"})
        sys.stdout.write(f"{rev.artifact_id} {i}\n")
        sys.stdout.flush()
        if i % 3 == 0:
            r2 = await svc.replace_artifact(
                "default",
                "atomic-memory",
                rev.artifact_id,
                {"kind": "fact", "text": f"memory number {i} revised"},
                if_match=rev.etag,
            )
            sys.stdout.write(f"{r2.artifact_id} {i} r2\n")
            sys.stdout.flush()
        i += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
