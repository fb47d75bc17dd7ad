"""Scope records are remembered once read (scopes are never updated or deleted), bounded; a scope
that was absent is read again, so one created meanwhile (here: by another service on the same store,
as another replica would) is found at once."""

from __future__ import annotations

import os
from typing import Any

import pytest

from gateway.context import service as service_module
from gateway.context.errors import ScopeNotFound
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.context.conftest import allow_all, make_service, yes


@pytest.mark.asyncio
async def test_scopes_are_read_once_absent_ones_every_time_and_the_memo_is_bounded(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    get_scope = store.get_scope

    async def counted(scope_id: str) -> Any:
        reads.append(scope_id)
        return await get_scope(scope_id)

    monkeypatch.setattr(store, "get_scope", counted)
    monkeypatch.setattr(service_module, "KNOWN_SCOPES", 2)
    mine = make_service(store)
    await mine.start()
    other = ContextService(store, check_write=allow_all, random_bytes=os.urandom)  # another replica

    sid = (await mine.create_scope(title="a", summary="s", idempotency_key="a", principal="alice"))[0].scope_id
    reads.clear()
    assert (await mine.get_scope(sid)).scope_id == sid
    assert await mine.scope_creator(sid) == "alice"
    assert (await mine.find_scope(sid)) is not None
    await mine.prepare(sid, "anything at all", principal_may_read=yes)
    assert reads == [sid]  # read once, then remembered

    created = other.new_scope_id()
    reads.clear()
    assert await mine.find_scope(created) is None
    with pytest.raises(ScopeNotFound):
        await mine.get_scope(created)
    assert reads == [created, created]  # absent: read every time
    made = (await other.create_scope(title="b", summary="s", idempotency_key="b", principal="bob"))[0].scope_id
    reads.clear()
    assert await mine.scope_creator(made) == "bob"  # created by the other service: found at once
    assert reads == [made]

    third = (await mine.create_scope(title="c", summary="s", idempotency_key="c", principal=None))[0].scope_id
    reads.clear()
    assert await mine.find_scope(third) is not None  # the memo holds two: `sid`, the least recent, goes
    assert await mine.find_scope(made) is not None
    assert await mine.find_scope(sid) is not None
    assert reads == [third, sid]
