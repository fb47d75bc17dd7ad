"""Differential test: one scenario, driven by the official PowerContext 1.4.1 client, run against
wiregate (HTTPS) and against the real PowerContext 1.4.1 server (tests/pcserver.py, its own
venv, default SQLite storage, no inference provider, static bearer auth).

Every response is recorded per step as (status, shape): the recursive key sets and JSON types
of the body, ignoring values such as ids, timestamps, etags and digests, except a few
protocol-enum fields (`KEPT`) whose values are part of the contract. The two recordings must
differ in exactly the steps declared in `DELIBERATE` (on purpose, documented) and
`UNDOCUMENTED` (found here, not yet decided): an undeclared difference fails, and so
does a declared difference that has disappeared.

Skipped when the PowerContext server cannot be installed or started, unless
WIREGATE_REQUIRE_POWERCONTEXT=1 (then it fails).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
from powercontext.client import PowerContextClient, ServerResponseError
from powercontext.client.errors import TransportError
from powercontext.http import (
    CreateArtifactRequest,
    CreateScopeRequest,
    ListArtifactRevisionsRequest,
    ListArtifactsRequest,
    PrepareContextRequest,
    ReplaceArtifactRequest,
    SearchArtifactsRequest,
    SearchMemoryRequest,
)
from powercontext.http._generated import models as am

from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread
from tests.pcserver import PowerContextServer, server_or_skip

# An AWS access key id in credential format (AKIA + 16), not one of the documented examples.
AWS_KEY_ID = "AKIA" + "Q3ZJ7K2M5N8P4R6T"

# step -> (where the two answers differ, why). "where" is what `where()` makes of the
# differences: "status <wiregate>/<powercontext>" when the statuses differ, else the body's
# differing top-level fields (two levels inside "error").

# On purpose (README "Where wiregate differs", or tests/test_context_api.py which pins it).
DELIBERATE: dict[str, tuple[frozenset[str], str]] = {
    "capabilities": (
        frozenset({"prompts", "extraction"}),
        "wiregate serves no prompts and no extraction: `prompts` is {} and `extraction` null in the "
        "same closed 1.4.1 object; PowerContext lists 16 disabled prompts and an extraction status",
    ),
    "write_secret_memory": (
        frozenset({"status 422/201"}),
        "wiregate refuses to store a credential format (an AWS access key id): 422 memory_write_rejected, "
        "reason secret_value; PowerContext stores it",
    ),
    "invalid_body": (
        frozenset({"error.code", "error.details"}),
        "wiregate's 422 validation bodies are always invalid_request with details; PowerContext with auth "
        "on says invalid_access_request with details null",
    ),
    **dict.fromkeys(
        ("unknown_scope", "unknown_scope_artifacts"),
        (
            frozenset({"status 403/404"}),
            "wiregate authorises a scope before it looks it up, so an unknown scope and one the caller "
            "may not read answer alike (403 forbidden): no existence oracle; PowerContext 404 scope_not_found",
        ),
    ),
    "malformed_json": (
        frozenset({"error.details"}),
        "wiregate's 422 details.errors[].loc names fields only; PowerContext's also carries the integer "
        "position of the JSON syntax error",
    ),
    **dict.fromkeys(
        ("search_memory_vector", "search_memory_hybrid", "search_atomic_vector", "search_atomic_hybrid"),
        (
            frozenset({"status 422/500"}),
            "no embeddings configured: wiregate refuses with 422 capability_not_supported; PowerContext "
            "1.4.1 answers 500 internal_error (it logs 503 embedding-profile, then an ASGI exception drops "
            "the connection)",
        ),
    ),
    "list_scopes_by_query": (
        frozenset({"status 422/200"}),
        "wiregate does not serve scope discovery by text query (nor by integration binding): 422 "
        "capability_not_supported names it; PowerContext searches titles. It was once ignored (every scope listed)",
    ),
    "list_memories_by_tag": (
        frozenset({"status 422/200"}),
        "wiregate serves no tags (refused wherever they are given, 422 capability_not_supported); PowerContext "
        "filters by them. A listing once ignored the tag",
    ),
    "search_fusion": (
        frozenset({"error.code", "error.details"}),
        "wiregate serves no fusion, admission or rerank options of artifact search: 422 capability_not_supported "
        "whatever they say; PowerContext validates them (this one's method is not one: 422 invalid_request) and "
        "uses a valid one. They were once accepted and ignored",
    ),
}

# Found by this test, not in the README: each needs a decision (document it as deliberate, or
# change wiregate); until then it is pinned here so it cannot grow or vanish unnoticed.
UNDOCUMENTED: dict[str, tuple[frozenset[str], str]] = {}

# Values kept in the shape because they are protocol enums, not instance data.
KEPT = frozenset({"code", "status", "mode", "state", "family", "schema", "changed", "revision"})


def shape(value: Any, key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: shape(v, k) for k, v in sorted(value.items())}
    if isinstance(value, list):
        seen: list[Any] = []
        for item in value:
            s = shape(item)
            if s not in seen:
                seen.append(s)
        return ["list", sorted(seen, key=json.dumps)]
    if key in KEPT and isinstance(value, str | bool | int) and value is not None:
        return f"{type(value).__name__}={value}"
    return {type(None): "null", bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two shapes differ, as readable paths (for failure messages and the report)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in b:
                out.append(f"{path}.{k}: only wiregate")
            elif k not in a:
                out.append(f"{path}.{k}: only powercontext")
            else:
                out.extend(differences(a[k], b[k], f"{path}.{k}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out.extend(differences(x, y, f"{path}[{i}]"))
        return out
    return [] if a == b else [f"{path}: wiregate {json.dumps(a)[:200]} != powercontext {json.dumps(b)[:200]}"]


def where(ours: list[Any], theirs: list[Any]) -> frozenset[str]:
    """A step's difference in brief: the statuses if they differ, else the differing fields."""
    statuses = [r[0] for r in ours], [r[0] for r in theirs]
    if statuses[0] != statuses[1]:
        return frozenset({f"status {'/'.join(str(s) for s in statuses[0] + statuses[1])}"})
    out = set()
    for line in differences(ours, theirs):
        fields = [f.split("[")[0] for f in line.split(":", 1)[0].split("].", 1)[-1].split(".")]
        out.add(".".join(fields[:2]) if fields[0] == "error" else fields[0])
    return frozenset(out)


