"""Two PowerContext 1.4.1 request details the context routes follow exactly.

* Replace (`PUT /v1/scopes/{scope_id}/artifacts/{family}/{artifact_id}`): on topic memory,
  experience and profile `reason` is 1.4.1's (1–1024 characters, one that is not whitespace);
  an atomic-memory replace takes `content` only (no `reason`, no `restored_from_revision`,
  not even as null). Every case is decided by 1.4.1's own request model here too: 422
  `invalid_request` (content-free) exactly where it refuses, 200 where it accepts.
* Prepare with `explain: true`: 1.4.1 adds `reason` (`inference_unavailable` or
  `inference_timeout`) when the query embedding failed and `auto` fell back to full-text
  search; without `explain`, or with nothing lost, the response keeps its four fields."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from powercontext.http._generated import models as am
from pydantic import ValidationError

from gateway.context.errors import InferenceTimeout, InferenceUnavailable
from gateway.context.service import ContextSettings
from gateway.context.store.base import ContextStore
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.context.conftest import make_service, yes
from tests.context.test_search import FakeEmbedder
from tests.harness import Env, GatewayThread, raw_client
from tests.openapi_check import validate_response

FOUR = {"schema", "status", "content", "content_bytes"}
EMBED_TIMEOUT_S = 1.0  # the gateway's [context] embed_timeout_s in these tests

# --- the service: what a prepare lost, named in its result ------------------------------------


class SlowEmbedder(FakeEmbedder):
    """Answers only after `delay` seconds (past the service's embedding timeout)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        if self.delay:
            await asyncio.sleep(self.delay)
        return await super().__call__(texts)


@pytest.mark.asyncio
async def test_prepare_names_why_round_zero_lost_its_vector_channel(store: ContextStore) -> None:
    embed = SlowEmbedder(0.0)
    svc = make_service(store, embed=embed, settings=ContextSettings(embed_timeout_s=0.2, expansion_rounds=2))
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "Postgres billing cluster"})

    async def prepare(query: str = "postgres billing") -> Any:
        return await svc.prepare(sid, query, include_receipt=True, principal_may_read=yes)

    ok = await prepare()
    assert ok.degradation is None and ok.context["status"] == "ready" and set(ok.context) == FOUR
    embed.fail = InferenceUnavailable()
    lost = await prepare()
    assert lost.degradation == "inference_unavailable" and set(lost.context) == FOUR
    assert lost.context["content"] == ok.context["content"]  # fts still finds it: the content is the same
    assert lost.receipt is not None
    assert {s["fallback_reason"] for s in lost.receipt["retrieval"]["searches"]} >= {"inference_unavailable"}
    embed.fail = InferenceTimeout()
    assert (await prepare()).degradation == "inference_timeout"
    embed.fail, embed.delay = None, 1.0  # past embed_timeout_s: the service's own timeout
    assert (await prepare()).degradation == "inference_timeout"
    # nothing matches, so the expansion rounds run too: the cause is still round 0's
    empty = await prepare("zebra quokka narwhal")
    assert empty.context["status"] == "empty" and empty.degradation == "inference_timeout"
    assert len(empty.receipt["retrieval"]["rounds"]) == 3
    embed.delay = 0.0
    assert (await prepare()).degradation is None

    plain = make_service(store)  # no embeddings: fts is all there is, nothing is lost
    await plain.start()
    assert (await plain.prepare(sid, "postgres billing", principal_may_read=yes)).degradation is None


# --- the routes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    extra = (
        '[context]\nembeddings_profile = "mock-openai"\nembeddings_dimensions = 512\n'
        f"embed_timeout_s = {EMBED_TIMEOUT_S}\n"
    )
    with gateways("compat-fixes", config_extra=extra) as started:
        yield started


def _client(gw: tuple[Env, GatewayThread]) -> tuple[httpx2.Client, dict[str, str]]:
    env, gateway = gw
    return raw_client(gateway, env), {"authorization": f"Bearer {env.gateway_key}"}


def _scope(http: httpx2.Client, auth: dict[str, str]) -> str:
    body = {"title": "t", "summary": "s", "idempotency_key": uuid.uuid4().hex}
    r = http.post("/v1/scopes", json=body, headers=auth)
    assert r.status_code == 201, r.text
    return str(r.json()["scope_id"])


