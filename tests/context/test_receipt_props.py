"""Property tests: for random stores and queries, every receipt invariant of COMPAT §7.1 holds."""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import unicodedata
import uuid
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.context import builder, receipt
from gateway.context.builder import Candidate, ScopeGroup
from gateway.context.model import ArtifactAddress, ArtifactRef
from gateway.context.rerank import RerankSettings
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase
from tests.context.conftest import make_service, yes

WORDS = ["billing", "postgres", "staging", "région", "数据库", "deploy", "zürich", "token", "a", "ok"]
text_st = st.tuples(
    st.sampled_from(WORDS),
    st.lists(st.sampled_from(WORDS + ["\u2028", "\u0085", "é" * 50, "€" * 300, "x" * 700]), max_size=12),
).map(lambda p: " ".join([p[0], *p[1]]))


def check_receipt(
    r: dict[str, Any], ctx: dict[str, Any], deps: list[ArtifactAddress], query: str, max_bytes: int
) -> None:
    assert list(r) == [
        "schema",
        "policy_id",
        "receipt_id",
        "query_digest",
        "content_digest",
        "requested_max_bytes",
        "used_bytes",
        "truncated",
        "non_deterministic",
        "retrieval",
        "selected",
        "omitted",
        "stages",
    ]
    assert r["schema"] == r["policy_id"] == "powercontext.prepared-context-receipt.v1"
    uuid.UUID(r["receipt_id"])
    norm = unicodedata.normalize("NFC", query).strip()
    assert r["query_digest"] == "sha256:" + hashlib.sha256(norm.encode()).hexdigest()
    if ctx["status"] == "empty":
        assert ctx["content"] is None and ctx["content_bytes"] == 0 and r["content_digest"] is None
        assert r["selected"] == []
    else:
        raw = ctx["content"].encode()
        assert r["content_digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()
        assert ctx["content_bytes"] == len(raw) <= max_bytes
        overhead = len(builder.render([]).encode()) + len(r["selected"]) - 1
        assert overhead + sum(s["rendered_bytes"] for s in r["selected"]) == len(raw)
    assert r["requested_max_bytes"] == max_bytes and r["used_bytes"] == ctx["content_bytes"]
    assert len(r["selected"]) <= 32 and len(r["omitted"]) <= 16 and len(r["stages"]) <= 8
    assert [ArtifactAddress.from_wire(s["artifact_address"]) for s in r["selected"]] == deps
    for s in r["selected"]:
        assert s["kind"] == s["artifact_address"]["artifact"]["family"]
        assert len({"artifact_address", "code_evidence"} & set(s)) == 1
    ret = r["retrieval"]
    assert 1 <= len(ret["rounds"]) <= 3 and len(ret["searches"]) <= 32
    assert len(ret["rerank_configs"]) <= 8 and len(ret["reranks"]) <= 32
    keys = [(s["round"], s["family"], s["mode"], s["outcome"], s["fallback_reason"]) for s in ret["searches"]]
    assert keys == sorted(keys) and all(s["count"] > 0 and s["mode"] != "auto" for s in ret["searches"])
    assert any(s["truncated"] for s in r["selected"]) <= r["truncated"]
    for o in r["omitted"]:
        assert o["count"] > 0 and o["reason"] in builder.REASONS
    assert len(json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode()) <= 8192


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    current=st.lists(text_st, max_size=20),
    referenced=st.lists(text_st, max_size=8),
    topics=st.lists(text_st, max_size=4),
    exps=st.lists(text_st, max_size=4),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join).map(lambda q: f"  {q}\u0301 "),
    max_bytes=st.integers(min_value=512, max_value=32768),
    reranker=st.one_of(
        st.none(),
        st.builds(RerankSettings, st.integers(min_value=1, max_value=20), st.sampled_from([0.25, 0.5, 1.0])),
    ),
)
def test_prepare_receipts_hold_every_invariant(
    current: list[str],
    referenced: list[str],
    topics: list[str],
    exps: list[str],
    query: str,
    max_bytes: int,
    reranker: RerankSettings | None,
) -> None:
    async def run() -> None:
        with tempfile.TemporaryDirectory() as d:
            store = SqliteContextStore(SqliteDatabase(str(Path(d) / "p.db")))
            await store.open()
            try:
                svc = make_service(store)
                await svc.start()
                ref = (await svc.create_scope(title="r", summary="s", idempotency_key="r", principal=None))[0]
                cur = (
                    await svc.create_scope(
                        title="c", summary="s", idempotency_key="c", principal=None, context_references=[ref.scope_id]
                    )
                )[0]
                for t in current:
                    await svc.create_artifact(cur.scope_id, "atomic-memory", {"kind": "f", "text": t})
                for t in referenced:
                    await svc.create_artifact(ref.scope_id, "atomic-memory", {"kind": "f", "text": t})
                for t in topics:
                    await svc.create_artifact(
                        cur.scope_id, "topic-memory", {"title": t[:500], "summary": t, "detail": t}
                    )
                for t in exps:
                    await svc.create_artifact(
                        ref.scope_id, "experience", {"situation": t, "action": t, "outcome": t, "lesson": t}
                    )
                out = await svc.prepare(cur.scope_id, query, max_bytes, True, principal_may_read=yes, rerank=reranker)
                assert out.receipt is not None, out.receipt_diagnostic
                check_receipt(out.receipt, out.context, list(out.dependencies), query, max_bytes)
                reranks = out.receipt["retrieval"]["reranks"]
                assert len(out.receipt["retrieval"]["rerank_configs"]) == (reranker is not None)
                assert reranker is not None or not reranks
                again = await svc.prepare(cur.scope_id, query, max_bytes, principal_may_read=yes, rerank=reranker)
                assert again.context == out.context and again.dependencies == out.dependencies
            finally:
                await store.close()

    asyncio.run(run())


