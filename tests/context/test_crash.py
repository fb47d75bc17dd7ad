"""Durability: a SIGKILLed writer loses no acknowledged write and leaves no half revision (SQLite)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

ROOT = Path(__file__).resolve().parents[2]


def test_sigkill_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    path = str(tmp_path / "crash.db")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.context.crash_writer", path],
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

    asyncio.run(_verify(path, acknowledged))


async def _verify(path: str, acknowledged: list[tuple[str, int, bool]]) -> None:
    store = SqliteContextStore(SqliteDatabase(path))
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
            assert await store.get_state("default", head.artifact_id) is not None
    finally:
        await store.close()
