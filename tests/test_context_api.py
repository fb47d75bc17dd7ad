"""The context routes, driven by the official PowerContext 1.4.1 client over HTTPS and the
Unix socket, every response validated against the 1.4.1 OpenAPI document; raw HTTP for
what the client cannot send (the seeds' opt-ins, retire, malformed bodies)."""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from powercontext.client import PowerContextClient, ServerResponseError
from powercontext.http import (
    CreateArtifactRequest,
    CreateScopeRequest,
    ListArtifactRevisionsRequest,
    ListArtifactsRequest,
    PrepareContextRequest,
    RememberMemoryRequest,
    ReplaceArtifactRequest,
    SearchArtifactsRequest,
    SearchMemoryRequest,
)
from powercontext.http._generated import models as am

from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, raw_client
from tests.openapi_check import validate_response

SECRET = "sk-ctx-TEST-0a1b2c3d4e5f"
BEGIN = "BEGIN_POWERCONTEXT_PREPARED_CONTEXT_V1"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("context-api", secrets_=[SECRET]) as started:
        yield started


class Validating:
    """httpx hooks: every response the client gets is checked against 1.4.1's document."""

    def __init__(self) -> None:
        self.checked = 0
        self.etags: list[str] = []

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        request = response.request
        path = request.url.path
        if response.status_code == 304 or not path.startswith("/v1/"):
            return
        assert response.headers.get("x-powercontext-request-id", "").isalnum()
        assert len(response.headers["x-powercontext-request-id"]) == 16
        if "etag" in response.headers:
            self.etags.append(response.headers["etag"])
        validate_response(request.method, path, response.status_code, response.json())
        self.checked += 1


def _client(
    env: Env, gateway: GatewayThread, uds: bool, hooks: Validating
) -> tuple[PowerContextClient, httpx.AsyncClient]:
    events = {"response": [hooks.on_response]}
    if uds:
        http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(gateway.uds)), timeout=30, event_hooks=events
        )
        return PowerContextClient("http://localhost", token=env.gateway_key, http_client=http), http
    tls = ssl.create_default_context(cafile=str(env.ca))
    http = httpx.AsyncClient(verify=tls, timeout=30, event_hooks=events)
    return PowerContextClient(gateway.https_url, token=env.gateway_key, http_client=http), http


async def _expect(status: int, code: str, coro: Any) -> ServerResponseError:
    with pytest.raises(ServerResponseError) as caught:
        await coro
    assert (caught.value.status_code, caught.value.code) == (status, code)
    return caught.value


