"""The /ui/ pages without a browser: the packaged files carry no inline script or style and
load nothing from elsewhere; sessions are short-lived and bounded; sign-in, CSRF and the
observe action are enforced by the routes themselves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gateway.api.ui import STATIC_DIR
from gateway.state import UiSessions
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client


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


def test_sessions_expire_and_are_bounded() -> None:
    sessions = UiSessions(ttl_s=10, max_sessions=3)
    tokens = [sessions.create(b"d" * 32, 100.0)[0] for _ in range(4)]
    assert sessions.get(tokens[0], 101.0) is None  # the oldest made room
    assert sessions.get(tokens[3], 109.0) is not None
    assert sessions.get(tokens[3], 110.0) is None  # expired
    sessions.drop(tokens[2])
    assert sessions.get(tokens[2], 101.0) is None


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
