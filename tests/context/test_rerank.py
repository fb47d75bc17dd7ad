"""The optional deterministic reranker of prepare (SPEC §10.2): the rule on its own, a prepare
that runs it (the removed candidates are omitted as `rerank_not_selected`, the receipt records
its config and outcome), and the gateway's `[context] rerank` setting end to end."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import rfc8785

from gateway.context import builder, receipt, rerank
from gateway.context.errors import BuilderInvariantError
from gateway.context.rerank import RerankSettings
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.conftest import GatewayFactory
from tests.context.conftest import make_service, yes
from tests.harness import Env, GatewayThread, post_json, raw_client

QUERY = "postgres failover runbook staging"  # four terms: the lexical floor is 2


def test_most_terms_first_and_weak_candidates_removed() -> None:
    pool = ["a", "b", "c", "d"]
    texts = [
        "postgres failover",  # 2 terms
        "postgres failover runbook staging",  # 4
        "staging runbook failover",  # 3
        "postgres staging",  # 2
    ]
    out = rerank.rerank(("postgres", "failover", "runbook", "staging"), pool, texts, RerankSettings())
    # best holds 4: a selected candidate needs ceil(0.5 * 4) = 2 — every one qualifies, most first,
    # the search order breaking the tie between a and d
    assert out.kept == ("b", "c", "a", "d") and out.removed == 0
    assert (out.outcome, out.fallback_reason) == ("selected", "none")
    strict = rerank.rerank(("postgres", "failover", "runbook", "staging"), pool, texts, RerankSettings(min_share=1.0))
    assert strict.kept == ("b",) and strict.removed == 3


def test_only_the_first_candidates_are_judged() -> None:
    texts = ["postgres", "postgres failover", "nothing", "failover"]
    out = rerank.rerank(("postgres", "failover"), ["a", "b", "c", "d"], texts, RerankSettings(candidate_limit=3))
    # judged: a (1), b (2), c (0); need ceil(0.5 * 2) = 1; d is past the limit and follows unjudged
    assert out.kept == ("b", "a", "d") and out.removed == 1


def test_no_term_anywhere_keeps_the_search_order() -> None:
    out = rerank.rerank(("postgres",), ["a", "b"], ["vector hit", "another"], RerankSettings())
    assert out.kept == ("a", "b") and out.removed == 0
    assert (out.outcome, out.fallback_reason) == ("fallback", "empty_selection")


def test_the_rule_is_deterministic_and_checks_its_inputs() -> None:
    texts = ["x postgres", "postgres failover", "failover x"]
    runs = {rerank.rerank(("postgres", "failover"), [1, 2, 3], texts, RerankSettings()).kept for _ in range(5)}
    assert runs == {(2, 1, 3)}
    with pytest.raises(ValueError):
        rerank.rerank(("postgres",), [1, 2], ["postgres"], RerankSettings())
    for bad in ({"candidate_limit": 0}, {"candidate_limit": 101}, {"min_share": 0.0}, {"min_share": 1.5}):
        with pytest.raises(ValueError):
            RerankSettings(**bad)


def test_the_config_record_is_allowed_and_digested_as_the_receipt_says() -> None:
    record = RerankSettings(candidate_limit=12, min_share=0.75).config("scp_a").record()
    assert record["policy_id"] == rerank.POLICY_ID
    assert set(record["effective_settings"]) <= receipt.RERANK_SETTINGS_ALLOWED[rerank.POLICY_ID]
    body = {k: v for k, v in record.items() if k not in ("config_id", "config_digest")}
    digest = "sha256:" + hashlib.sha256(rfc8785.dumps(body)).hexdigest()
    assert record["config_id"] == record["config_digest"] == digest
    assert record["prompt"]["compiled_digest"] == "sha256:" + hashlib.sha256(rerank.DEFINITION.encode()).hexdigest()
    assert record["non_deterministic"] is False
    assert RerankSettings(candidate_limit=13).config("scp_a").record()["config_id"] != record["config_id"]


def test_the_builder_counts_what_a_reranker_removed() -> None:
    out = builder.build("scp_a", [], 4000, {"atomic-memory": 3, "experience": 0})
    assert builder.Omission("atomic-memory", "rerank_not_selected", 3) in out.omitted
    assert not any(o.family == "experience" and o.reason == "rerank_not_selected" for o in out.omitted)
    with pytest.raises(BuilderInvariantError):
        builder.build("scp_a", [], 4000, {"atomic-memory": -1})
    with pytest.raises(BuilderInvariantError):
        builder.build("scp_a", [], 4000, {"profile": 1})


async def _scope(svc: ContextService, texts: list[str]) -> str:
    scope = (await svc.create_scope(title="r", summary="s", idempotency_key=uuid.uuid4().hex, principal=None))[0]
    for text in texts:
        await svc.create_artifact(scope.scope_id, "atomic-memory", {"kind": "fact", "text": text})
    return scope.scope_id


MEMORIES = [
    "The postgres failover runbook for staging lives in the ops wiki.",  # 4 terms
    "Postgres failover drills run monthly.",  # 2 terms
    "Staging postgres is rebuilt every night.",  # 2 terms
]


@pytest.mark.asyncio
async def test_prepare_with_the_reranker_omits_and_records(store: ContextStore) -> None:
    plain = make_service(store)
    await plain.start()
    sid = await _scope(plain, MEMORIES)
    without = await plain.prepare(sid, QUERY, 4000, True, principal_may_read=yes)
    assert len(without.dependencies) == 3
    assert without.receipt is not None and without.receipt["retrieval"]["rerank_configs"] == []

    settings = RerankSettings(min_share=0.75)
    out = await plain.prepare(sid, QUERY, 4000, True, principal_may_read=yes, rerank=settings)
    assert out.receipt is not None, out.receipt_diagnostic
    # best holds 4 terms, so a selected memory needs 3: the two weaker ones are removed
    assert len(out.dependencies) == 1 and out.context["content"] is not None
    assert "ops wiki" in out.context["content"] and "drills" not in out.context["content"]
    r = out.receipt
    assert {"family": "atomic-memory", "reason": "rerank_not_selected", "count": 2} in r["omitted"]
    (config,) = r["retrieval"]["rerank_configs"]
    assert config["policy_id"] == rerank.POLICY_ID
    assert config["effective_settings"] == {"candidate_limit": 30, "min_share": 0.75}
    assert config["prompt"]["scope_id"] == sid
    assert r["retrieval"]["reranks"] == [
        {"round": 0, "config_id": config["config_id"], "outcome": "selected", "fallback_reason": "none", "count": 1}
    ]
    assert [s["stage"] for s in r["stages"]].count("rerank") == 1
    assert r["non_deterministic"] is False
    again = await plain.prepare(sid, QUERY, 4000, principal_may_read=yes, rerank=settings)
    assert again.context == out.context and again.dependencies == out.dependencies


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    extra = '[context]\nrerank = "coverage"\nrerank_min_share = 0.75\nrerank_candidate_limit = 20\n'
    with gateways("context-rerank", config_extra=extra) as started:
        yield started


def test_the_gateway_setting_runs_the_reranker(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    made = post_json(gateway, env, "/v1/scopes", {"title": "r", "summary": "r", "idempotency_key": uuid.uuid4().hex})
    sid = made.json()["scope_id"]
    for text in MEMORIES:
        body = {"family": "atomic-memory", "content": {"kind": "fact", "text": text}}
        assert post_json(gateway, env, f"/v1/scopes/{sid}/artifacts", body).status_code == 201
    out = post_json(gateway, env, "/v1/context/prepare", {"scope_id": sid, "query": QUERY, "include_receipt": True})
    assert out.status_code == 200
    body = out.json()
    assert "ops wiki" in body["content"] and "drills" not in body["content"]
    (config,) = body["receipt"]["retrieval"]["rerank_configs"]
    assert config["effective_settings"] == {"candidate_limit": 20, "min_share": 0.75}
    assert {"family": "atomic-memory", "reason": "rerank_not_selected", "count": 2} in body["receipt"]["omitted"]
    caps = raw_client(gateway, env).get("/v1/capabilities", headers={"authorization": f"Bearer {env.gateway_key}"})
    declared = caps.json()["context"]["rerank"]
    assert declared == {"policy_id": rerank.POLICY_ID, "candidate_limit": 20, "min_share": 0.75}
    plain = post_json(gateway, env, "/v1/context/prepare", {"scope_id": sid, "query": QUERY})
    assert set(plain.json()) == {"schema", "status", "content", "content_bytes"}  # no opt-in, the four fields
    # the setting follows a reload: off, the weaker memories are prepared again
    env.config.write_text(env.config.read_text().replace('rerank = "coverage"', 'rerank = "off"'))
    assert gateway.reload() is True
    after = post_json(gateway, env, "/v1/context/prepare", {"scope_id": sid, "query": QUERY, "include_receipt": True})
    assert "drills" in after.json()["content"] and after.json()["receipt"]["retrieval"]["rerank_configs"] == []


def test_an_unknown_reranker_is_a_load_error(make_env: Any) -> None:
    from gateway.config.load import ConfigError, load_runtime

    env = make_env(config_extra='[context]\nrerank = "listwise"\n')
    with pytest.raises(ConfigError):
        load_runtime(env.config)