async def _scenario(client: PowerContextClient, hooks: Validating) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    scope = await client.create_scope(
        CreateScopeRequest(title="billing", summary="billing team memories", idempotency_key=str(uuid.uuid4()))
    )
    sid = scope.scope_id
    assert sid.startswith("scp_") and scope.version == 1
    assert (await client.get_scope(sid)).scope_id == sid
    assert sid in [s.scope_id for s in (await client.list_scopes()).items]

    texts = [
        ("decision", "We use PostgreSQL 16 for the billing service database."),
        ("constraint", "Never deploy billing to production on Fridays after 15:00 UTC."),
        ("fact", "The billing staging cluster runs in region eu-west-1."),
        ("preference", "The billing team prefers pytest over unittest."),
    ]
    ids = []
    for kind, text in texts:
        created = await client.create_artifact(
            sid,
            CreateArtifactRequest.model_validate({"family": "atomic-memory", "content": {"kind": kind, "text": text}}),
        )
        assert created.revision == 1 and hooks.etags[-1] == '"revision:1"'
        ids.append(created.artifact_id)
    remembered = await client.remember_memory(
        RememberMemoryRequest(scope_id=sid, kind="fact", text="Billing CI runs on GitHub Actions.")
    )
    ids.append(remembered.records[0].artifact.artifact_id)

    head = await client.get_artifact(sid, "atomic-memory", ids[0])
    etag = hooks.etags[-1]
    assert etag == f'"revision:{head.revision}"'
    assert await client.get_artifact(sid, "atomic-memory", ids[0], if_none_match=etag) is None  # 304
    replaced = await client.replace_artifact(
        sid,
        "atomic-memory",
        ids[0],
        ReplaceArtifactRequest.model_validate(
            {"content": {"kind": "decision", "text": "We use PostgreSQL 17 for the billing service database."}}
        ),
        expected_etag=etag,
    )
    assert replaced.revision == 2
    stale = await _expect(
        412,
        "revision_conflict",
        client.replace_artifact(
            sid,
            "atomic-memory",
            ids[0],
            ReplaceArtifactRequest.model_validate({"content": {"kind": "decision", "text": "a lost update"}}),
            expected_etag=etag,
        ),
    )
    assert stale.details == {"provided_etag": '"revision:1"', "current_etag": '"revision:2"'}

    listed = await client.list_artifacts(sid, "atomic-memory", ListArtifactsRequest(limit=10))
    assert {i.artifact_id for i in listed.items} == set(ids)
    revisions = await client.list_artifact_revisions(sid, "atomic-memory", ids[0], ListArtifactRevisionsRequest())
    assert [r.revision for r in revisions.items] == [2, 1]
    old = await client.get_artifact_revision(sid, "atomic-memory", ids[0], 1)
    assert "PostgreSQL 16" in old.content["text"]

    for mode in ("auto", "fts"):
        hits = await client.search_memory(SearchMemoryRequest(scope_id=sid, query="PostgreSQL billing", mode=mode))
        assert hits.mode == "text" and hits.hits and hits.hits[0].memory.artifact.artifact_id == ids[0]
    atomic = await client.search_atomic_memory(
        am.SearchAtomicMemoryRequest(scope_id=sid, query="PostgreSQL billing", mode="text")
    )
    assert atomic.hits[0].memory.text.startswith("We use PostgreSQL 17")
    found = await client.search_artifacts(
        sid, "atomic-memory", SearchArtifactsRequest(query="PostgreSQL billing", include_scores=True)
    )
    assert found.results[0].artifact_id == ids[0] and found.results[0].revision == 2
    for mode in ("vector", "hybrid"):  # no embeddings profile configured: refused explicitly, never a 500
        await _expect(
            422,
            "capability_not_supported",
            client.search_atomic_memory(am.SearchAtomicMemoryRequest(scope_id=sid, query="billing", mode=mode)),
        )

    prepared = await client.prepare_context(
        PrepareContextRequest(scope_id=sid, query="Which database does billing use?")
    )
    assert prepared.status == "ready" and prepared.content is not None
    assert BEGIN in prepared.content and "PostgreSQL 17" in prepared.content and "PostgreSQL 16" not in prepared.content
    assert prepared.content_bytes == len(prepared.content.encode())
    seen["prepared"] = prepared.content

    state = await client.get_atomic_memory_state(sid, ids[2])
    assert (state.state, state.state_version) == ("active", 0)
    forgot = await client.change_atomic_memory_lifecycle(
        am.AtomicMemoryLifecycleRequest(
            scope_id=sid,
            state="forgotten",
            target=am.AtomicMemoryInput(artifact=state.artifact, state_version=state.state_version),
        )
    )
    assert forgot.changed and forgot.records[0].state == "forgotten"
    await _expect(
        409,
        "atomic_memory_changed",
        client.change_atomic_memory_lifecycle(
            am.AtomicMemoryLifecycleRequest(
                scope_id=sid,
                state="forgotten",
                target=am.AtomicMemoryInput(artifact=state.artifact, state_version=state.state_version),
            )
        ),
    )
    s1 = await client.get_atomic_memory_state(sid, ids[1])
    s3 = await client.get_atomic_memory_state(sid, ids[3])
    merged = await client.merge_atomic_memories(
        am.MergeAtomicMemoryRequest(
            scope_id=sid,
            inputs=[
                am.AtomicMemoryInput(artifact=s1.artifact, state_version=s1.state_version),
                am.AtomicMemoryInput(artifact=s3.artifact, state_version=s3.state_version),
            ],
            content=am.AtomicMemoryWriteContent(kind="fact", text="Billing: no Friday deploys; pytest preferred."),
        )
    )
    assert {r.state for r in merged.records} == {"merged", "active"}
    everything = await client.list_atomic_memories(
        am.ListAtomicMemoryRequest(scope_id=sid, states=["active", "forgotten", "merged", "retired"])
    )
    assert {r.state for r in everything.items} == {"active", "forgotten", "merged"}
    active = await client.list_atomic_memories(am.ListAtomicMemoryRequest(scope_id=sid))
    assert {r.state for r in active.items} == {"active"}
    # a forgotten memory's exact revision is still readable, and prepare no longer uses it
    assert "eu-west-1" in (await client.get_artifact_revision(sid, "atomic-memory", ids[2], 1)).content["text"]
    after = await client.prepare_context(PrepareContextRequest(scope_id=sid, query="staging cluster region"))
    assert after.status == "empty" or "eu-west-1" not in (after.content or "")
    seen["scope"] = sid
    seen["ids"] = ids
    return seen


