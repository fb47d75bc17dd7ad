"""What the context routes take in, on both stores alike: a NUL (U+0000) in text that would be
stored or looked up by is refused 422 (PostgreSQL text cannot hold one: it was a 500 there,
a 201/200 on SQLite); an artifact id in a path that no artifact can have (a NUL, a space,
non-ASCII) is 404 before any store call; a cursor a client wrote with a NUL in it pages as
on SQLite. A scope record is bounded: at most 256 context and 256 external references, and
at most 256 KiB of text in all.

Every case runs against a gateway on SQLite and one on PostgreSQL and expects one status,
so both answer the same (and never 500)."""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from gateway.context import errors
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.conftest import GatewayFactory
from tests.context.conftest import PG_DSN, drop_schema, require_pg
from tests.harness import Env, raw_client

NUL = "a\x00b"
REFERENCES_MAX = 256
SCOPE_TEXT_MAX_BYTES = 256 * 1024


@dataclass
class Gateway:
    backend: str
    env: Env
    http: httpx2.Client
    scope_id: str
    artifact_id: str

    def headers(self, **extra: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.env.gateway_key}", "content-type": "application/json", **extra}

    def send(self, method: str, path: str, body: Any = None, **extra: str) -> httpx2.Response:
        path = path.format(sid=self.scope_id, aid=self.artifact_id)
        content = None if body is None else json.dumps(body).encode()  # json.dumps writes U+0000 as \u0000
        return self.http.request(method, path, content=content, headers=self.headers(**extra), timeout=60)

    def scope(self, **fields: Any) -> httpx2.Response:
        body = {"title": "t", "summary": "s", "idempotency_key": str(uuid.uuid4()), **fields}
        return self.send("POST", "/v1/scopes", body)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def gw(request: pytest.FixtureRequest, gateways: GatewayFactory) -> Iterator[Gateway]:
    backend = request.param
    schema = f"wgt_bounds_{secrets.token_hex(4)}"
    extra = ""
    saved = os.environ.get("WIREGATE_STORE_DSN")
    if backend == "postgres":
        require_pg()
        os.environ["WIREGATE_STORE_DSN"] = PG_DSN
        extra = f'\n[store]\nbackend = "postgres"\ndsn = "env:WIREGATE_STORE_DSN"\npg_schema = "{schema}"\n'
    try:
        with gateways(f"input-bounds-{backend}", config_extra=extra) as (env, gateway):
            http = raw_client(gateway, env)
            made = Gateway(backend, env, http, "", "")
            scope = made.scope()
            assert scope.status_code == 201, scope.text
            made.scope_id = scope.json()["scope_id"]
            memory = made.send("POST", "/v1/scopes/{sid}/artifacts", {"family": "atomic-memory", "content": ATOMIC})
            assert memory.status_code == 201, memory.text
            made.artifact_id = memory.json()["artifact_id"]
            yield made
            http.close()
    finally:
        if backend == "postgres":
            if saved is None:
                os.environ.pop("WIREGATE_STORE_DSN", None)
            else:
                os.environ["WIREGATE_STORE_DSN"] = saved
            drop_schema(schema)


ATOMIC = {"kind": "fact", "text": "billing runs on postgres"}
TOPIC = {"title": "t", "summary": "s", "detail": "d"}
EXPERIENCE = {"situation": "s", "action": "a", "outcome": "o", "lesson": "l"}
INPUT = {"artifact": {"family": "atomic-memory", "artifact_id": "art_x", "revision": 1}, "state_version": 0}
ART = "/v1/scopes/{sid}/artifacts"


def _atomic(**over: Any) -> dict[str, Any]:
    return {"family": "atomic-memory", "content": {**ATOMIC, **over}}