def _content(family: str, n: int) -> dict[str, Any]:
    """Content of `family` that 1.4.1 takes, different for every `n` (each replace changes it)."""
    return {
        "atomic-memory": {"kind": "fact", "text": f"Deploys happen on day {n}."},
        "topic-memory": {"title": "Deploys", "summary": "When deploys happen.", "detail": f"On day {n}."},
        "experience": {"situation": "s", "action": "a", "outcome": "o", "lesson": f"lesson {n}"},
        "profile": {"content": f"Prefers day {n}."},
    }[family]


# 1.4.1's replace model of each family wiregate serves
REPLACE_MODELS = {
    "atomic-memory": am.ReplaceAtomicMemoryArtifactRequest,
    "topic-memory": am.ReplaceTopicMemoryArtifactRequest,
    "experience": am.ReplaceExperienceArtifactRequest,
    "profile": am.ReplaceProfileArtifactRequest,
}

LONG = "why-" * 1250  # 5,000 characters
# (family, the body's keys besides content, 1.4.1's answer); `null` is JSON null
REASON_CASES: list[tuple[str, dict[str, Any], int]] = [
    *(
        (family, extra, status)
        for family in ("topic-memory", "experience", "profile")
        for extra, status in [
            ({"reason": ""}, 422),
            ({"reason": "   "}, 422),
            ({"reason": "\n"}, 422),
            ({"reason": "\u00a0\u3000\x85"}, 422),  # Unicode whitespace only
            ({"reason": LONG}, 422),
            ({"reason": "x" * 1025}, 422),
            ({"reason": 5}, 422),
            ({}, 200),
            ({"reason": None}, 200),
            ({"reason": "r"}, 200),
            ({"reason": " moved to day two "}, 200),
            ({"reason": "\n\nsee the ticket\n"}, 200),
            ({"reason": "x" * 1024}, 200),
            ({"reason": "é" * 1024}, 200),  # characters, not bytes
        ]
    ),
    ("atomic-memory", {"reason": "the-atomic-reason"}, 422),
    ("atomic-memory", {"reason": None}, 422),
    ("atomic-memory", {"reason": ""}, 422),
    ("atomic-memory", {"restored_from_revision": 1}, 422),
    ("atomic-memory", {"restored_from_revision": None}, 422),
    ("atomic-memory", {"reason": "r", "restored_from_revision": 1}, 422),
    ("atomic-memory", {}, 200),
]


def _accepted_by_1_4_1(family: str, body: dict[str, Any]) -> bool:
    """Whether 1.4.1's `ReplaceArtifactRequest` takes `body` as its replace of `family`."""
    try:
        parsed = am.ReplaceArtifactRequest.model_validate(body)
    except ValidationError:
        return False
    return isinstance(parsed.root, REPLACE_MODELS[family])


def test_replace_takes_a_reason_exactly_where_1_4_1_does(gw: tuple[Env, GatewayThread]) -> None:
    http, auth = _client(gw)
    sid = _scope(http, auth)
    ids: dict[str, str] = {}
    for family in REPLACE_MODELS:
        r = http.post(
            f"/v1/scopes/{sid}/artifacts", json={"family": family, "content": _content(family, -1)}, headers=auth
        )
        assert r.status_code == 201, r.text
        ids[family] = r.json()["artifact_id"]
    seen = {200: 0, 422: 0}
    for n, (family, extra, status) in enumerate(REASON_CASES):
        path = f"/v1/scopes/{sid}/artifacts/{family}/{ids[family]}"
        etag = http.get(path, headers=auth).headers["ETag"]
        body = {"content": _content(family, n), **extra}
        case = (family, sorted(extra), status)
        assert _accepted_by_1_4_1(family, body) == (status == 200), case  # the table is 1.4.1's verdict
        r = http.put(path, json=body, headers={**auth, "If-Match": etag})
        assert r.status_code == status, (case, r.status_code, r.text[:300])
        (am.ArtifactRevision if status == 200 else am.ErrorResponse).model_validate(r.json())  # 1.4.1's shapes
        seen[status] += 1
        if status == 200:
            assert r.json()["reason"] == extra.get("reason"), case
            continue
        error = r.json()["error"]
        assert (error["code"], error["message"]) == ("invalid_request", "The request violates the API contract."), case
        assert error["details"]["errors"], case
        for item in error["details"]["errors"]:
            assert set(item) == {"type", "loc", "msg"} and item["loc"][0] == "body", case
        for text in ("why-why-", "the-atomic-reason", "x" * 64):  # content-free: no reason comes back
            assert text not in r.text, case
        assert http.get(path, headers=auth).headers["ETag"] == etag, case  # nothing was written
    assert seen[200] and seen[422]


