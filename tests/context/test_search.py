"""Search: analyzer, admission, RRF, fts ranking, vector/hybrid with a fake embedder, auto fallback."""

from __future__ import annotations

import math

import pytest

from gateway.context import errors, search
from gateway.context.errors import InferenceTimeout, InferenceUnavailable
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.context.conftest import make_service, yes

VOCAB = ["postgres", "billing", "staging", "deploy", "friday", "pytest", "region", "token"]


def fake_vector(text: str) -> list[float]:
    """A deterministic bag-of-words embedding over VOCAB (a stand-in for an external provider)."""
    words = set(search.tokens(text))
    return [1.0 if w in words else 0.0 for w in VOCAB] + [0.05]


class FakeEmbedder:
    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.calls = 0

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return [fake_vector(t) for t in texts]


def test_analyzer_and_floor() -> None:
    assert search.tokens("Which database does billing-use?") == ["which", "database", "does", "billing", "use"]
    assert search.tokens("STRAẞE Straße") == ["strasse", "strasse"]  # casefold, not lower
    assert search.tokens("数据库 ok") == ["数", "据", "库", "数据", "据库", "ok"]
    assert search.tokens("e\u0301x") == ["éx"]
    assert [search.lexical_floor(n) for n in (1, 2, 3, 8, 9, 20)] == [1, 1, 2, 2, 3, 5]
    assert search.admits_lexically(search.terms("billing database which"), "billing database")
    assert not search.admits_lexically(search.terms("billing database which"), "billing only")
    assert search.pool_size(16) == 64 and search.pool_size(4) == 32


def test_rrf_scores_and_identity_tie_break() -> None:
    fused = search.rrf([("text", [b"b", b"a"]), ("vector", [b"a", b"b"])])
    assert [f.key for f in fused] == [b"a", b"b"]  # equal scores: identity bytes decide
    assert math.isclose(fused[0].score, 1 / 61 + 1 / 62)
    single = search.rrf([("text", [b"z"])])
    assert single[0].score == 1 / 61 and single[0].channels == ("text",)  # 1.4.1's 0.01639344262295082


@pytest.mark.asyncio
async def test_fts_ranking_admission_and_kind(service: ContextService) -> None:
    sid = (await service.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    texts = [
        "billing database billing postgres",
        "billing service",
        "staging region eu-west-1",
        "database of billing and postgres and more words here",
    ]
    ids = [
        (await service.create_artifact(sid, "atomic-memory", {"kind": "k" + str(i % 2), "text": t})).artifact_id
        for i, t in enumerate(texts)
    ]
    res = await service.search(sid, "atomic-memory", "billing postgres database")
    assert res.mode.value == "fts" and res.wire_mode == "text"
    got = [h.head.artifact_id for h in res.hits]
    assert set(got) == {ids[0], ids[3]}  # 3 terms → floor 2: "billing service" is not admitted
    assert got[0] == ids[0]  # BM25 / coverage ranks the denser match first
    assert [h.matched_by for h in res.hits] == [("text",), ("text",)]
    only_k1 = await service.search(sid, "atomic-memory", "billing", kind="k1")
    assert {h.head.artifact_id for h in only_k1.hits} == {ids[1], ids[3]}
    with pytest.raises(errors.CapabilityNotSupported):
        await service.search(sid, "atomic-memory", "billing", mode="vector")
    with pytest.raises(errors.CapabilityNotSupported):
        await service.search(sid, "atomic-memory", "billing", mode="hybrid")


@pytest.mark.asyncio
async def test_vector_hybrid_and_auto_fallback(store: ContextStore) -> None:
    embed = FakeEmbedder()
    svc = make_service(store, embed=embed)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    a = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "Postgres billing cluster"})).artifact_id
    b = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "deploy on friday"})).artifact_id
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.mode.value == "hybrid" and res.fallback_reason == "none"
    assert res.hits[0].head.artifact_id == a and res.hits[0].matched_by == ("text", "vector")
    vec = await svc.search(sid, "atomic-memory", "friday deploy", mode="vector")
    assert [h.head.artifact_id for h in vec.hits] == [b] and vec.hits[0].matched_by == ("vector",)

    embed.fail = InferenceUnavailable()
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.mode.value == "fts" and res.fallback_reason == "inference_unavailable"
    assert [h.head.artifact_id for h in res.hits] == [a]
    with pytest.raises(errors.ContextInferenceUnavailable):
        await svc.search(sid, "atomic-memory", "postgres billing", mode="hybrid")
    embed.fail = InferenceTimeout()
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.fallback_reason == "inference_timeout"
    with pytest.raises(errors.ContextInferenceTimeout):
        await svc.search(sid, "atomic-memory", "postgres", mode="vector")

    # a write whose embedding fails is still stored; auto then runs fts (vectors incomplete) until backfilled
    c = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "pytest in staging"})).artifact_id
    embed.fail = None
    res = await svc.search(sid, "atomic-memory", "pytest staging", mode="auto")
    assert res.mode.value == "fts" and [h.head.artifact_id for h in res.hits] == [c]
    assert await svc.backfill_vectors() == 1
    res = await svc.search(sid, "atomic-memory", "pytest staging", mode="auto")
    assert res.mode.value == "hybrid"

    # prepare under auto records the fallback once, then reuses it
    embed.fail = InferenceUnavailable()
    await svc.create_artifact(sid, "topic-memory", {"title": "Billing", "summary": "postgres billing", "detail": "d"})
    embed.fail = None
    await svc.backfill_vectors()
    embed.fail = InferenceUnavailable()
    out = await svc.prepare(sid, "postgres billing", include_receipt=True, principal_may_read=yes)
    assert out.context["status"] == "ready" and out.receipt is not None
    searches = out.receipt["retrieval"]["searches"]
    reasons = {(s["family"], s["fallback_reason"]) for s in searches}
    assert ("atomic-memory", "inference_unavailable") in reasons
    assert ("topic-memory", "reused_fts_fallback") in reasons
    assert all(s["mode"] == "fts" for s in searches)