# (case id, method, path, body, extra headers, status, error code)
NUL_CASES: list[tuple[str, str, str, Any, dict[str, str], int, str | None]] = [
    # the reviewer's eight
    ("artifact-path", "GET", ART + "/atomic-memory/a%00b", None, {}, 404, "artifact_not_found"),
    ("revisions-path", "GET", ART + "/atomic-memory/a%00b/revisions", None, {}, 404, "artifact_not_found"),
    ("revision-path", "GET", ART + "/atomic-memory/a%00b/revisions/1", None, {}, 404, "artifact_not_found"),
    ("state-path", "GET", ART + "/atomic-memory/a%00b/state", None, {}, 404, "artifact_not_found"),
    ("list-kind", "POST", "/v1/atomic-memory/list", {"scope_id": "{sid}", "kind": NUL}, {}, 422, "invalid_request"),
    ("memory-text", "POST", ART, _atomic(text="billing " + NUL), {}, 422, "invalid_request"),
    ("memory-kind", "POST", ART, _atomic(kind=NUL), {}, 422, "invalid_request"),
    ("scope-title", "POST", "/v1/scopes", {"title": NUL}, {}, 422, "invalid_request"),
    # the rest of what is stored or filtered by
    ("scope-summary", "POST", "/v1/scopes", {"summary": NUL}, {}, 422, "invalid_request"),
    ("scope-idempotency-key", "POST", "/v1/scopes", {"idempotency_key": NUL}, {}, 422, "invalid_request"),
    (
        "scope-external-reference",
        "POST",
        "/v1/scopes",
        {"external_references": [{"kind": "k", "value": NUL}]},
        {},
        422,
        "invalid_request",
    ),
    ("scope-parent", "POST", "/v1/scopes", {"parent_scope_id": NUL}, {}, 403, "forbidden"),
    ("scope-reference", "POST", "/v1/scopes", {"context_references": [NUL]}, {}, 403, "forbidden"),
    ("topic-detail", "POST", ART, {"family": "topic-memory", "content": {**TOPIC, "detail": NUL}}, {}, 422, None),
    (
        "experience-lesson",
        "POST",
        ART,
        {"family": "experience", "content": {**EXPERIENCE, "lesson": NUL}},
        {},
        422,
        None,
    ),
    (
        "experience-failure",
        "POST",
        ART,
        {"family": "experience", "content": {**EXPERIENCE, "failure": {NUL: [NUL]}}},
        {},
        422,
        None,
    ),
    ("profile", "POST", ART, {"family": "profile", "content": {"content": NUL}}, {}, 422, "invalid_request"),
    (
        "replace-reason",
        "PUT",
        ART + "/atomic-memory/{aid}",
        {"content": ATOMIC, "reason": NUL},
        {"If-Match": '"revision:1"'},
        422,
        "invalid_request",
    ),
    (
        "replace-text",
        "PUT",
        ART + "/atomic-memory/{aid}",
        {"content": {**ATOMIC, "text": NUL}},
        {"If-Match": '"revision:1"'},
        422,
        "invalid_request",
    ),
    (
        "replace-path",
        "PUT",
        ART + "/atomic-memory/a%00b",
        {"content": ATOMIC},
        {"If-Match": '"revision:1"'},
        404,
        "artifact_not_found",
    ),
    (
        "search-kind",
        "POST",
        "/v1/atomic-memory/search",
        {"scope_id": "{sid}", "query": "billing", "kind": NUL},
        {},
        422,
        "invalid_request",
    ),
    (
        "search-filter-kind",
        "POST",
        ART + "/atomic-memory/search",
        {"query": "billing", "filters": {"kind": NUL}},
        {},
        422,
        "invalid_request",
    ),
    ("remember-text", "POST", "/v1/memory/remember", {"scope_id": "{sid}", "kind": "fact", "text": NUL}, {}, 422, None),
    ("remember-kind", "POST", "/v1/memory/remember", {"scope_id": "{sid}", "kind": NUL, "text": "x"}, {}, 422, None),
    (
        "merge-text",
        "POST",
        "/v1/atomic-memory/merges",
        {"scope_id": "{sid}", "inputs": [INPUT, INPUT], "content": {"kind": "fact", "text": NUL}},
        {},
        422,
        "invalid_request",
    ),
    # path ids no artifact can have, whatever the reason
    ("artifact-path-space", "GET", ART + "/atomic-memory/a%20b", None, {}, 404, "artifact_not_found"),
    ("artifact-path-non-ascii", "GET", ART + "/topic-memory/%C3%A9", None, {}, 404, "artifact_not_found"),
    ("state-path-control", "GET", ART + "/atomic-memory/a%01b/state", None, {}, 404, "artifact_not_found"),
    # an unserved family is still refused as such first
    ("family-before-id", "GET", ART + "/handoff/a%00b", None, {}, 422, "invalid_request"),
    # a query is only tokenised, never bound: accepted on both
    (
        "search-query",
        "POST",
        "/v1/atomic-memory/search",
        {"scope_id": "{sid}", "query": "billing " + NUL},
        {},
        200,
        None,
    ),
    ("prepare-query", "POST", "/v1/context/prepare", {"scope_id": "{sid}", "query": "billing " + NUL}, {}, 200, None),
]