def test_an_atomic_replace_names_the_key_it_does_not_take(gw: tuple[Env, GatewayThread]) -> None:
    """1.4.1's atomic-memory replace is closed: the error names the key (never its value), and
    comes before authorisation and the write check, as every schema error does."""
    http, auth = _client(gw)
    sid = _scope(http, auth)
    made = http.post(
        f"/v1/scopes/{sid}/artifacts",
        json={"family": "atomic-memory", "content": _content("atomic-memory", 0)},
        headers=auth,
    )
    aid = made.json()["artifact_id"]
    body = {"content": _content("atomic-memory", 1), "restored_from_revision": 1, "reason": "why"}
    r = http.put(
        f"/v1/scopes/{sid}/artifacts/atomic-memory/{aid}", json=body, headers={**auth, "If-Match": '"revision:1"'}
    )
    assert r.status_code == 422
    errors = r.json()["error"]["details"]["errors"]
    assert [(e["type"], e["loc"]) for e in errors] == [
        ("extra_forbidden", ["body", "restored_from_revision"]),
        ("extra_forbidden", ["body", "reason"]),
    ]
    # in a scope that does not exist: the schema error still comes first (not 404)
    r = http.put(
        "/v1/scopes/scp_nowhere/artifacts/atomic-memory/art_x",
        json={"content": _content("atomic-memory", 2), "reason": None},
        headers={**auth, "If-Match": '"revision:1"'},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def _memory_scope(http: httpx2.Client, auth: dict[str, str]) -> str:
    sid = _scope(http, auth)
    body = {"family": "atomic-memory", "content": {"kind": "fact", "text": "Invoices are archived after seven years."}}
    r = http.post(f"/v1/scopes/{sid}/artifacts", json=body, headers=auth)
    assert r.status_code == 201, r.text
    return sid


def _failing(mock: MockProviderServer, step: dict[str, Any]) -> str:
    """A query whose embedding call gets `step` (every time) from the mock provider."""
    scenario = "x" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(scenario, [step])
    return f"invoices archived mock-scenario:{scenario}"


def _prepare(http: httpx2.Client, auth: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
    r = http.post("/v1/context/prepare", json=body, headers=auth)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


@pytest.mark.parametrize(
    ("step", "reason"),
    [
        ({"status": 503, "error_message": "overloaded"}, "inference_unavailable"),
        ({"delay_ms": EMBED_TIMEOUT_S * 3000}, "inference_timeout"),
    ],
    ids=["unavailable", "timeout"],
)
def test_explain_names_the_lost_channel(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, step: dict[str, Any], reason: str
) -> None:
    http, auth = _client(gw)
    sid = _memory_scope(http, auth)
    query = _failing(mock, step)
    base = {"scope_id": sid, "query": query}
    explained = _prepare(http, auth, {**base, "explain": True, "include_code": False, "bootstrap_receipt_id": None})
    assert set(explained) == FOUR | {"reason"} and explained["reason"] == reason
    assert explained["status"] == "ready" and "seven years" in explained["content"]  # fts still found it
    am.PreparedContext.model_validate(explained)  # 1.4.1's own response model and document take it
    validate_response("POST", "/v1/context/prepare", 200, explained)
    for flag in ({}, {"explain": False}, {"explain": None}):  # not asked: exactly the four fields
        plain = _prepare(http, auth, {**base, **flag})
        assert set(plain) == FOUR and plain["content"] == explained["content"], flag
    # with the seeds' opt-ins: the receipt records the same cause; the reuse envelope's context is
    # 1.4.1's PreparedContext, reason included, and its binding covers the same content
    both = _prepare(http, auth, {**base, "explain": True, "include_receipt": True})
    assert both["reason"] == reason and set(both) == FOUR | {"reason", "receipt"}
    searches = both["receipt"]["retrieval"]["searches"]
    assert any(s["family"] == "atomic-memory" and s["fallback_reason"] == reason for s in searches)
    reuse = _prepare(http, auth, {**base, "explain": True, "include_reuse": True})
    assert set(reuse) == {"schema", "context", "reuse"}
    assert set(reuse["context"]) == FOUR | {"reason"} and reuse["context"]["reason"] == reason
    assert reuse["context"]["content"] == explained["content"]
    plain_reuse = _prepare(http, auth, {**base, "include_reuse": True})
    assert set(plain_reuse["context"]) == FOUR
    # explained with nothing lost (the embedding answers): the four fields, ready or empty
    for query in ("invoices archived", "zebra quokka"):
        body = _prepare(http, auth, {"scope_id": sid, "query": query, "explain": True})
        assert set(body) == FOUR, query
        am.PreparedContext.model_validate(body)