def _cand(family: str, i: int, scope: str, text: str) -> Candidate:
    content: dict[str, Any] = {
        "atomic-memory": {"text": text},
        "topic-memory": {"title": text, "summary": text},
        "experience": {"situation": text, "action": "a", "outcome": "o", "lesson": "l"},
    }[family]
    return Candidate(ArtifactAddress(scope, ArtifactRef(family, f"art_{family[0]}{i}", 1 + i % 3)), content)


@settings(max_examples=150, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.lists(text_st, max_size=16), st.lists(text_st, max_size=8), st.lists(text_st, max_size=8)),
        min_size=1,
        max_size=3,
    ),
    max_bytes=st.integers(min_value=512, max_value=32768),
    dup=st.booleans(),
)
def test_builder_and_receipt_invariants_pure(
    groups: list[tuple[list[str], list[str], list[str]]], max_bytes: int, dup: bool
) -> None:
    scopes = [f"scp_{g}" for g in range(len(groups))]
    # the pools hold at most their ceilings over all groups: cut them as a prepare does
    families = list(zip(*groups, strict=True))
    ceilings = [builder.POOL_CEILINGS[f] for f in ("atomic-memory", "topic-memory", "experience")]
    shares = [builder.fair_shares([len(p) for p in pools], c) for pools, c in zip(families, ceilings, strict=True)]
    groups = [(m[: shares[0][g]], t[: shares[1][g]], e[: shares[2][g]]) for g, (m, t, e) in enumerate(groups)]
    built_groups = []
    for g, (m, t, e) in enumerate(groups):
        mem = tuple(_cand("atomic-memory", i, scopes[g], x) for i, x in enumerate(m))
        if dup and mem and g == 0 and sum(len(x[0]) for x in groups) < builder.POOL_CEILINGS["atomic-memory"]:
            mem = mem + mem[:1]
        built_groups.append(
            ScopeGroup(
                scopes[g],
                memory=mem,
                topic=tuple(_cand("topic-memory", i, scopes[g], x) for i, x in enumerate(t)),
                experience=tuple(_cand("experience", i, scopes[g], x) for i, x in enumerate(e)),
            )
        )
    out = builder.build(scopes[0], built_groups, max_bytes)
    assert out == builder.build(scopes[0], built_groups, max_bytes)
    assert len(out.items) <= 8 and sum(1 for i in out.items if i.kind == "experience") <= 2
    deps = [i.address for i in out.items]
    made = receipt.build_receipt(
        receipt.ReceiptInput(
            receipt_id=str(uuid.UUID(int=7, version=4)),
            query="billing",
            requested_max_bytes=max_bytes,
            built=out,
            origins=deps,
            rounds=[receipt.RecallRound(0, "completed", len(deps))],
            searches=[receipt.SearchGroup(0, "atomic-memory", "fts", "completed", "none", len(groups))],
            stages=[receipt.StageTiming("context.build", 0.5, 1)],
        )
    )
    assert made.receipt is not None, made.diagnostic
    check_receipt(made.receipt, out.to_context(), deps, "billing", max_bytes)
    # any breach drops the whole receipt with a content-free code
    if deps:
        bad = receipt.build_receipt(
            receipt.ReceiptInput(
                receipt_id=str(uuid.UUID(int=7, version=4)),
                query="billing",
                requested_max_bytes=max_bytes,
                built=out,
                origins=list(reversed(deps)) + [deps[0]],
                rounds=[receipt.RecallRound(0, "completed", 0)],
                searches=[],
                stages=[],
            )
        )
        assert bad.receipt is None and bad.diagnostic == "receipt_selected_order"


