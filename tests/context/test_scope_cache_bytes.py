"""The scope memo is bounded in bytes, not only in count: a scope record with huge reference
lists is not kept (it is read again each time), and several large ones never hold more than the
memo's byte budget between them. A record kept or not, every answer is the same."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.context import service as service_module
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.context.conftest import make_service


def _references(n: int, width: int) -> list[dict[str, Any]]:
    return [{"kind": "url", "value": f"https://example.com/{i}/" + "x" * width} for i in range(n)]


async def _service(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> tuple[ContextService, list[str]]:
    reads: list[str] = []
    get_scope = store.get_scope

    async def counted(scope_id: str) -> Any:
        reads.append(scope_id)
        return await get_scope(scope_id)

    monkeypatch.setattr(store, "get_scope", counted)
    service = make_service(store)
    await service.start()
    return service, reads


@pytest.mark.asyncio
async def test_a_record_above_the_entry_cap_is_not_kept(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    service, reads = await _service(store, monkeypatch)
    big = _references(3000, 1000)  # about 3 MB of strings: above the 1 MiB a record may hold
    sid = (
        await service.create_scope(
            title="big", summary="s", idempotency_key="big", principal="alice", external_references=big
        )
    )[0].scope_id
    small = (await service.create_scope(title="small", summary="s", idempotency_key="small", principal="bob"))[
        0
    ].scope_id
    reads.clear()
    for _ in range(3):
        record = await service.find_scope(sid)
        assert record is not None
        assert record.created_by == "alice"
        assert [dict(r) for r in record.external_references] == big
        assert await service.scope_creator(small) == "bob"
    assert reads == [sid, small, sid, sid]  # the big one is read every time, the small one once
    assert sid not in service._scopes
    assert small in service._scopes


@pytest.mark.asyncio
async def test_the_memo_stays_within_its_byte_budget(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "KNOWN_SCOPE_BYTES", 1024 * 1024)
    service, reads = await _service(store, monkeypatch)
    ids = []
    for i in range(6):  # about 300 kB each: each may be kept, not all of them together
        refs = _references(300, 900)
        made = await service.create_scope(
            title=f"t{i}", summary="s", idempotency_key=f"k{i}", principal=None, external_references=refs
        )
        ids.append(made[0].scope_id)
    reads.clear()
    for sid in ids:
        assert await service.find_scope(sid) is not None
    kept = list(service._scopes)
    held = sum(service_module._scope_record_bytes(record, 1 << 62) for record, _ in service._scopes.values())
    assert 1 <= len(kept) < len(ids)
    assert held <= 1024 * 1024
    assert kept == [sid for sid in ids if sid in kept] and kept[-1] == ids[-1]  # the least recently used went
    reads.clear()
    for sid in ids:
        assert (await service.find_scope(sid)) is not None
    assert reads[0] == ids[0]  # forgotten: read again