@pytest.mark.parametrize("transport", ["https", "uds"])
def test_official_client_full_scenario(gw: tuple[Env, GatewayThread], transport: str) -> None:
    env, gateway = gw
    hooks = Validating()
    client, http = _client(env, gateway, transport == "uds", hooks)

    async def run() -> dict[str, Any]:
        try:
            caps = await client.get_capabilities()
            assert "atomic-memory" in caps.artifact_families and "fts" in caps.search_modes
            assert caps.context_versions == ["powercontext.prepared-context.v1"]
            return await _scenario(client, hooks)
        finally:
            await http.aclose()

    seen = asyncio.run(run())
    assert hooks.checked >= 30
    assert seen["prepared"].startswith("PowerContext prepared untrusted historical context.")


# --- raw HTTP: what the client cannot send ------------------------------------------------------


def _post(env: Env, gateway: GatewayThread, path: str, body: Any, **headers: str) -> Any:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return raw_client(gateway, env).post(
        path,
        content=content,
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json", **headers},
    )


def _scope(env: Env, gateway: GatewayThread) -> str:
    r = _post(env, gateway, "/v1/scopes", {"title": "t", "summary": "s", "idempotency_key": uuid.uuid4().hex})
    assert r.status_code == 201
    return str(r.json()["scope_id"])