class Recorder:
    """httpx response hook: every response of the current step, as (status, shape)."""

    def __init__(self) -> None:
        self.step = "setup"
        self.steps: dict[str, list[Any]] = {}

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        try:
            body = shape(response.json()) if response.content else None
        except ValueError:
            body = "non-json"
        self.steps.setdefault(self.step, []).append([response.status_code, body])

    async def run(self, step: str, call: Callable[[], Awaitable[Any]]) -> Any:
        assert step not in self.steps, f"duplicate step {step}"
        self.step = step
        try:
            return await call()
        except ServerResponseError:
            return None
        except (TransportError, httpx.TransportError) as exc:  # the server dropped the connection
            self.steps.setdefault(step, []).append(["no response", type(exc).__name__])
            return None
        finally:
            self.steps.setdefault(step, [])
            self.step = "between-steps"


def _atomic(kind: str, text: str) -> CreateArtifactRequest:
    return CreateArtifactRequest.model_validate({"family": "atomic-memory", "content": {"kind": kind, "text": text}})


async def scenario(base: str, token: str, verify: ssl.SSLContext | bool) -> dict[str, Any]:
    rec = Recorder()

    def connect() -> tuple[PowerContextClient, httpx.AsyncClient]:
        http = httpx.AsyncClient(verify=verify, timeout=30, event_hooks={"response": [rec.on_response]})
        return PowerContextClient(base, token=token, http_client=http), http

    client, http = connect()
    try:
        return await _steps(rec, client, http, connect, base, token)
    finally:
        await http.aclose()


async def _alone(
    connect: Callable[[], tuple[PowerContextClient, httpx.AsyncClient]],
    call: Callable[[PowerContextClient], Awaitable[Any]],
) -> Any:
    """One request on its own connection: a server that drops the connection after an error
    (PowerContext after a 500) must not turn the next step into a transport error."""
    client, http = connect()
    try:
        return await call(client)
    finally:
        await http.aclose()


