"""Every write's text goes through the write check; a refusal stores nothing (real inspection engine)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.carriers.base import TextUnit
from gateway.context import errors
from gateway.context.model import AtomicMemoryInput
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Subject
from gateway.inspection.formats import build_format_set
from tests.context.conftest import make_service, yes

pytestmark = pytest.mark.asyncio
SECRET = "wg-secret-value-7f3a9c2e1d"


def engine_check() -> tuple[list[list[str]], object]:
    engine = build_engine(
        secret_values=[SECRET],
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
        policy_version="t",
    )
    seen: list[list[str]] = []

    def check(texts: list[str]) -> tuple[str, ...]:
        seen.append(list(texts))
        units = [TextUnit(("content", i), t, "string") for i, t in enumerate(texts)]
        verdict = engine.inspect(Subject(raw=None, units=units))
        return () if verdict.allowed else tuple(verdict.reason_codes)

    return seen, check


async def test_refused_writes_store_nothing(store: ContextStore) -> None:
    seen, check = await asyncio.to_thread(engine_check)  # compiling reads files: off the loop
    svc: ContextService = make_service(store, check_write=check)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    ok = await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "The deploy key rotates monthly."})
    assert seen[-1] == ["powercontext.atomic-memory.v1", "fact", "The deploy key rotates monthly."]

    with pytest.raises(errors.MemoryWriteRejected) as exc:
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"the key is {SECRET}"})
    assert exc.value.reason_codes and all(SECRET not in code for code in exc.value.reason_codes)
    assert exc.value.to_wire()["error"]["code"] == "memory_write_rejected"
    assert SECRET not in repr(exc.value.to_wire())
    for family, content in (
        ("topic-memory", {"title": "t", "summary": "s", "detail": f"see {SECRET} here"}),
        ("experience", {"situation": SECRET, "action": "a", "outcome": "o", "lesson": "l"}),
        ("profile", {"content": f"token {SECRET}"}),
    ):
        with pytest.raises(errors.MemoryWriteRejected):
            await svc.create_artifact(sid, family, content)
        assert (await svc.list_artifacts(sid, family)).items == ()
    with pytest.raises(errors.MemoryWriteRejected):
        await svc.replace_artifact(
            sid, "atomic-memory", ok.artifact_id, {"kind": "fact", "text": SECRET}, if_match=ok.etag
        )
    ok2 = await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "Backups run nightly."})
    with pytest.raises(errors.MemoryWriteRejected):
        await svc.merge_atomic_memories(
            sid, [AtomicMemoryInput(ok.ref, 0), AtomicMemoryInput(ok2.ref, 0)], {"kind": "f", "text": SECRET}
        )
    with pytest.raises(errors.MemoryWriteRejected):
        await svc.create_scope(title=f"scope {SECRET}", summary="s", idempotency_key="k2", principal=None)
    # nothing was stored: one head, one revision, and the secret is nowhere to be found or prepared
    heads = {h.artifact_id for h in (await svc.list_artifacts(sid, "atomic-memory")).items}
    assert heads == {ok.artifact_id, ok2.artifact_id}
    assert {r.state.value for r in (await svc.list_atomic_memories(sid)).items} == {"active"}
    assert [r.revision for r in (await svc.list_artifact_revisions(sid, "atomic-memory", ok.artifact_id)).items] == [1]
    assert (await svc.search(sid, "atomic-memory", SECRET)).hits == ()
    out = await svc.prepare(sid, "deploy key", principal_may_read=yes)
    assert SECRET not in (out.context["content"] or "")