def _memory(env: Env, gateway: GatewayThread, sid: str, text: str, kind: str = "fact") -> dict[str, Any]:
    r = _post(
        env,
        gateway,
        f"/v1/scopes/{sid}/artifacts",
        {"family": "atomic-memory", "content": {"kind": kind, "text": text}},
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_prepare_without_opt_ins_is_exactly_four_fields(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    sid = _scope(env, gateway)
    _memory(env, gateway, sid, "The invoice service retries webhooks three times.")
    for extra in (
        {},
        {"include_receipt": None, "include_reuse": False},
        {"include_code": False, "bootstrap_receipt_id": None},
    ):
        r = _post(env, gateway, "/v1/context/prepare", {"scope_id": sid, "query": "invoice webhooks", **extra})
        assert r.status_code == 200
        assert set(r.json()) == {"schema", "status", "content", "content_bytes"}
        validate_response("POST", "/v1/context/prepare", 200, r.json())
    empty = _post(env, gateway, "/v1/context/prepare", {"scope_id": sid, "query": "kubernetes autoscaling"}).json()
    assert empty == {
        "schema": "powercontext.prepared-context.v1",
        "status": "empty",
        "content": None,
        "content_bytes": 0,
    }


def test_prepare_with_receipt_and_reuse(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    sid = _scope(env, gateway)
    made = _memory(env, gateway, sid, "The ledger service stores amounts in integer cents.")
    r = _post(
        env, gateway, "/v1/context/prepare", {"scope_id": sid, "query": "ledger amounts cents", "include_receipt": True}
    )
    body = r.json()
    assert set(body) == {"schema", "status", "content", "content_bytes", "receipt"}
    receipt = body["receipt"]
    assert receipt["schema"] == "powercontext.prepared-context-receipt.v1"
    assert receipt["content_digest"].startswith("sha256:") and receipt["used_bytes"] == body["content_bytes"]
    assert [s["artifact_address"]["artifact"]["artifact_id"] for s in receipt["selected"]] == [made["artifact_id"]]
    assert len(json.dumps(receipt, separators=(",", ":")).encode()) <= 8192

    both = _post(
        env,
        gateway,
        "/v1/context/prepare",
        {"scope_id": sid, "query": "ledger amounts cents", "include_receipt": True, "include_reuse": True},
    ).json()
    assert both["schema"] == "powercontext.prepared-context-with-reuse.v1"
    assert set(both) == {"schema", "context", "reuse", "receipt"}
    assert set(both["context"]) == {"schema", "status", "content", "content_bytes"}
    assert both["context"]["content"] == body["content"]  # the same store state gives the same bytes
    reuse = both["reuse"]
    assert reuse["schema"] == "powercontext.context-reuse.v1"
    assert reuse["constraints"]["preserve"] == ["content", "citations", "trust", "order"]
    assert reuse["binding"] and "ledger" not in reuse["binding"]


def test_a_receipt_id_is_logged_with_its_request_id(gw: tuple[Env, GatewayThread], captured_logs: LogCapture) -> None:
    """COMPAT §7.1: a receipt's id is correlated with the request id in the logs (the
    prepare line names both); a prepare without a receipt names none."""
    env, gateway = gw
    sid = _scope(env, gateway)
    _memory(env, gateway, sid, "The invoice job runs at midnight UTC.")
    for asked in (True, False):
        mark = captured_logs.mark()
        r = _post(
            env, gateway, "/v1/context/prepare", {"scope_id": sid, "query": "invoice job", "include_receipt": asked}
        )
        assert r.status_code == 200
        lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.strip()]
        prepared = [line for line in lines if line["event"] == "prepare"]
        request = [line for line in lines if line["event"] == "request"]
        assert len(prepared) == 1 and prepared[0]["request_id"] == request[0]["request_id"]
        assert prepared[0].get("receipt_id") == (r.json()["receipt"]["receipt_id"] if asked else None)


def test_retire_is_an_extension_and_old_revisions_stay_readable(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    sid = _scope(env, gateway)
    made = _memory(env, gateway, sid, "Payments use idempotency keys on every POST.")
    target = {
        "artifact": {"family": "atomic-memory", "artifact_id": made["artifact_id"], "revision": 1},
        "state_version": 0,
    }
    r = _post(env, gateway, "/v1/atomic-memory/lifecycle", {"scope_id": sid, "target": target, "state": "retired"})
    assert r.status_code == 200 and r.json()["records"][0]["state"] == "retired"
    rev = raw_client(gateway, env).get(
        f"/v1/scopes/{sid}/artifacts/atomic-memory/{made['artifact_id']}/revisions/1",
        headers={"authorization": f"Bearer {env.gateway_key}"},
    )
    assert rev.status_code == 200 and "idempotency" in rev.json()["content"]["text"]
    assert "etag" not in rev.headers


def test_secrets_are_never_stored(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    sid = _scope(env, gateway)
    for body in (
        {"family": "atomic-memory", "content": {"kind": "fact", "text": f"the key is {SECRET}"}},
        {"family": "atomic-memory", "content": {"kind": SECRET, "text": "harmless"}},
        {"family": "experience", "content": {"situation": "s", "action": "a", "outcome": "o", "lesson": SECRET}},
    ):
        r = _post(env, gateway, f"/v1/scopes/{sid}/artifacts", body)
        assert r.status_code == 422 and r.json()["error"]["code"] == "memory_write_rejected"
        assert r.json()["error"]["details"] == {"reason_codes": ["secret_value"]}
        assert SECRET not in r.text
    listed = raw_client(gateway, env).get(
        f"/v1/scopes/{sid}/artifacts/atomic-memory", headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert listed.json()["items"] == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b'{"scope_id": "default", "query": "x", "query": "y"}', 422, "invalid_request"),  # duplicate key
        (b"{not json", 422, "invalid_request"),
        ({"scope_id": "default"}, 422, "invalid_request"),
        ({"scope_id": "default", "query": "x", "max_bytes": "8000"}, 422, "invalid_request"),  # strict int
        ({"scope_id": "default", "query": "x", "max_bytes": 100}, 422, "invalid_request"),
        ({"scope_id": "default", "query": "x", f"{SECRET}": 1}, 422, "invalid_request"),  # unknown key
        ({"scope_id": "default", "query": "   "}, 422, "invalid_request"),
        ({"scope_id": "default", "query": "x", "include_code": True}, 422, "capability_not_supported"),
        ({"scope_id": "nope-not-mine", "query": "x"}, 403, "forbidden"),
    ],
)
def test_prepare_bad_input(gw: tuple[Env, GatewayThread], body: Any, status: int, code: str) -> None:
    env, gateway = gw
    r = _post(env, gateway, "/v1/context/prepare", body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
    validate_response("POST", "/v1/context/prepare", r.status_code, r.json())
    assert SECRET not in r.text


def test_auth_shape(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    r = raw_client(gateway, env).get("/v1/scopes", headers={"authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {
        "error": {"code": "unauthorized", "message": "A valid credential is required.", "details": None}
    }


def test_replace_needs_if_match(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    sid = _scope(env, gateway)
    made = _memory(env, gateway, sid, "Refunds settle within five business days.")
    url = f"/v1/scopes/{sid}/artifacts/atomic-memory/{made['artifact_id']}"
    client = raw_client(gateway, env)
    auth = {"authorization": f"Bearer {env.gateway_key}"}
    body = {"content": {"kind": "fact", "text": "Refunds settle within three business days."}}
    assert client.put(url, json=body, headers=auth).status_code == 428
    for wrong in ('W/"revision:1"', "revision:1", "*", f'"{SECRET}"'):
        r = client.put(url, json=body, headers={**auth, "if-match": wrong})
        assert r.status_code == 412 and SECRET not in r.text
    assert client.put(url, json=body, headers={**auth, "if-match": '"revision:1"'}).status_code == 200


def test_smaller_points_answer_as_1_4_1(gw: tuple[Env, GatewayThread]) -> None:
    """What tests/test_context_differential_values.py checks against the 1.4.1 server, pinned
    here too (it runs without one): `assembly: null`, `If-None-Match: *`, skill search,
    the topic search `limit`, atomic listing `states`/`tag_match`, 1.4.1 score metrics."""
    env, gateway = gw
    sid = _scope(env, gateway)
    made = _memory(env, gateway, sid, "Refunds settle within five business days.")
    client = raw_client(gateway, env)
    auth = {"authorization": f"Bearer {env.gateway_key}"}
    prepare = _post(env, gateway, "/v1/context/prepare", {"scope_id": sid, "query": "refunds", "assembly": None})
    assert prepare.status_code == 422 and prepare.json()["error"]["code"] == "invalid_request"
    head = f"/v1/scopes/{sid}/artifacts/atomic-memory/{made['artifact_id']}"
    assert client.get(head, headers={**auth, "if-none-match": "*"}).status_code == 200
    assert client.get(head, headers={**auth, "if-none-match": 'W/"revision:1"'}).status_code == 304
    assert client.get(f"{head}/state", headers={**auth, "if-none-match": "*"}).status_code == 304
    search = f"/v1/scopes/{sid}/artifacts/%s/search"
    skill = _post(env, gateway, search % "skill", {"query": "refunds", "include_scores": True})
    assert (skill.status_code, skill.json()) == (200, {"results": []})
    assert _post(env, gateway, search % "skill", {"query": "refunds", "mode": "vector"}).status_code == 422
    for family, limit, status in (("topic-memory", 20, 200), ("topic-memory", 21, 422), ("experience", 150, 200)):
        assert _post(env, gateway, search % family, {"query": "refunds", "limit": limit}).status_code == status
    scored = _post(env, gateway, search % "atomic-memory", {"query": "refunds", "include_scores": True}).json()
    channel = scored["results"][0]["scores"]["channels"]["text"]
    assert (channel["metric"], channel["higher_is_better"]) == ("sqlite_bm25", False)
    for body, field in (({"states": []}, "states"), ({"tag_match": "any"}, "tag_match")):
        refused = _post(env, gateway, "/v1/atomic-memory/list", {"scope_id": sid, **body})
        assert refused.status_code == 422 and refused.json()["error"]["details"]["field"] == field


def _get(env: Env, gateway: GatewayThread, path: str) -> Any:
    return raw_client(gateway, env).get(path, headers={"authorization": f"Bearer {env.gateway_key}"})


def test_scope_listing_filters_are_served_or_refused(gw: tuple[Env, GatewayThread]) -> None:
    """`parent_scope_id` and `external_reference_kind` filter the listing as 1.4.1's do (the
    official client sends them); the discovery 1.4.1 offers beside them (text queries,
    bindings) is refused by name, never ignored (every scope came back once, whatever the
    filter)."""
    env, gateway = gw
    tag = uuid.uuid4().hex[:8]
    parent = _scope(env, gateway)
    child = _post(
        env,
        gateway,
        "/v1/scopes",
        {"title": "child", "summary": "s", "idempotency_key": uuid.uuid4().hex, "parent_scope_id": parent},
    ).json()["scope_id"]
    linked = _post(
        env,
        gateway,
        "/v1/scopes",
        {
            "title": "linked",
            "summary": "s",
            "idempotency_key": uuid.uuid4().hex,
            "external_references": [{"kind": f"gh{tag}", "value": "org/repo"}],
        },
    ).json()["scope_id"]

    async def listed() -> tuple[list[str], list[str], list[str]]:
        client, http = _client(env, gateway, False, Validating())
        async with http:
            children = await client.list_scopes(parent_scope_id=parent, limit=100)
            kinds = await client.list_scopes(external_reference_kind=f"gh{tag}", limit=100)
            none = await client.list_scopes(parent_scope_id="no-such-scope", limit=100)
            await _expect(422, "capability_not_supported", client.list_scopes(query="child", query_field="title"))
        return (
            [s.scope_id for s in children.items],
            [s.scope_id for s in kinds.items],
            [s.scope_id for s in none.items],
        )

    children, kinds, none = asyncio.run(listed())
    assert children == [child] and kinds == [linked] and none == []
    for query in ("binding_kind=x", "binding_integration=x"):
        r = _get(env, gateway, f"/v1/scopes?{query}")
        assert r.status_code == 422 and r.json()["error"]["code"] == "capability_not_supported", r.text


def test_artifact_listing_refuses_tags_and_search_refuses_what_it_does_not_serve(
    gw: tuple[Env, GatewayThread],
) -> None:
    """Tags on a listing, and search's fusion, admission and rerank options, are refused
    (422) as tags are elsewhere, never dropped; `fts` is not one of 1.4.1's search modes."""
    env, gateway = gw
    sid = _scope(env, gateway)
    _memory(env, gateway, sid, "the deploy runs on fridays")
    r = _get(env, gateway, f"/v1/scopes/{sid}/artifacts/atomic-memory?tag=team")
    assert r.status_code == 422 and r.json()["error"]["code"] == "capability_not_supported", r.text
    r = _get(env, gateway, f"/v1/scopes/{sid}/artifacts/atomic-memory?tag_match=any")
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    search = f"/v1/scopes/{sid}/artifacts/atomic-memory/search"
    for extra, code in (
        ({"fusion": {"method": "rrf"}}, "capability_not_supported"),
        ({"admission": {}}, "capability_not_supported"),
        ({"rerank": {"enabled": True}}, "capability_not_supported"),
        ({"mode": "fts"}, "invalid_request"),  # not one of 1.4.1's modes (its schema's error)
    ):
        r = _post(env, gateway, search, {"query": "deploy", **extra})
        assert r.status_code == 422 and r.json()["error"]["code"] == code, (extra, r.text)
    r = _post(env, gateway, search, {"query": "deploy", "mode": "text"})
    assert r.status_code == 200 and len(r.json()["results"]) == 1


def test_a_search_returns_up_to_its_limit_past_a_page(gw: tuple[Env, GatewayThread]) -> None:
    """An experience search takes `limit` up to 200 and returns that many hits (it once
    stopped at 100 without a word)."""
    env, gateway = gw
    sid = _scope(env, gateway)
    for n in range(105):
        content = {"situation": f"deploy case {n}", "action": "a", "outcome": "o", "lesson": "deploy"}
        r = _post(env, gateway, f"/v1/scopes/{sid}/artifacts", {"family": "experience", "content": content})
        assert r.status_code == 201, r.text
    r = _post(env, gateway, f"/v1/scopes/{sid}/artifacts/experience/search", {"query": "deploy", "limit": 150})
    assert r.status_code == 200 and len(r.json()["results"]) == 105, r.text[:300]