async def _steps(
    rec: Recorder,
    client: PowerContextClient,
    http: httpx.AsyncClient,
    connect: Callable[[], tuple[PowerContextClient, httpx.AsyncClient]],
    base: str,
    token: str,
) -> dict[str, Any]:
    auth = {"authorization": f"Bearer {token}"}
    run = rec.run

    await run("capabilities", client.get_capabilities)
    scope = await run(
        "create_scope",
        lambda: client.create_scope(
            CreateScopeRequest(title="billing", summary="billing team memories", idempotency_key=uuid.uuid4().hex)
        ),
    )
    sid = scope.scope_id
    await run("get_scope", lambda: client.get_scope(sid))
    await run("list_scopes", client.list_scopes)

    texts = [
        ("decision", "We use PostgreSQL 16 for the billing service database."),
        ("constraint", "Never deploy billing to production on Fridays after 15:00 UTC."),
        ("fact", "The billing staging cluster runs in region eu-west-1."),
        ("preference", "The billing team prefers pytest over unittest."),
    ]
    ids = []
    for n, (kind, text) in enumerate(texts):
        created = await run(f"write_memory_{n}", lambda k=kind, t=text: client.create_artifact(sid, _atomic(k, t)))
        ids.append(created.artifact_id)
    await run(
        "write_secret_memory",
        lambda: client.create_artifact(sid, _atomic("fact", f"The upload key id is {AWS_KEY_ID} for billing.")),
    )

    head = await run("get_memory", lambda: client.get_artifact(sid, "atomic-memory", ids[0]))
    etag = f'"revision:{head.revision}"'
    await run("get_memory_not_modified", lambda: client.get_artifact(sid, "atomic-memory", ids[0], if_none_match=etag))
    body = {"content": {"kind": "decision", "text": "We use PostgreSQL 17 for the billing service database."}}
    await run(
        "replace_if_match",
        lambda: client.replace_artifact(
            sid, "atomic-memory", ids[0], ReplaceArtifactRequest.model_validate(body), expected_etag=etag
        ),
    )
    stale = {"content": {"kind": "decision", "text": "a lost update"}}
    await run(
        "replace_stale_if_match",
        lambda: client.replace_artifact(
            sid, "atomic-memory", ids[0], ReplaceArtifactRequest.model_validate(stale), expected_etag=etag
        ),
    )
    await run("list_memories", lambda: client.list_artifacts(sid, "atomic-memory", ListArtifactsRequest(limit=10)))
    await run(
        "list_revisions",
        lambda: client.list_artifact_revisions(sid, "atomic-memory", ids[0], ListArtifactRevisionsRequest()),
    )
    await run("read_revision_1", lambda: client.get_artifact_revision(sid, "atomic-memory", ids[0], 1))

    query = "PostgreSQL billing database"
    for mode in ("auto", "fts", "vector", "hybrid"):
        await run(
            f"search_memory_{mode}",
            lambda m=mode: _alone(
                connect, lambda c: c.search_memory(SearchMemoryRequest(scope_id=sid, query=query, mode=m))
            ),
        )
    for mode in ("text", "vector", "hybrid"):
        await run(
            f"search_atomic_{mode}",
            lambda m=mode: _alone(
                connect,
                lambda c: c.search_atomic_memory(am.SearchAtomicMemoryRequest(scope_id=sid, query=query, mode=m)),
            ),
        )
    await run(
        "search_artifacts",
        lambda: client.search_artifacts(sid, "atomic-memory", SearchArtifactsRequest(query=query, include_scores=True)),
    )
    await run(
        "prepare",
        lambda: client.prepare_context(PrepareContextRequest(scope_id=sid, query="Which database does billing use?")),
    )
    await run(
        "prepare_empty",
        lambda: client.prepare_context(PrepareContextRequest(scope_id=sid, query="kubernetes autoscaling")),
    )

    state = await run("memory_state", lambda: client.get_atomic_memory_state(sid, ids[2]))
    target = am.AtomicMemoryInput(artifact=state.artifact, state_version=state.state_version)
    forget = am.AtomicMemoryLifecycleRequest(scope_id=sid, state="forgotten", target=target)
    await run("forget", lambda: client.change_atomic_memory_lifecycle(forget))
    await run("forget_again_stale", lambda: client.change_atomic_memory_lifecycle(forget))
    await run("memory_state_forgotten", lambda: client.get_atomic_memory_state(sid, ids[2]))
    await run("read_forgotten_revision", lambda: client.get_artifact_revision(sid, "atomic-memory", ids[2], 1))
    await run(
        "prepare_after_forget",
        lambda: client.prepare_context(PrepareContextRequest(scope_id=sid, query="staging cluster region")),
    )
    s1 = await run("memory_state_1", lambda: client.get_atomic_memory_state(sid, ids[1]))
    s3 = await run("memory_state_3", lambda: client.get_atomic_memory_state(sid, ids[3]))
    merge = am.MergeAtomicMemoryRequest(
        scope_id=sid,
        inputs=[
            am.AtomicMemoryInput(artifact=s1.artifact, state_version=s1.state_version),
            am.AtomicMemoryInput(artifact=s3.artifact, state_version=s3.state_version),
        ],
        content=am.AtomicMemoryWriteContent(kind="fact", text="Billing: no Friday deploys; pytest preferred."),
    )
    await run("merge", lambda: client.merge_atomic_memories(merge))
    everything = am.ListAtomicMemoryRequest(scope_id=sid, states=["active", "forgotten", "merged"])
    await run("list_atomic_all_states", lambda: client.list_atomic_memories(everything))
    await run("list_atomic_active", lambda: client.list_atomic_memories(am.ListAtomicMemoryRequest(scope_id=sid)))

    # scope discovery, listing and search options
    await run(
        "create_child_scope",
        lambda: client.create_scope(
            CreateScopeRequest(
                title="child", summary="a child scope", idempotency_key=uuid.uuid4().hex, parent_scope_id=sid
            )
        ),
    )
    await run("list_scopes_by_parent", lambda: client.list_scopes(parent_scope_id=sid))
    await run("list_scopes_by_unknown_parent", lambda: client.list_scopes(parent_scope_id="scp_" + "0" * 26))
    await run("list_scopes_by_reference_kind", lambda: client.list_scopes(external_reference_kind="github"))
    await run("list_scopes_by_query", lambda: client.list_scopes("billing", query_field="title"))
    await run(
        "list_memories_by_tag",
        lambda: http.get(f"{base}/v1/scopes/{sid}/artifacts/atomic-memory?tag=team", headers=auth),
    )
    search = f"{base}/v1/scopes/{sid}/artifacts/atomic-memory/search"
    await run(
        "search_fusion",
        lambda: http.post(search, json={"query": "billing", "fusion": {"method": "nope"}}, headers=auth),
    )
    await run("search_mode_fts", lambda: http.post(search, json={"query": "billing", "mode": "fts"}, headers=auth))

    # error cases
    await run("unknown_scope", lambda: client.get_scope("scp_" + "0" * 26))
    await run(
        "unknown_scope_artifacts",
        lambda: client.list_artifacts("scp_" + "0" * 26, "atomic-memory", ListArtifactsRequest(limit=10)),
    )
    await run("unknown_memory", lambda: client.get_artifact(sid, "atomic-memory", "art_" + "0" * 26))
    missing_text = {"family": "atomic-memory", "content": {"kind": "fact"}}
    await run("invalid_body", lambda: http.post(f"{base}/v1/scopes/{sid}/artifacts", json=missing_text, headers=auth))
    await run(
        "malformed_json",
        lambda: http.post(
            f"{base}/v1/scopes/{sid}/artifacts",
            content=b"{not json",
            headers={**auth, "content-type": "application/json"},
        ),
    )
    await run("missing_auth", lambda: http.get(f"{base}/v1/scopes"))
    await run("wrong_auth", lambda: http.get(f"{base}/v1/scopes", headers={"authorization": "Bearer wrong"}))
    return rec.steps


