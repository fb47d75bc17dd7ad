"""The context routes against what a reviewer sent them: a scope listing shows only the
caller's scopes, in full pages, behind a cursor that names no scope; only a writer creates
scopes; numbers, cursors and filters a client can spell oddly are refused with 4xx, never a
500 (non-ASCII digits, repeated parameters, a cursor nested thousands deep, integers and
floats RFC 8785 cannot write, a lone surrogate in a search filter)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.context import service
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client

KEYS: dict[str, str] = {}
WRITER_ACTIONS = ["context.write", "context.read", "context.prepare"]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    def principals(env: Env) -> None:
        KEYS["alice"] = env.add_principal("alice", WRITER_ACTIONS, [], ["default"])
        KEYS["bob"] = env.add_principal("bob", WRITER_ACTIONS, [], ["default"])
        KEYS["reader"] = env.add_principal("reader", ["context.read"], [], ["default"])

    with gateways("context-hardening", prepare=principals) as started:
        yield started


def _as(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}


def _scope(http: httpx.Client, who: str) -> str:
    body = {"title": "t", "summary": "s", "idempotency_key": str(uuid.uuid4())}
    made = http.post("/v1/scopes", json=body, headers=_as(who))
    assert made.status_code == 201, made.text
    return str(made.json()["scope_id"])


def _pages(http: httpx.Client, who: str, limit: int) -> tuple[list[list[str]], list[str]]:
    pages: list[list[str]] = []
    cursors: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    while True:
        page = http.get("/v1/scopes", params=params, headers=_as(who))
        assert page.status_code == 200, page.text
        pages.append([item["scope_id"] for item in page.json()["items"]])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return pages, cursors
        cursors.append(cursor)
        params = {"limit": limit, "cursor": cursor}
        assert len(pages) < 100


def _names_any(cursor: str, ids: list[str]) -> bool:
    decoded = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    return any(i in cursor or i.encode() in decoded for i in ids)


def test_a_listing_shows_only_the_callers_scopes_and_names_no_other(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    theirs = [_scope(http, "alice") for _ in range(5)]
    mine = _scope(http, "bob")
    pages, cursors = _pages(http, "bob", 1)
    seen = [sid for page in pages for sid in page]
    assert mine in seen and not set(theirs) & set(seen)
    assert all(len(page) == 1 for page in pages[:-1])  # full pages: no empty page while more follow
    assert len(seen) == len(set(seen))
    assert cursors and not any(_names_any(c, theirs + [mine, "default"]) for c in cursors)
    every, _ = _pages(http, "alice", 100)
    assert set(theirs) <= set(every[0])
    forged = http.get("/v1/scopes", params={"cursor": cursors[0][:-2] + "AA"}, headers=_as("bob"))
    assert forged.status_code == 400 and forged.json()["error"]["code"] == "invalid_cursor"


def test_a_page_stops_after_its_scan_bound_and_still_names_nothing(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    theirs = [_scope(http, "alice") for _ in range(6)]
    mine = [_scope(http, "bob") for _ in range(2)]
    monkeypatch.setattr(service, "SCOPE_SCAN_BATCH", 2)
    monkeypatch.setattr(service, "SCOPE_SCAN_ROWS", 4)
    pages, cursors = _pages(http, "bob", 100)
    seen = [sid for page in pages for sid in page]
    assert set(mine) <= set(seen) and not set(theirs) & set(seen)
    assert len(pages) > 1  # the bound cut pages short: their cursors point past unseen scopes
    assert not any(_names_any(c, theirs + mine) for c in cursors)


def test_only_a_writer_creates_scopes(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    body = {"title": "t", "summary": "s", "idempotency_key": str(uuid.uuid4())}
    refused = http.post("/v1/scopes", json=body, headers=_as("reader"))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert http.post("/v1/scopes", json=body, headers=_as("alice")).status_code == 201


def test_odd_numbers_and_repeated_parameters_are_refused(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    sid = _scope(http, "alice")
    made = http.post(
        f"/v1/scopes/{sid}/artifacts",
        json={"family": "topic-memory", "content": {"title": "t", "summary": "s", "detail": "d"}},
        headers=_as("alice"),
    )
    assert made.status_code == 201, made.text
    aid = made.json()["artifact_id"]
    listing = f"/v1/scopes/{sid}/artifacts/topic-memory"
    for odd in ("\u00b2", "\u0663", "\uff13", "1\u00b2", "-1", "1.0", "0x1", "0", "101", "9" * 30):
        # 1.4.1: a query parameter off its schema under /v1/scopes/{scope_id}/ is 400, with the error list
        for url in (listing, f"{listing}/{aid}/revisions"):
            refused = http.get(url, params={"limit": odd}, headers=_as("alice"))
            assert refused.status_code == 400, (odd, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "invalid_request" and error["details"]["errors"][0]["loc"] == ["query", "limit"]
        # and 422 on /v1/scopes itself (1.4.1 too)
        assert http.get("/v1/scopes", params={"limit": odd}, headers=_as("alice")).status_code == 422, odd
        revision = http.get(f"{listing}/{aid}/revisions/{odd}", headers=_as("alice"))
        assert revision.status_code in (404, 422), odd  # 404: the router's own pattern refused it
        assert revision.status_code != 200
    assert http.get(f"{listing}?limit=1&limit=2", headers=_as("alice")).status_code == 422
    assert http.get(f"{listing}/{aid}/revisions/1", headers=_as("alice")).status_code == 200
    assert http.get(listing, params={"limit": "1"}, headers=_as("alice")).status_code == 200


def test_a_deeply_nested_cursor_is_an_invalid_cursor(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    sid = _scope(http, "alice")
    deep = base64.urlsafe_b64encode(b"[" * 3000).decode().rstrip("=")
    answers = [
        http.get(f"/v1/scopes/{sid}/artifacts/atomic-memory", params={"cursor": deep}, headers=_as("alice")),
        http.post("/v1/atomic-memory/list", json={"scope_id": sid, "cursor": deep}, headers=_as("alice")),
        http.get("/v1/scopes", params={"cursor": deep}, headers=_as("alice")),
    ]
    for answer in answers:
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_cursor", answer.text


def _forged(kind: str, bind: str, after: str) -> str:
    """A cursor written by hand: `after` is raw JSON (an integer past 64 bits, a lone surrogate)."""
    raw = '["%s",%s,%s]' % (kind, json.dumps(bind), after)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("after", ["1" + "0" * 30, '"\\ud800"', '"' + "x" * 600 + '"', "1.5", "[1]"])
def test_a_forged_cursor_position_is_an_invalid_cursor(gw: tuple[Env, GatewayThread], after: str) -> None:
    """Cursors are plain base64 JSON: a position the store cannot bind (an integer past 64
    bits, a lone surrogate) was a 500; any odd position is an invalid cursor."""
    env, gateway = gw
    http = raw_client(gateway, env)
    sid = _scope(http, "alice")
    listing = f"/v1/scopes/{sid}/artifacts/atomic-memory"
    made = http.post(
        listing.rsplit("/", 1)[0],
        json={"family": "atomic-memory", "content": {"kind": "fact", "text": "x"}},
        headers=_as("alice"),
    )
    aid = made.json()["artifact_id"]
    answers = [
        http.get(listing, params={"cursor": _forged("heads", f"{sid}\x00atomic-memory", after)}, headers=_as("alice")),
        http.get(
            f"{listing}/{aid}/revisions",
            params={"cursor": _forged("revisions", f"{sid}\x00atomic-memory\x00{aid}", after)},
            headers=_as("alice"),
        ),
        http.post(
            "/v1/atomic-memory/list",
            json={"scope_id": sid, "cursor": _forged("atomic", json.dumps([sid, ["active"], None]), after)},
            headers=_as("alice"),
        ),
    ]
    for answer in answers:
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "invalid_cursor", answer.text


@pytest.mark.parametrize("number", ["9007199254740993", "12345678901234567890123", "1e400", "-1e400"])
def test_a_number_canonical_json_cannot_write_is_refused(gw: tuple[Env, GatewayThread], number: str) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    sid = _scope(http, "alice")
    raw = (
        '{"family":"experience","content":{"situation":"a","action":"b","outcome":"c","lesson":"d",'
        '"failure":{"n":%s}}}' % number
    )
    headers = {**_as("alice"), "content-type": "application/json"}
    refused = http.post(f"/v1/scopes/{sid}/artifacts", content=raw.encode(), headers=headers)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "invalid_request", refused.text
    listed = http.get(f"/v1/scopes/{sid}/artifacts/experience", headers=_as("alice"))
    assert listed.status_code == 200 and listed.json()["items"] == []
    fine = raw.replace(number, "1.5")
    assert http.post(f"/v1/scopes/{sid}/artifacts", content=fine.encode(), headers=headers).status_code == 201


def test_a_lone_surrogate_in_a_search_filter_is_refused(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    sid = _scope(http, "alice")
    headers = {**_as("alice"), "content-type": "application/json"}
    path = f"/v1/scopes/{sid}/artifacts/atomic-memory/search"
    for kind in ('"\\ud800"', '"' + "k" * 200 + '"'):
        raw = '{"query":"billing","filters":{"kind":%s}}' % kind
        refused = http.post(path, content=raw.encode(), headers=headers)
        assert refused.status_code == 422, refused.text
    ok = http.post(path, content=b'{"query":"billing","filters":{"kind":"fact"}}', headers=headers)
    assert ok.status_code == 200, ok.text