def _fill(body: Any, sid: str) -> Any:
    if isinstance(body, dict):
        return {k: _fill(v, sid) for k, v in body.items()}
    if isinstance(body, list):
        return [_fill(v, sid) for v in body]
    return sid if body == "{sid}" else body


@pytest.mark.parametrize(
    "method,path,body,extra,status,code", [c[1:] for c in NUL_CASES], ids=[c[0] for c in NUL_CASES]
)
def test_nul_is_answered_alike_and_never_500(
    gw: Gateway, method: str, path: str, body: Any, extra: dict[str, str], status: int, code: str | None
) -> None:
    if path == "/v1/scopes" and method == "POST":
        r = gw.scope(**body)
    else:
        r = gw.send(method, path, _fill(body, gw.scope_id), **extra)
    assert r.status_code == status, (gw.backend, r.status_code, r.text)
    if status >= 400:
        error = r.json()["error"]
        if code is not None:
            assert error["code"] == code, error
        assert set(error) == {"code", "message", "details"}  # 1.4.1's error envelope
        assert "\\u0000" not in r.text and "a\x00b" not in r.text  # never echoed


def test_nul_refusal_names_the_field_not_the_value(gw: Gateway) -> None:
    r = gw.scope(title=NUL)
    assert r.status_code == 422
    assert r.json()["error"]["details"] == {
        "errors": [{"type": "string_nul", "loc": ["body", "title"], "msg": "String contains a NUL character"}]
    }
    r = gw.send("POST", "/v1/atomic-memory/list", {"scope_id": gw.scope_id, "kind": NUL})
    assert r.json()["error"]["details"]["errors"][0]["loc"] == ["body", "kind"]


def test_a_client_written_cursor_holding_a_nul_pages_alike(gw: Gateway) -> None:
    """Cursors are plain base64 JSON a client can write: a position holding a NUL lists what
    follows it (on PostgreSQL too, which cannot bind one)."""
    heads = ContextService._cursor("heads", f"{gw.scope_id}\x00atomic-memory", NUL)
    r = gw.send("GET", ART + f"/atomic-memory?cursor={heads}")
    assert r.status_code == 200, (gw.backend, r.text)
    assert [i["artifact_id"] for i in r.json()["items"]] == [gw.artifact_id]  # "art_…" > "a\x00b"
    bind = json.dumps([gw.scope_id, ["active"], None])
    atomic = ContextService._cursor("atomic", bind, "zz\x00")
    r = gw.send("POST", "/v1/atomic-memory/list", {"scope_id": gw.scope_id, "cursor": atomic})
    assert r.status_code == 200, (gw.backend, r.text)
    assert r.json()["items"] == []  # "art_…" < "zz"


# --- scope record bounds -----------------------------------------------------------------------


def _external(n: int, size: int = 8) -> list[dict[str, str]]:
    return [{"kind": "k", "value": f"{i:06d}".ljust(size, "v")} for i in range(n)]


def _too_long(r: httpx2.Response, field: str) -> None:
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["details"]["errors"] == [
        {"type": "too_long", "loc": ["body", field], "msg": "List too long"}
    ]