def _record(base: str, token: str, verify: ssl.SSLContext | bool) -> dict[str, Any]:
    return asyncio.run(scenario(base, token, verify))


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("context-differential") as started:
        yield started


@pytest.fixture(scope="module")
def pc() -> Iterator[PowerContextServer]:
    with server_or_skip() as server:
        yield server


def test_wiregate_and_powercontext_differ_only_where_declared(
    gw: tuple[Env, GatewayThread], pc: PowerContextServer
) -> None:
    env, gateway = gw
    ours = _record(gateway.https_url, env.gateway_key, ssl.create_default_context(cafile=str(env.ca)))
    theirs = _record(pc.base_url, pc.token, False)
    assert list(ours) == list(theirs)
    differing = {step: differences(ours[step], theirs[step]) for step in ours if ours[step] != theirs[step]}
    report = "\n".join(f"{step}:\n  " + "\n  ".join(lines) for step, lines in differing.items())
    declared = DELIBERATE | UNDOCUMENTED
    assert not set(DELIBERATE) & set(UNDOCUMENTED)
    assert set(differing) == set(declared), f"undeclared or vanished differences:\n{report}"
    found = {step: where(ours[step], theirs[step]) for step in differing}
    assert found == {step: spot for step, (spot, _) in declared.items()}, f"differences moved:\n{report}"
    # the scenario did what it says on the reference server (and so, where equal, on wiregate)
    statuses = {step: [r[0] for r in responses] for step, responses in theirs.items()}
    assert statuses["get_memory_not_modified"] == [304] and statuses["replace_stale_if_match"] == [412]
    assert statuses["forget_again_stale"] == [409] and statuses["read_forgotten_revision"] == [200]
    assert statuses["unknown_memory"] == [404] and statuses["missing_auth"] == [401]
    assert all(statuses[f"search_memory_{m}"] == [200] for m in ("auto", "fts"))
    assert statuses["prepare"] == statuses["prepare_after_forget"] == [200]
    assert ours["write_secret_memory"][0][0] == 422 and theirs["write_secret_memory"][0][0] == 201


