"""Concurrent writers never lose an update: replace is a compare-and-set on the exact head ETag."""

from __future__ import annotations

import asyncio

import pytest

from gateway.context import errors
from gateway.context.service import ContextService
from tests.context.conftest import Backend, allow_all

pytestmark = pytest.mark.asyncio

WRITERS = 8
EACH = 5


async def test_concurrent_replace_no_lost_update(backend: Backend) -> None:
    stores = [await backend.store(), await backend.store()]  # two connections / writer threads / pools
    services = [ContextService(s, check_write=allow_all) for s in stores]
    await services[0].start()
    sid = (await services[0].create_scope(title="t", summary="s", idempotency_key="c", principal=None))[0].scope_id
    aid = (
        await services[0].create_artifact(sid, "topic-memory", {"title": "t", "summary": "s", "detail": "start"})
    ).artifact_id
    acknowledged: dict[int, str] = {}
    conflicts = 0

    async def writer(w: int) -> None:
        nonlocal conflicts
        svc = services[w % 2]
        done = 0
        while done < EACH:
            head = await svc.get_artifact(sid, "topic-memory", aid)
            detail = f"writer {w} write {done}"
            try:
                rev = await svc.replace_artifact(
                    sid, "topic-memory", aid, {"title": "t", "summary": "s", "detail": detail}, if_match=head.etag
                )
            except errors.RevisionConflict as exc:
                assert exc.details is not None and exc.details["provided_etag"] == head.etag
                conflicts += 1
                continue
            assert rev.revision not in acknowledged
            acknowledged[rev.revision] = detail
            done += 1

    await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    revisions = (await services[1].list_artifact_revisions(sid, "topic-memory", aid, limit=100)).items
    assert [r.revision for r in revisions] == list(range(1 + WRITERS * EACH, 0, -1))
    assert sorted(acknowledged) == list(range(2, 2 + WRITERS * EACH))
    for r in revisions[:-1]:
        assert r.content["detail"] == acknowledged[r.revision]  # every acknowledged write is exactly there
        assert r.previous is not None and r.previous.revision == r.revision - 1
    assert conflicts > 0  # the writers really raced


async def test_concurrent_lifecycle_one_winner(backend: Backend) -> None:
    stores = [await backend.store(), await backend.store()]
    services = [ContextService(s, check_write=allow_all) for s in stores]
    await services[0].start()
    sid = (await services[0].create_scope(title="t", summary="s", idempotency_key="c", principal=None))[0].scope_id
    aid = (await services[0].create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "x"})).artifact_id
    st = await services[0].get_atomic_state(sid, aid)
    from gateway.context.model import AtomicMemoryInput

    async def attempt(i: int) -> str:
        try:
            await services[i % 2].change_lifecycle(
                sid, AtomicMemoryInput(st.artifact, 0), "forgotten" if i % 2 else "retired"
            )
            return "ok"
        except errors.AtomicMemoryChanged:
            return "stale"

    outcomes = await asyncio.gather(*(attempt(i) for i in range(6)))
    assert outcomes.count("ok") == 1
    final = await services[1].get_atomic_state(sid, aid)
    assert final.state_version == 1