@pytest.mark.parametrize("revision", [2**53, 2**53 + 1, 2**63, 0])
def test_a_profile_restored_from_revision_past_what_the_digest_writes_is_refused(gw: Gateway, revision: int) -> None:
    """The content digest is RFC 8785, which writes integers up to 2^53 - 1: a larger
    `restored_from_revision` is refused 422 on create and on replace (it was a 500)."""
    scope = gw.scope()  # a scope holds one profile
    assert scope.status_code == 201, scope.text
    artifacts = f"/v1/scopes/{scope.json()['scope_id']}/artifacts"
    body = {"family": "profile", "content": {"content": "hello", "restored_from_revision": revision}}
    r = gw.send("POST", artifacts, body)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    largest = {"family": "profile", "content": {"content": "hello", "restored_from_revision": 2**53 - 1}}
    made = gw.send("POST", artifacts, largest)
    assert made.status_code == 201, made.text
    replace = {"content": {"content": "hi", "restored_from_revision": revision}, "reason": "r"}
    r = gw.send(
        "PUT", f"{artifacts}/profile/{made.json()['artifact_id']}", replace, **{"if-match": made.headers["etag"]}
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text


def test_external_references_are_bounded(gw: Gateway) -> None:
    r = gw.scope(external_references=_external(REFERENCES_MAX))
    assert r.status_code == 201, r.text[:300]
    assert len(r.json()["external_references"]) == REFERENCES_MAX
    _too_long(gw.scope(external_references=_external(REFERENCES_MAX + 1)), "external_references")


def test_context_references_are_bounded(gw: Gateway) -> None:
    refs = []
    for _ in range(REFERENCES_MAX):
        made = gw.scope()
        assert made.status_code == 201, made.text
        refs.append(made.json()["scope_id"])
    r = gw.scope(context_references=refs)
    assert r.status_code == 201, r.text[:300]
    assert r.json()["context_references"] == refs
    _too_long(gw.scope(context_references=[*refs, gw.scope_id]), "context_references")


def _at_text_size(total: int) -> dict[str, Any]:
    """Scope fields whose text (title, summary, key, every reference's kind and value) is
    `total` UTF-8 bytes, carried by 256 external references of at most 2000 characters."""
    key = str(uuid.uuid4())
    left = total - len("t") - len("s") - len(key) - REFERENCES_MAX * len("k")
    size, extra = divmod(left, REFERENCES_MAX)
    assert size + 1 <= 2000
    refs = [{"kind": "k", "value": f"{i:06d}".ljust(size + (i < extra), "v")} for i in range(REFERENCES_MAX)]
    return {"title": "t", "summary": "s", "idempotency_key": key, "external_references": refs}


def test_scope_text_is_bounded_in_bytes(gw: Gateway) -> None:
    at = _at_text_size(SCOPE_TEXT_MAX_BYTES)
    r = gw.send("POST", "/v1/scopes", at)
    assert r.status_code == 201, r.text[:300]
    over = _at_text_size(SCOPE_TEXT_MAX_BYTES + 1)
    r = gw.send("POST", "/v1/scopes", over)
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["details"]["errors"] == [
        {"type": "scope_too_large", "loc": ["body"], "msg": "Scope text too large"}
    ]
    # multi-byte text counts its bytes: 256 refs of 1000 "é" (2 bytes each) are over
    r = gw.scope(external_references=[{"kind": "k", "value": f"{i:04d}" + "é" * 996} for i in range(256)])
    assert r.status_code == 422, r.text[:300]


# --- the service and stores below the API ------------------------------------------------------


@pytest.mark.asyncio
async def test_store_lookups_by_a_nul_key_find_nothing_on_both(service: ContextService, store: ContextStore) -> None:
    """What the API never lets through, a store still answers as SQLite does (nothing found),
    never with PostgreSQL's DataError: ids, a kind filter, a position in a cursor."""
    scope, _ = await service.create_scope(title="t", summary="s", idempotency_key="k", principal=None)
    sid = scope.scope_id
    made = await service.create_artifact(sid, "atomic-memory", ATOMIC)
    for lookup in (
        service.get_artifact(sid, "atomic-memory", NUL),
        service.get_artifact_revision(sid, "atomic-memory", NUL, 1),
        service.list_artifact_revisions(sid, "atomic-memory", NUL),
        service.get_atomic_state(sid, NUL),
        service.replace_artifact(sid, "atomic-memory", NUL, ATOMIC, if_match='"revision:1"'),
    ):
        with pytest.raises(errors.ArtifactNotFound):
            await lookup
    assert (await service.list_atomic_memories(sid, kind=NUL)).items == ()
    assert (await service.search(sid, "atomic-memory", "billing", mode="fts", kind=NUL)).hits == ()
    assert await store.search_text(sid, "atomic-memory", ["billing"], 10, kind=NUL) == []
    assert await store.search_vector(sid, "atomic-memory", [1.0, 0.0], 10, -1.0, kind=NUL) == []
    assert await store.get_states(sid, [NUL]) == {}
    heads = ContextService._cursor("heads", f"{sid}\x00atomic-memory", NUL)
    assert [r.artifact_id for r in (await service.list_artifacts(sid, "atomic-memory", cursor=heads)).items] == [
        made.artifact_id
    ]
    scopes = ContextService._cursor("scopes", "", "scp\x00")
    assert "default" not in [s.scope_id for s in (await service.list_scopes(cursor=scopes, limit=100)).items]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "family,content",
    [
        ("atomic-memory", {"kind": NUL, "text": "x"}),
        ("atomic-memory", {"kind": "fact", "text": NUL}),
        ("topic-memory", {**TOPIC, "title": NUL}),
        ("experience", {**EXPERIENCE, "action": NUL}),
        ("experience", {**EXPERIENCE, "failure": {"k": {"n": [NUL]}}}),
        ("profile", {"content": NUL}),
    ],
)
async def test_content_holding_a_nul_is_refused_on_both(service: ContextService, family: str, content: Any) -> None:
    with pytest.raises(errors.InvalidRequest):
        await service.create_artifact("default", family, content)