# Two rows of five query terms: "ranka rankb" (two rare terms) and "rankc rankd ranke" (three terms
# that ten other rows each hold one of), among 100 rows holding none. BM25 over the OR of the terms,
# each counted once, ranks the two-term row first; counting each term once per matching pair (the
# floor "2 of 5" as a MATCH of pairs) would put the three-term row first.
RANK_ROWS = (
    ["ranka rankb", "rankc rankd ranke"]
    + [f"{term} filler{i}" for term in ("rankc", "rankd", "ranke") for i in range(10)]
    + [f"unrelated{i}" for i in range(100)]
)


async def _ranked(base: str, token: str, verify: ssl.SSLContext | bool) -> list[str]:
    auth = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base, verify=verify, headers=auth, timeout=60) as http:
        body = {"title": "ranking", "summary": "bm25", "idempotency_key": uuid.uuid4().hex}
        created = await http.post("/v1/scopes", json=body)
        assert created.status_code == 201, created.status_code
        sid = created.json()["scope_id"]
        gate = asyncio.Semaphore(8)

        async def write(text: str) -> None:
            async with gate:
                memory = {"family": "atomic-memory", "content": {"kind": "fact", "text": text}}
                r = await http.post(f"/v1/scopes/{sid}/artifacts", json=memory)
                assert r.status_code == 201, r.status_code

        await asyncio.gather(*(write(text) for text in RANK_ROWS))
        query = {"scope_id": sid, "query": "ranka rankb rankc rankd ranke", "mode": "fts", "limit": 10}
        found = await http.post("/v1/memory/search", json=query)
        assert found.status_code == 200, found.status_code
        return [hit["memory"]["text"] for hit in found.json()["hits"]]


def test_fts_ranking_is_powercontexts_each_term_counted_once(
    gw: tuple[Env, GatewayThread], pc: PowerContextServer
) -> None:
    env, gateway = gw
    theirs = asyncio.run(_ranked(pc.base_url, pc.token, False))
    ours = asyncio.run(_ranked(gateway.https_url, env.gateway_key, ssl.create_default_context(cafile=str(env.ca))))
    assert theirs == ["ranka rankb", "rankc rankd ranke"]  # the lexical floor (2 of 5) admits only these
    assert ours == theirs
