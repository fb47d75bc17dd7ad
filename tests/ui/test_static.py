"""The /ui/ pages without a browser: the packaged files carry no inline script or style and
load nothing from elsewhere; sessions are short-lived and bounded; sign-in, CSRF and the
observe action are enforced by the routes themselves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gateway import devsetup
from gateway.api.ui import SECURITY_HEADERS, STATIC_DIR
from gateway.state import UiSessions
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


def test_one_key_cannot_sign_everyone_else_out() -> None:
    sessions = UiSessions(ttl_s=900, max_sessions=16, per_key=4)
    admin = sessions.create(b"a" * 32, 100.0)[0]
    flood = [sessions.create(b"v" * 32, 100.0 + n / 100)[0] for n in range(40)]
    assert sessions.get(admin, 101.0) is not None
    live = [t for t in flood if sessions.get(t, 101.0) is not None]
    assert live == flood[-4:]  # the flooding key keeps only its own newest


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
        for value in ("nan", "inf", "-inf", "1e999", "x"):
            assert http.get(path, params={"since": value}).status_code == 422, (path, value)
        assert http.get(path, params={"since": "0"}).status_code == 200


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
