"""`[store] sqlite_sync`: when an acknowledged SQLite write is on disk. "full" (the default) syncs
the log at every commit; "normal" at checkpoints (a killed process still loses nothing it
acknowledged: test_crash.py runs both). The setting reaches the writer connection itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.config.model import StoreSettings
from gateway.context.store.database import open_database
from gateway.state import DATABASE
from tests.conftest import GatewayFactory
from tests.harness import raw_client

FULL, NORMAL = 2, 1  # PRAGMA synchronous reads back as a number


def _writer_sync(conn: object) -> int:
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])  # type: ignore[attr-defined]


@pytest.mark.asyncio
@pytest.mark.parametrize(("setting", "expected"), [(None, FULL), ("full", FULL), ("normal", NORMAL)])
async def test_the_writer_syncs_as_configured(tmp_path: Path, setting: str | None, expected: int) -> None:
    options = {} if setting is None else {"sqlite_sync": setting}
    db = await open_database("sqlite", path=tmp_path / "s.db", **options)
    try:
        assert db.sqlite is not None
        assert await db.sqlite.write(_writer_sync) == expected
    finally:
        await db.close()


def test_the_setting_is_validated() -> None:
    assert StoreSettings().sqlite_sync == "full"
    assert StoreSettings(sqlite_sync="normal").sqlite_sync == "normal"
    with pytest.raises(ValidationError):
        StoreSettings(sqlite_sync="off")  # type: ignore[arg-type]  # never a setting that can corrupt the file
    with pytest.raises(ValidationError, match="SQLite store only"):
        StoreSettings(backend="postgres", dsn="env:WIREGATE_STORE_DSN", sqlite_sync="normal")


def test_a_gateway_configured_for_normal_writes_with_it(gateways: GatewayFactory) -> None:
    with gateways("sqlite-sync", config_extra='[store]\nsqlite_sync = "normal"\n') as (env, gateway):
        assert gateway.running is not None
        database = gateway.running.app[DATABASE]
        assert database.sqlite is not None
        assert gateway.call(database.sqlite.write(_writer_sync)) == NORMAL
        client = raw_client(gateway, env)
        client.headers["authorization"] = f"Bearer {env.gateway_key}"
        scope = client.post("/v1/scopes", json={"title": "t", "summary": "s", "idempotency_key": "sync-1"})
        assert scope.status_code == 201
        body = {"family": "atomic-memory", "content": {"kind": "fact", "text": "the deploy runs on friday"}}
        made = client.post(f"/v1/scopes/{scope.json()['scope_id']}/artifacts", json=body)
        assert made.status_code == 201
