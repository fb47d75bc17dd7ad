"""Durability: a SIGKILLed writer loses no acknowledged write and leaves no half revision
(SQLite with either sync setting, and PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.context.store.postgres import PostgresDatabase
from tests.context.conftest import PG_DSN, require_pg
from tests.context.crash_writer import open_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["sqlite", "sqlite-normal", "postgres"])
def test_sigkill_keeps_every_acknowledged_write(tmp_path: Path, backend: str) -> None:
    if backend == "postgres":
        require_pg()
        where = "postgres:wgcrash_" + secrets.token_hex(5)
    else:
        where = f"{backend}:" + str(tmp_path / "crash.db")  # sqlite-normal: [store] sqlite_sync = "normal"
    try:
        _crash_and_verify(where)
    finally:
        if backend == "postgres":
            asyncio.run(PostgresDatabase(PG_DSN, schema=where.partition(":")[2]).drop_schema())


def _crash_and_verify(where: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.context.crash_writer", where],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acknowledged: list[tuple[str, int, bool]] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while len(acknowledged) < 150 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        parts = line.split()
        acknowledged.append((parts[0], int(parts[1]), len(parts) == 3))
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    for line in rest.splitlines():  # anything printed before the kill was acknowledged too
        parts = line.split()
        if len(parts) >= 2:
            acknowledged.append((parts[0], int(parts[1]), len(parts) == 3))
    assert len(acknowledged) >= 20

    asyncio.run(_verify(where, acknowledged))


async def _verify(where: str, acknowledged: list[tuple[str, int, bool]]) -> None:
    store = open_store(where)
    await store.open()
    try:
        for artifact_id, i, revised in acknowledged:
            head = await store.get_head("default", "atomic-memory", artifact_id)
            assert head is not None
            first = await store.get_revision("default", "atomic-memory", artifact_id, 1)
            assert first is not None and first.content["text"] == f"memory number {i}"
            if revised:
                assert head.revision >= 2
                second = await store.get_revision("default", "atomic-memory", artifact_id, 2)
                assert second is not None and second.content["text"] == f"memory number {i} revised"
        # no half revision anywhere: every head has all its revisions, and a state row
        heads = await store.list_heads("default", "atomic-memory", None, 10_000)
        for head in heads:
            revs = await store.list_revisions("default", "atomic-memory", head.artifact_id, None, 100)
            assert [r.revision for r in revs] == list(range(head.revision, 0, -1))
            assert head.artifact_id in await store.get_states("default", [head.artifact_id])
    finally:
        await store.close()
