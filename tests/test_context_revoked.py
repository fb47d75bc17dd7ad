"""COMPAT §4 (prepare): "If Scope read is revoked before rerank or assembly, the request
returns 403." A prepare held inside its search while a reload takes the caller's context
actions away answers 403 when it resumes, as a new prepare does; one whose read was not
revoked still answers 200."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.context.store.sqlite import SqliteContextStore
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client

KEYS: dict[str, str] = {}
ACTIONS = '["context.write", "context.read", "context.prepare"]'


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    def principals(env: Env) -> None:
        KEYS["alice"] = env.add_principal(
            "alice", ["context.write", "context.read", "context.prepare"], [], ["default"]
        )
        KEYS["bob"] = env.add_principal("bob", ["context.write", "context.read", "context.prepare"], [], ["default"])

    with gateways("context-revoked", prepare=principals) as started:
        yield started


def _held_prepare(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch, who: str, revoke: str | None
) -> tuple[int, int]:
    """(status of a prepare held in its search while `revoke`'s actions are taken away,
    status of a new prepare after), both by `who`."""
    env, gateway = gw
    http = raw_client(gateway, env)
    auth = {"authorization": f"Bearer {KEYS[who]}"}
    made = http.post(
        "/v1/scopes", json={"title": "t", "summary": "s", "idempotency_key": uuid.uuid4().hex}, headers=auth
    )
    sid = made.json()["scope_id"]
    memory = {"family": "atomic-memory", "content": {"kind": "fact", "text": "payroll export runs nightly"}}
    assert http.post(f"/v1/scopes/{sid}/artifacts", json=memory, headers=auth).status_code == 201
    entered, release = threading.Event(), threading.Event()
    original = SqliteContextStore.search_text_many

    async def held(self: Any, queries: Any) -> Any:
        entered.set()
        await asyncio.to_thread(release.wait, 30)
        return await original(self, queries)

    monkeypatch.setattr(SqliteContextStore, "search_text_many", held)
    out: dict[str, Any] = {}
    body = {"scope_id": sid, "query": "payroll export"}

    def run() -> None:
        out["r"] = raw_client(gateway, env).post("/v1/context/prepare", json=body, headers=auth, timeout=60)

    thread = threading.Thread(target=run)
    thread.start()
    path = env.dir / "principals.toml"
    text = path.read_text()
    try:
        assert entered.wait(30)
        if revoke is not None:
            line = f'id = "{revoke}"'
            at = text.index(line)
            end = text.index(ACTIONS, at) + len(ACTIONS)
            path.write_text(text[:at] + text[at:end].replace(ACTIONS, '["observe"]') + text[end:])
            assert gateway.reload()
    finally:
        release.set()
        thread.join(60)
        monkeypatch.setattr(SqliteContextStore, "search_text_many", original)
    after = http.post("/v1/context/prepare", json=body, headers=auth).status_code
    if revoke is not None:
        path.write_text(text)
        assert gateway.reload()
    return out["r"].status_code, after


def test_a_read_revoked_during_prepare_is_403(gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _held_prepare(gw, monkeypatch, "alice", revoke="alice") == (403, 403)


def test_a_reload_that_keeps_the_read_keeps_the_prepare(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _held_prepare(gw, monkeypatch, "alice", revoke="bob") == (200, 200)
    assert _held_prepare(gw, monkeypatch, "alice", revoke=None) == (200, 200)
