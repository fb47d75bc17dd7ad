"""prepare: authorisation of every scope before it is read, scope groups, dependencies, receipts."""

from __future__ import annotations

import hashlib
import json

import pytest

from gateway.context import errors
from gateway.context.service import ContextService
from gateway.context.store.base import TextResult
from tests.context.conftest import yes

pytestmark = pytest.mark.asyncio


async def _setup(svc: ContextService) -> tuple[str, str, str]:
    ref = (await svc.create_scope(title="ref", summary="s", idempotency_key="r", principal="user:a"))[0].scope_id
    other = (await svc.create_scope(title="o", summary="s", idempotency_key="o", principal="user:a"))[0].scope_id
    cur = (
        await svc.create_scope(
            title="cur", summary="s", idempotency_key="c", principal="user:a", context_references=[ref, other]
        )
    )[0].scope_id
    await svc.create_artifact(cur, "atomic-memory", {"kind": "fact", "text": "billing runs on postgres 17"})
    await svc.create_artifact(ref, "atomic-memory", {"kind": "fact", "text": "billing cluster is in eu-west-1"})
    await svc.create_artifact(ref, "topic-memory", {"title": "Billing", "summary": "billing notes", "detail": "d"})
    await svc.create_artifact(
        other,
        "experience",
        {"situation": "billing outage", "action": "failover", "outcome": "ok", "lesson": "test billing failover"},
    )
    return cur, ref, other


async def test_prepare_groups_citations_and_dependencies(service: ContextService) -> None:
    cur, ref, other = await _setup(service)
    asked: list[str] = []

    def may_read(scope_id: str) -> bool:
        asked.append(scope_id)
        return True

    out = await service.prepare(
        cur,
        "billing",
        include_receipt=True,
        principal_may_read=may_read,
        receipt_id="00000000-0000-4000-8000-000000000001",
    )
    assert set(out.context) == {"schema", "status", "content", "content_bytes"}
    content = out.context["content"]
    assert out.context["status"] == "ready" and out.context["content_bytes"] == len(content.encode())
    doc = json.loads(content.split("BEGIN_POWERCONTEXT_PREPARED_CONTEXT_V1\n")[1].split("\nEND_")[0])
    cites = [item["citation"] for item in doc["items"]]
    assert "artifact_ref" in cites[0]  # current scope
    assert all("artifact" in c and c["artifact"]["scope_id"] in (ref, other) for c in cites[1:])
    # round-robin memory → topic → experience; within a family the scope groups take turns, the
    # current scope's first; topic memory is recalled from the current scope only (1.4.1), so the
    # referenced scope's topic is not
    assert [d.scope_id for d in out.dependencies] == [cur, other, ref]
    assert [d.artifact.family for d in out.dependencies] == ["atomic-memory", "experience", "atomic-memory"]
    assert asked[:3] == [cur, ref, other]  # every scope authorised before its content was read
    r = out.receipt
    assert r is not None and out.receipt_diagnostic is None
    assert r["receipt_id"] == "00000000-0000-4000-8000-000000000001"
    assert r["content_digest"] == "sha256:" + hashlib.sha256(content.encode()).hexdigest()
    assert r["query_digest"] == "sha256:" + hashlib.sha256(b"billing").hexdigest()
    assert [s["artifact_address"] for s in r["selected"]] == [d.to_wire() for d in out.dependencies]
    assert r["used_bytes"] == out.context["content_bytes"] and r["requested_max_bytes"] == 8000
    # the same store state and request give the same bytes
    again = await service.prepare(cur, "billing", principal_may_read=yes)
    assert again.context == out.context and again.receipt is None


async def test_any_denied_scope_fails_the_whole_call(service: ContextService) -> None:
    cur, ref, other = await _setup(service)
    with pytest.raises(errors.ScopeAccessDenied):
        await service.prepare(cur, "billing", principal_may_read=lambda s: s != other)
    with pytest.raises(errors.ScopeAccessDenied):
        await service.prepare(cur, "billing", principal_may_read=lambda s: s != cur)

    calls = {"n": 0}

    async def revoked_midway(scope_id: str) -> bool:  # allowed at first, revoked before assembly
        calls["n"] += 1
        return calls["n"] <= 3

    with pytest.raises(errors.ScopeAccessDenied):
        await service.prepare(cur, "billing", principal_may_read=revoked_midway)


async def test_prepare_errors_and_empty(service: ContextService) -> None:
    cur, _, _ = await _setup(service)
    with pytest.raises(errors.ScopeNotFound):
        await service.prepare("scp_doesnotexist", "x", principal_may_read=yes)
    for q in ("", "   ", "x" * 8193):
        with pytest.raises(errors.InvalidRequest):
            await service.prepare(cur, q, principal_may_read=yes)
    for mb in (511, 32769, True):
        with pytest.raises(errors.InvalidRequest):
            await service.prepare(cur, "billing", mb, principal_may_read=yes)  # type: ignore[arg-type]
    out = await service.prepare(cur, "nothing matches zebra", include_receipt=True, principal_may_read=yes)
    assert out.context == {
        "schema": "powercontext.prepared-context.v1",
        "status": "empty",
        "content": None,
        "content_bytes": 0,
    }
    assert out.dependencies == () and out.receipt is not None and out.receipt["content_digest"] is None
    assert {(o["family"], o["reason"]) for o in out.receipt["omitted"]} == {
        ("atomic-memory", "not_retrieved"),
        ("topic-memory", "not_retrieved"),
        ("experience", "not_retrieved"),
    }
    # an 8192-character CJK query (24576 bytes) is accepted: no byte cap on queries
    assert (await service.prepare(cur, "数" * 8192, principal_may_read=yes)).context["status"] == "empty"