def test_receipt_breaches_give_codes_not_content() -> None:
    c = _cand("atomic-memory", 1, "scp_x", "secret text")
    out = builder.build("scp_x", [ScopeGroup("scp_x", memory=(c,))], 8000)
    base = dict(
        query="q",
        requested_max_bytes=8000,
        built=out,
        origins=[c.address],
        rounds=[receipt.RecallRound(0, "completed", 1)],
        searches=[],
        stages=[],
    )
    rid = str(uuid.UUID(int=1, version=4))
    cases = {
        "receipt_id_invalid": dict(receipt_id="not-a-uuid"),
        "receipt_rounds_limit": dict(receipt_id=rid, rounds=[receipt.RecallRound(i, "completed", 0) for i in range(4)]),
        "receipt_search_count": dict(
            receipt_id=rid, searches=[receipt.SearchGroup(0, "atomic-memory", "fts", "completed", "none", 0)]
        ),
        "receipt_search_mode": dict(
            receipt_id=rid, searches=[receipt.SearchGroup(0, "atomic-memory", "auto", "completed", "none", 1)]
        ),
        "receipt_stages_limit": dict(receipt_id=rid, stages=[receipt.StageTiming("rerank", 1, 1)] * 9),
        "receipt_rerank_reference": dict(
            receipt_id=rid, reranks=[receipt.RerankGroup(0, "sha256:x", "selected", "none", 1)]
        ),
    }
    for code, override in cases.items():
        made = receipt.build_receipt(receipt.ReceiptInput(**{**base, **override}))  # type: ignore[arg-type]
        assert made.receipt is None and made.diagnostic == code
        assert "secret" not in code and "scp_x" not in code
    cfg = receipt.RerankConfig(
        "powercontext.memory.rerank.listwise.v1", "m", {"temperature": 0}, 5.0, 1, {"key": "memory.rerank"}, True
    )
    ok = receipt.build_receipt(
        receipt.ReceiptInput(
            receipt_id=rid,
            rerank_configs=[cfg],
            reranks=[receipt.RerankGroup(0, cfg.record()["config_id"], "selected", "none", 1)],
            non_deterministic=True,
            **base,
        )
    )  # type: ignore[arg-type]
    assert ok.receipt is not None and ok.receipt["non_deterministic"] is True
    rec = ok.receipt["retrieval"]["rerank_configs"][0]
    assert rec["config_id"] == rec["config_digest"] and rec["config_digest"].startswith("sha256:")
