"""The /ui/ pages without a browser: the packaged files carry no inline script or style and
load nothing from elsewhere; sessions are short-lived and bounded; sign-in, CSRF and the
observe action are enforced by the routes themselves."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import devsetup
from gateway.api.ui import SECURITY_HEADERS, STATIC_DIR
from gateway.context.store.database import open_database
from gateway.ledgers.ui_sessions import UI_SESSION_MIGRATIONS, StoredUiSessions
from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, raw_client, raw_socket, read_until_closed, sensitive


def test_the_pages_have_no_inline_script_or_style_and_no_foreign_asset() -> None:
    pages = sorted(STATIC_DIR.glob("*.html"))
    assert {p.name for p in pages} == {"login.html", "context.html", "usage.html", "decisions.html"}
    for page in pages:
        html = page.read_text()
        for tag in re.findall(r"<script[^>]*>", html):
            assert 'src="/ui/' in tag, (page.name, tag)
        assert re.search(r"<script[^>]*>(?!</script>)", html) is None  # nothing between the tags
        assert re.search(r"\son[a-z]+\s*=", html) is None  # no inline event handler
        assert " style=" not in html and "<style" not in html
        assert re.search(r'(src|href)="(?!/ui/)', html) is None  # every asset and link is the gateway's own
    script = (STATIC_DIR / "app.js").read_text()
    assert "innerHTML" not in script and "eval(" not in script and "http" not in script.replace("https_url", "")
    assert "@import" not in (STATIC_DIR / "app.css").read_text() and "url(" not in (STATIC_DIR / "app.css").read_text()


def test_the_key_field_can_never_be_submitted_without_the_script() -> None:
    """Submitted before app.js takes over (or with it broken), a form would put a named
    field in a URL: the key field has no name and the button starts disabled."""
    html = (STATIC_DIR / "login.html").read_text()
    form = re.search(r"<form[^>]*>.*?</form>", html, re.S)
    assert form is not None
    assert re.search(r"\sname=", form.group(0)) is None
    assert re.search(r'<button[^>]*type="submit"[^>]*\sdisabled[\s>]', form.group(0))
    assert 'method="post"' in form.group(0)  # never GET, whatever submits it
    assert 'getElementById("sign-in").disabled = false' in (STATIC_DIR / "app.js").read_text()


async def _sessions(tmp_path: Path, **bounds: float) -> tuple[Any, StoredUiSessions]:
    db = await open_database("sqlite", path=tmp_path / "store.db", migrations=UI_SESSION_MIGRATIONS)
    return db, StoredUiSessions(db, **bounds)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_one_key_cannot_sign_everyone_else_out(tmp_path: Path) -> None:
    db, sessions = await _sessions(tmp_path, ttl_s=900, max_sessions=16, per_key=4)
    try:
        admin = (await sessions.create(b"a" * 32, 100.0))[0]
        flood = [(await sessions.create(b"v" * 32, 100.0 + n / 100))[0] for n in range(40)]
        assert await sessions.get(admin, 101.0) is not None
        live = [t for t in flood if await sessions.get(t, 101.0) is not None]
        assert live == flood[-4:]  # the flooding key keeps only its own newest
    finally:
        await db.close()


@pytest.mark.asyncio
async def test_sessions_expire_are_bounded_and_store_no_token(tmp_path: Path) -> None:
    db, sessions = await _sessions(tmp_path, ttl_s=10, max_sessions=3)
    try:
        tokens = [(await sessions.create(b"d" * 32, 100.0))[0] for _ in range(4)]
        assert await sessions.get(tokens[0], 101.0) is None  # the oldest made room
        found = await sessions.get(tokens[3], 109.0)
        assert found is not None and found.key_digest == b"d" * 32
        assert await sessions.get(tokens[3], 110.0) is None  # expired
        await sessions.drop(tokens[2])
        assert await sessions.get(tokens[2], 101.0) is None
        await sessions.keep_only(lambda digest: digest != b"d" * 32)  # a lapsed key's sessions end
        assert await sessions.get(tokens[1], 101.0) is None
        kept = (await sessions.create(b"e" * 32, 200.0))[0]
        assert db.sqlite is not None
        stored = await db.sqlite.read(lambda c: c.execute("SELECT * FROM wg_ui_sessions").fetchall())
        assert len(stored) == 1 and kept not in repr(stored) and (b"e" * 32).hex() in repr(stored)
    finally:
        await db.close()


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("ui-routes") as started:
        yield started


def test_sign_in_csrf_and_actions(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    assert http.get("/ui/").status_code == 200  # the sign-in page
    csp = http.get("/ui/").headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert http.get("/ui/context.html").status_code == 303
    assert http.get("/ui/api/attribution").status_code == 401
    assert http.post("/ui/login", json={"key": "wrong"}).status_code == 401
    assert (
        http.post(
            "/ui/login", content=b"key=x", headers={"content-type": "application/x-www-form-urlencoded"}
        ).status_code
        == 415
    )
    foreign = http.post("/ui/login", json={"key": env.gateway_key}, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403
    caller = env.add_principal("proxy-only", ["proxy"], ["mock-openai"])
    assert gateway.reload()
    assert http.post("/ui/login", json={"key": caller}).status_code == 403  # may not observe
    signed = http.post("/ui/login", json={"key": env.gateway_key})
    assert signed.status_code == 200
    cookie = signed.headers["set-cookie"]
    for attribute in ("HttpOnly", "Secure", "SameSite=Strict", "Path=/ui", "Max-Age=900"):
        assert attribute in cookie
    assert env.gateway_key not in cookie
    session = http.get("/ui/api/session").json()
    assert set(session) == {"csrf", "admin", "collecting"} and session["admin"] is True
    assert http.post("/ui/api/collection", json={"collecting": True}).status_code == 403  # no CSRF token
    assert (
        http.post("/ui/api/collection", json={"collecting": True}, headers={"x-wiregate-csrf": "x"}).status_code == 403
    )
    on = http.post("/ui/api/collection", json={"collecting": True}, headers={"x-wiregate-csrf": session["csrf"]})
    assert on.json() == {"collecting": True}
    assert http.get("/ui/api/attribution", params={"scope": "not-mine"}).status_code == 403
    assert http.post("/ui/logout", json={}).status_code == 403  # no CSRF token
    assert http.post("/ui/logout", json={}, headers={"x-wiregate-csrf": session["csrf"]}).status_code == 200
    assert http.get("/ui/api/session").status_code == 401


UI_ERRORS = [
    ("GET", "/ui/nothing.html", None, {}, 404),
    ("GET", "/ui/api/nothing", None, {}, 404),
    ("GET", "/ui/login", None, {}, 405),
    ("GET", "/ui/api/session", None, {}, 401),
    ("POST", "/ui/login", {"key": "wrong"}, {}, 401),
    ("POST", "/ui/login", {"key": "x"}, {"origin": "https://evil.example"}, 403),
]


def test_refusals_under_ui_carry_the_security_headers(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    for method, path, body, headers, status in UI_ERRORS:
        response = http.request(method, path, json=body, headers=headers)
        assert response.status_code == status, (method, path)
        for name, value in SECURITY_HEADERS.items():
            assert response.headers.get(name) == value, (path, name)
    typed = http.post("/ui/login", content=b"key=x", headers={"content-type": "text/plain"})
    assert (
        typed.status_code == 415
        and typed.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    )
    assert "content-security-policy" not in http.get("/healthz").headers  # only the pages' own surface


def _signed_in(http: object, key: str) -> dict[str, object]:
    signed = http.post("/ui/login", json={"key": key})  # type: ignore[attr-defined]
    assert signed.status_code == 200
    session = http.get("/ui/api/session")  # type: ignore[attr-defined]
    assert session.status_code == 200
    return dict(session.json())


def test_odd_csrf_and_numbers_are_refused_not_failed(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    _signed_in(http, env.gateway_key)
    for odd in ("\xe9".encode("latin-1"), "\u00e9".encode(), b"\xff\xfe"):
        for path in ("/ui/api/collection", "/ui/logout"):
            refused = http.post(path, json={"collecting": True}, headers={"x-wiregate-csrf": odd})
            assert refused.status_code == 403, (path, odd)
            assert refused.json()["error"]["details"]["reason_codes"] == ["forbidden_action"]
    for path in ("/ui/api/attribution", "/ui/api/usage", "/ui/api/decisions"):
        for value in ("nan", "inf", "-inf", "1e999", "x", "\u0665", "\uff15", "1_000", " 5 ", "0x10", "5e"):
            assert http.get(path, params={"since": value}).status_code == 422, (path, value)
        for value in ("0", "1700000000.25", "-1", "1e3", ".5"):
            assert http.get(path, params={"since": value}).status_code == 200, (path, value)
    for value in ("\u0665", "1_0", " 5 "):  # the API's time filters read numbers the same way
        refused = http.get("/v1/attribution/report", params={"until": value}, headers=_bearer(env.gateway_key))
        assert refused.status_code == 422, value


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_bodies_nested_too_deep_to_read_are_refused_not_failed(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture
) -> None:
    """Four kilobytes of "[" (a kilobyte for the API's switch) are unreadable bodies: 401 at
    sign-in, 422 at a switch; never a 500 and an error line anyone could write."""
    env, gateway = gw
    http = raw_client(gateway, env)
    mark = captured_logs.mark()
    deep = {"content-type": "application/json"}
    assert http.post("/ui/login", content=b"[" * 4096, headers=deep).status_code == 401
    assert http.post("/ui/login", content=b'{"key":' + b"[" * 4000, headers=deep).status_code == 401
    switched = http.post(
        "/v1/attribution/collection", content=b"[" * 1024, headers={**deep, **_bearer(env.gateway_key)}
    )
    assert switched.status_code == 422
    csrf = _signed_in(http, env.gateway_key)["csrf"]
    deep_switch = http.post("/ui/api/collection", content=b"[" * 4096, headers={**deep, "x-wiregate-csrf": str(csrf)})
    assert deep_switch.status_code == 422
    assert '"level":"error"' not in captured_logs.since(mark)


def test_switching_collection_and_signing_in_say_who_did(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture
) -> None:
    """The audit trail names the principal on the sign-in and on each switch (API and UI),
    with the state it switched to."""
    env, gateway = gw
    http = raw_client(gateway, env)
    mark = captured_logs.mark()
    csrf = _signed_in(http, env.gateway_key)["csrf"]
    before = http.get("/v1/attribution/collection", headers=_bearer(env.gateway_key)).json()["collecting"]
    try:
        assert (
            http.post(
                "/ui/api/collection", json={"collecting": not before}, headers={"x-wiregate-csrf": str(csrf)}
            ).status_code
            == 200
        )
        assert (
            http.post(
                "/v1/attribution/collection", json={"collecting": not before}, headers=_bearer(env.gateway_key)
            ).status_code
            == 200
        )
    finally:
        http.post("/v1/attribution/collection", json={"collecting": before}, headers=_bearer(env.gateway_key))
    lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.startswith("{")]
    switched = [r for r in lines if r.get("event") == "attribution_collection_switched"]
    assert [(r["principal"], r["collecting"], r["changed"]) for r in switched] == [
        ("tester", not before, True),
        ("tester", not before, False),
        ("tester", before, True),
    ]
    routes = {r["route"]: r for r in lines if r.get("event") == "request"}
    for route in ("/ui/login", "/ui/api/session", "/ui/api/collection", "/v1/attribution/collection"):
        assert routes[route].get("principal") == "tester", route


def test_a_key_removed_by_a_reload_never_comes_back(gw: tuple[Env, GatewayThread]) -> None:
    """Removing a key (or its `observe`) ends its sessions for good: restoring it later
    needs a new sign-in."""
    env, gateway = gw
    principals = env.dir / "principals.toml"
    original = principals.read_text()
    key, digest = devsetup.new_gateway_key()
    sensitive(key)
    watcher = devsetup.principal_block("watcher", [digest], ["observe"], [], None)
    blind = devsetup.principal_block("watcher", [digest], ["proxy"], [], None)
    try:
        for lapsed in (original, original + blind):
            principals.write_text(original + watcher)
            assert gateway.reload()
            http = raw_client(gateway, env)
            _signed_in(http, key)
            principals.write_text(lapsed)
            assert gateway.reload()
            principals.write_text(original + watcher)
            assert gateway.reload()  # restored before the session was used again
            assert http.get("/ui/api/session").status_code == 401
            _signed_in(http, key)  # a new sign-in works
            principals.write_text(lapsed)
            assert gateway.reload()
            assert http.get("/ui/api/session").status_code == 401  # ended by the reload itself
    finally:
        principals.write_text(original)
        assert gateway.reload()


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/ui/"), ("GET", "/ui/api/session"), ("GET", "/ui/api/attribution"), ("POST", "/ui/logout")],
)
def test_an_undecodable_session_cookie_is_no_session(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture, method: str, path: str
) -> None:
    """A cookie that is not UTF-8 (no key at all) finds no session: the sign-in page or
    401, never a 500 and never an error line anyone could fill the log with."""
    _, gateway = gw
    mark = captured_logs.mark()
    for cookie in (b"\xff", b"\xed\xa0\x80", b"ok\xc3"):
        with raw_socket(gateway) as sock:
            sock.sendall(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n".encode()
                + b"Cookie: wiregate_ui="
                + cookie
                + b"\r\n\r\n"
            )
            answer = read_until_closed(sock)
        status = int(answer.split(b" ", 2)[1])
        assert status == (200 if path == "/ui/" else 401), (path, cookie, answer[:200])
        if path == "/ui/":
            assert b'id="login"' in answer or b"sign in" in answer.lower()
    assert '"level":"error"' not in captured_logs.since(mark)


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_concurrent_sign_ins_on_two_replicas_keep_the_bounds(tmp_path: Path, backend: str) -> None:
    """Sign-ins at once, on two replicas of one database, never leave more sessions than
    the bounds allow (on PostgreSQL each one saw the same old count and all were kept)."""
    from tests.context.conftest import replica_databases

    async with replica_databases(backend, tmp_path, UI_SESSION_MIGRATIONS, "ui_bounds") as (one, two):
        replicas = [StoredUiSessions(db, per_key=2, max_sessions=4) for db in (one, two)]
        key = b"\x01" * 32
        made = await asyncio.gather(*(replicas[n % 2].create(key, 100.0) for n in range(16)))
        live = [token for token, _ in made if await replicas[0].get(token, 101.0) is not None]
        assert len(live) == 2
        await asyncio.gather(*(replicas[n % 2].create(bytes([n + 2]) * 32, 100.0) for n in range(16)))
        live = [token for token, _ in made if await replicas[1].get(token, 101.0) is not None]
        assert live == []  # the oldest made room