async def test_forgotten_and_merged_are_not_prepared(service: ContextService) -> None:
    from gateway.context.model import AtomicMemoryInput

    sid = (await service.create_scope(title="t", summary="s", idempotency_key="f", principal=None))[0].scope_id
    a = await service.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "staging region eu-west-1"})
    out = await service.prepare(sid, "staging region", principal_may_read=yes)
    assert out.dependencies[0].artifact == a.ref
    await service.change_lifecycle(sid, AtomicMemoryInput(a.ref, 0), "forgotten")
    assert (await service.prepare(sid, "staging region", principal_may_read=yes)).context["status"] == "empty"
    assert await service.dependencies_eligible(out.dependencies) == "dependency_forgotten"


async def test_prepare_reads_every_family_of_every_scope_in_one_trip(service: ContextService) -> None:
    """Without inference every prepare search is FTS, and one round reads all of them through
    `search_text_many` (one read transaction) instead of a trip per scope and family: the
    prepared context, dependencies and receipt searches equal those of the searches made one
    at a time (the store's own `search_text`), and the receipt's family stages still appear."""
    cur, ref, other = await _setup(service)
    store = service._store
    batches: list[int] = []
    real_many = store.search_text_many

    async def counted(queries):  # type: ignore[no-untyped-def]
        batches.append(len(queries))
        return await real_many(queries)

    async def one_at_a_time(queries):  # type: ignore[no-untyped-def]
        out = []
        for q in queries:
            rows = await store.search_text(q.scope_id, q.family, q.terms, q.limit, q.kind, q.min_match, q.enough)
            out.append(TextResult(rows, 0.0))
        return out

    async def no_single_search(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a prepare without inference searched one family at a time")

    results = []
    for many in (counted, one_at_a_time):
        for query in ("billing", "billing postgres failover cluster", "nothing matches this"):
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(store, "search_text_many", many)
                if many is counted:
                    mp.setattr(store, "search_text", no_single_search)
                out = await service.prepare(
                    cur,
                    query,
                    include_receipt=True,
                    principal_may_read=yes,
                    receipt_id="00000000-0000-4000-8000-000000000002",
                )
            assert out.receipt is not None
            searches = out.receipt["retrieval"]["searches"]
            stages = {s["stage"] for s in out.receipt["stages"]}
            assert {"memory.search", "topic-memory.search", "experience.search"} <= stages
            results.append((out.context, out.dependencies, searches))
    # 3 scopes x (atomic memory, experience) + topic memory of the current scope, per round
    assert batches and all(n == 7 for n in batches)
    assert results[:3] == results[3:]
    assert results[0][1]  # the comparison covers real hits


async def test_a_busy_current_scope_shares_the_pools_with_its_references(service: ContextService) -> None:
    """1.4.1: each scope is searched for a whole pool, then the scope groups share each family's
    pool in turns (16 memories: 10 here and the reference's 6, not 16 here and none there), and
    the builder interleaves them; topic memory comes from the current scope only, with the
    snippet of the detail it was found through."""
    ref = (await service.create_scope(title="ref", summary="s", idempotency_key="r", principal=None))[0].scope_id
    cur = (
        await service.create_scope(
            title="c", summary="s", idempotency_key="c", principal=None, context_references=[ref]
        )
    )[0].scope_id
    for i in range(20):
        await service.create_artifact(cur, "atomic-memory", {"kind": "fact", "text": f"billing current {i}"})
    for i in range(6):
        await service.create_artifact(ref, "atomic-memory", {"kind": "fact", "text": f"billing reference {i}"})
    await service.create_artifact(ref, "topic-memory", {"title": "Billing", "summary": "ref", "detail": "billing"})
    detail = "Nothing here. " * 40 + "The billing run closes at midnight. " + "Nothing here. " * 40
    await service.create_artifact(cur, "topic-memory", {"title": "Runs", "summary": "nightly", "detail": detail})
    out = await service.prepare(cur, "billing", include_receipt=True, principal_may_read=yes)
    deps = out.dependencies
    memories = [d.scope_id for d in deps if d.artifact.family == "atomic-memory"]
    assert memories == [cur, ref, cur, ref, cur, ref, cur]  # 8 entries: the topic took one
    assert [d.scope_id for d in deps if d.artifact.family == "topic-memory"] == [cur]
    assert out.receipt is not None and out.receipt["retrieval"]["rounds"][0]["retained"] == 16 + 1
    content = out.context["content"]  # the window starts inside the detail, cut with an ellipsis
    assert '\\"snippet\\":\\"…' in content and "The billing run closes at midnight." in content
