"""Vector and hybrid search with embeddings from an embeddings profile, through the
gateway's own checks (SPEC §10.2): every embedding call reaches the provider as a checked
outbound call; a failure under `auto` falls back to fts and the receipt records why."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, post_json

TEXT = "The ledger service stores amounts in integer cents."


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    extra = '[context]\nembeddings_profile = "mock-openai"\nembeddings_dimensions = 512\n'
    with gateways("context-vectors", config_extra=extra) as started:
        yield started


def _scope_with_memories(env: Env, gateway: GatewayThread, texts: list[str]) -> str:
    sid = post_json(
        gateway, env, "/v1/scopes", {"title": "v", "summary": "v", "idempotency_key": uuid.uuid4().hex}
    ).json()["scope_id"]
    for text in texts:
        r = post_json(
            gateway,
            env,
            f"/v1/scopes/{sid}/artifacts",
            {"family": "atomic-memory", "content": {"kind": "fact", "text": text}},
        )
        assert r.status_code == 201
    return str(sid)


def _embedding_calls(mock: MockProviderServer, since: int) -> list[Any]:
    return [r for r in mock.state.records() if r.seq > since and r.path.endswith("/embeddings")]


def test_vector_and_hybrid_search(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    since = mock.state.records()[-1].seq if mock.state.records() else 0
    sid = _scope_with_memories(env, gateway, [TEXT, "Deploys happen on Tuesdays."])
    writes = _embedding_calls(mock, since)
    assert len(writes) == 2  # one embedding per write, sent through the profile
    assert json.loads(writes[0].body)["input"] == [TEXT]

    vector = post_json(
        gateway, env, "/v1/atomic-memory/search", {"scope_id": sid, "query": TEXT, "mode": "vector"}
    ).json()
    assert vector["mode"] == "vector"
    assert [h["memory"]["text"] for h in vector["hits"]] == [TEXT]
    assert vector["hits"][0]["matched_by"] == ["vector"]
    hybrid = post_json(
        gateway, env, "/v1/atomic-memory/search", {"scope_id": sid, "query": TEXT, "mode": "hybrid"}
    ).json()
    assert hybrid["mode"] == "hybrid" and sorted(hybrid["hits"][0]["matched_by"]) == ["text", "vector"]
    auto = post_json(gateway, env, "/v1/memory/search", {"scope_id": sid, "query": TEXT, "mode": "auto"}).json()
    assert auto["mode"] == "hybrid"


def test_auto_falls_back_to_fts_and_the_receipt_says_why(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    sid = _scope_with_memories(env, gateway, ["Invoices are archived after seven years."])
    scenario = "e" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(scenario, [{"status": 503, "error_message": "overloaded"}] * 6)
    query = f"invoices archived mock-scenario:{scenario}"
    body = {"scope_id": sid, "query": query, "include_receipt": True}
    prepared = post_json(gateway, env, "/v1/context/prepare", body).json()
    assert prepared["status"] == "ready" and "seven years" in prepared["content"]
    searches = prepared["receipt"]["retrieval"]["searches"]
    memory = [s for s in searches if s["family"] == "atomic-memory"]
    assert memory and memory[0]["mode"] == "fts" and memory[0]["fallback_reason"] == "inference_unavailable"
    # an explicit vector search cannot fall back: it says the provider is unavailable
    r = post_json(gateway, env, "/v1/atomic-memory/search", {"scope_id": sid, "query": query, "mode": "vector"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "inference_unavailable"


@pytest.mark.parametrize(
    ("case", "profile", "extra", "policy"),
    [
        ("model", {"models": ["text-embedding-3-small"]}, 'embeddings_model = "text-embedding-3-large"\n', ""),
        ("retention", {}, "", 'retention_required = ["zero-data-retention"]\n'),
        ("expired", {}, "", ""),  # expires 3 s after it is signed
    ],
)
def test_the_embeddings_profile_obeys_the_rules_of_any_call(
    gateways: GatewayFactory, mock: MockProviderServer, case: str, profile: dict[str, Any], extra: str, policy: str
) -> None:
    """A profile a client could not use for this model — it does not serve it, its
    retention is not one the policy accepts, it has expired — receives no memory text from
    the gateway either: the write succeeds, its vector is missing."""
    ends = datetime.now(UTC) + timedelta(seconds=3)
    if case == "expired":
        profile = {"expires": ends.strftime("%Y-%m-%dT%H:%M:%SZ")}
    profiles = [mock_profile("emb", "openai", mock.url, carriers=["embeddings"], **profile)]
    config = '[context]\nembeddings_profile = "emb"\n' + extra
    with gateways(f"vectors-{case}", profiles=profiles, config_extra=config, policy_extra=policy) as (env, gateway):
        if case == "expired":
            time.sleep(max(0.0, (ends - datetime.now(UTC)).total_seconds()) + 1.0)
        since = mock.state.records()[-1].seq if mock.state.records() else 0
        _scope_with_memories(env, gateway, [TEXT])
        assert _embedding_calls(mock, since) == []
