"""The /ui/ pages: sign-in by gateway key, three content-free pages and the JSON they read.

Owns: serving the packaged static files under a strict Content-Security-Policy, the
exchange of a gateway key (of a principal that may `observe`) for a short-lived
`HttpOnly; Secure; SameSite=Strict` session cookie (sessions in the shared database:
`gateway.ledgers.ui_sessions`), the pages' JSON (the attribution
report, the usage report with this process's timeline, the decision timeline), and the
collection switch (`admin`, with a CSRF token in a header besides the same-site cookie).
Must not: show or return content, raw ids or the key; accept a state change without the
session's CSRF token; load anything from a third party.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway import auth
from gateway.api.attribution import build_report, query_number, switch_collection
from gateway.config.runtime import Principal, Runtime
from gateway.errors import ClientError
from gateway.http.body import read_body
from gateway.ledgers.ui_sessions import UiSession
from gateway.state import ATTRIBUTION, CALL, CONTEXT, RUNTIME, TIMELINE, UI_SESSIONS, USAGE_LEDGER
from gateway.vocab import ReasonCode

COOKIE = "wiregate_ui"
CSRF_HEADER = "x-wiregate-csrf"
STATIC_DIR = Path(__file__).resolve().parent.parent / "ui" / "static"
PAGES = frozenset({"context.html", "usage.html", "decisions.html"})
_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript", ".png": "image/png"}
STATIC = web.AppKey("wiregate_ui_static", dict)  # name → bytes, read once at start
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def _unauthenticated() -> ClientError:
    return ClientError(401, "authentication_error", (ReasonCode.UNAUTHENTICATED,))


def _forbidden() -> ClientError:
    return ClientError(403, "permission_denied", (ReasonCode.FORBIDDEN_ACTION,))


def _principal_of(runtime: Runtime, key_digest: bytes) -> Principal | None:
    found = None
    for digest, principal in runtime.principals:
        if hmac.compare_digest(digest, key_digest):
            found = principal
    return found


def _observer(runtime: Runtime, key_digest: bytes) -> bool:
    principal = _principal_of(runtime, key_digest)
    return principal is not None and principal.may("observe")


async def end_lapsed_sessions(app: web.Application, runtime: Runtime) -> None:
    """After a reload, and at start: end the sessions of keys the runtime does not have or
    no longer lets observe (restoring the key later must not bring them back)."""
    sessions = app.get(UI_SESSIONS)
    if sessions is not None:
        await sessions.keep_only(lambda digest: _observer(runtime, digest))


async def _lapsed_at_start(app: web.Application) -> None:
    await end_lapsed_sessions(app, app[RUNTIME].current)


async def _session(request: web.Request) -> tuple[UiSession, Principal]:
    """The caller's live session and its principal as the current runtime has it; a key
    removed, or no longer allowed to observe, ends the session for good."""
    token = request.cookies.get(COOKIE)
    sessions = request.app[UI_SESSIONS]
    session = await sessions.get(token, time.time()) if token else None
    if session is None or token is None:
        raise _unauthenticated()
    principal = _principal_of(request.app[RUNTIME].current, session.key_digest)
    if principal is None:
        await sessions.drop(token)
        raise _unauthenticated()
    request[CALL].principal = principal.id  # the access line says whose session it was
    if not principal.may("observe"):
        await sessions.drop(token)
        raise _forbidden()
    return session, principal


def _check_csrf(request: web.Request, session: UiSession) -> None:
    """The session's token in its header, compared as bytes (any header value compares,
    none raises)."""
    presented = request.headers.get(CSRF_HEADER, "").encode("utf-8", "surrogateescape")
    if not presented or not hmac.compare_digest(presented, session.csrf.encode()):
        raise _forbidden()


def _same_origin(request: web.Request) -> None:
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise _forbidden()


BODY_BYTES = 4096  # a sign-in or a switch: more is never read, nor inflated (413)


async def _json_body(request: web.Request) -> object:
    if request.content_type != "application/json":
        raise ClientError(415, "invalid_request", (ReasonCode.INVALID_REQUEST,))
    # Sign-in reads this before any authentication: the route's own bound, not the
    # gateway's 32 MiB, so an anonymous caller never makes it buffer or inflate more.
    raw = await read_body(request, request.app[RUNTIME].current.config.limits, max_bytes=BODY_BYTES)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # four kilobytes of "[" nest too deep to read: unreadable
        return None


def _file(request: web.Request, name: str) -> web.Response:
    body = request.app[STATIC].get(name)
    if body is None:
        raise web.HTTPNotFound()
    response = web.Response(body=body, content_type=_TYPES.get(Path(name).suffix, "application/octet-stream"))
    if response.content_type.startswith("text/"):
        response.charset = "utf-8"
    return response


def _json(data: object) -> web.Response:
    return web.json_response(data)


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response under /ui — pages, JSON, redirects and refusals alike — carries the
    Content-Security-Policy and its companions."""
    if request.path == "/ui" or request.path.startswith("/ui/"):
        response.headers.update(SECURITY_HEADERS)


async def index(request: web.Request) -> web.StreamResponse:
    try:
        await _session(request)
    except ClientError:
        return _file(request, "login.html")
    return _see("/ui/context.html")


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name in PAGES:
        try:
            await _session(request)
        except ClientError:
            return _see("/ui/")
    return _file(request, name)


async def login(request: web.Request) -> web.Response:
    _same_origin(request)
    body = await _json_body(request)
    key = body.get("key") if isinstance(body, dict) else None
    if not isinstance(key, str) or not 0 < len(key) <= 512:
        raise _unauthenticated()
    runtime = request.app[RUNTIME].current
    principal = runtime.authenticate(key)
    if principal is None:
        raise _unauthenticated()
    request[CALL].principal = principal.id
    if not principal.may("observe"):
        raise _forbidden()
    sessions = request.app[UI_SESSIONS]
    token, _ = await sessions.create(hashlib.sha256(key.encode()).digest(), time.time())
    response = _json({"signed_in": True})
    response.set_cookie(
        COOKIE, token, max_age=int(sessions.ttl_s), path="/ui", secure=True, httponly=True, samesite="Strict"
    )
    return response


async def logout(request: web.Request) -> web.Response:
    _same_origin(request)
    session, _ = await _session(request)
    _check_csrf(request, session)
    await request.app[UI_SESSIONS].drop(request.cookies.get(COOKIE, ""))
    response = _json({"signed_in": False})
    response.del_cookie(COOKIE, path="/ui", secure=True, httponly=True, samesite="Strict")
    return response


async def session_info(request: web.Request) -> web.Response:
    session, principal = await _session(request)
    return _json(
        {"csrf": session.csrf, "admin": principal.may("admin"), "collecting": request.app[ATTRIBUTION].collecting}
    )


def _since(request: web.Request) -> float | None:
    value = request.query.get("since")
    return None if not value else query_number(value, 0.0)


async def attribution(request: web.Request) -> web.Response:
    _, principal = await _session(request)
    scope = request.query.get("scope") or None
    if scope is None and not auth.reaches_every_scope(principal):
        scope = principal.default_scope  # a view across scopes only for a principal that reaches them all
    if scope is not None:
        if len(scope) > 256:
            raise ClientError(422, "invalid_request", (ReasonCode.INVALID_REQUEST,))
        service = request.app.get(CONTEXT)
        creator = (
            await service.scope_creator(scope) if service is not None and not auth.reaches(principal, scope) else None
        )
        if not auth.reaches(principal, scope) and creator != principal.id:
            raise _forbidden()
    return _json(await build_report(request, scope, _since(request), None))


async def usage(request: web.Request) -> web.Response:
    await _session(request)
    report = await request.app[USAGE_LEDGER].report()
    snapshot = request.app[TIMELINE].snapshot(_since(request) or 0.0)
    return _json(
        {"report": report, "timeline": {"bucketSeconds": snapshot["bucketSeconds"], "usage": snapshot["usage"]}}
    )


async def decisions(request: web.Request) -> web.Response:
    await _session(request)
    snapshot = request.app[TIMELINE].snapshot(_since(request) or 0.0)
    return _json({"bucketSeconds": snapshot["bucketSeconds"], "decisions": snapshot["decisions"]})


async def switch(request: web.Request) -> web.Response:
    _same_origin(request)
    session, principal = await _session(request)
    _check_csrf(request, session)
    if not principal.may("admin"):
        raise _forbidden()
    body = await _json_body(request)
    if not isinstance(body, dict) or set(body) != {"collecting"} or type(body["collecting"]) is not bool:
        raise ClientError(422, "invalid_request", (ReasonCode.INVALID_REQUEST,))
    await switch_collection(request, principal.id, body["collecting"])
    return _json({"collecting": body["collecting"]})


async def _redirect(request: web.Request) -> web.StreamResponse:
    return _see("/ui/")


def _see(location: str) -> web.Response:
    """A redirect as a response (the envelope renders raised HTTP exceptions as errors)."""
    return web.Response(status=303, headers={"Location": location})


def _read_static() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in STATIC_DIR.iterdir() if p.is_file() and p.suffix in _TYPES}


async def resources(app: web.Application) -> AsyncIterator[None]:
    """The static files, read once off the loop (the sessions live in the database:
    `gateway.app` opens it)."""
    app[STATIC] = await asyncio.to_thread(_read_static)
    yield


def add_routes(app: web.Application) -> None:
    app.router.add_get("/ui", _redirect)
    app.router.add_get("/ui/", index)
    app.router.add_post("/ui/login", login)
    app.router.add_post("/ui/logout", logout)
    app.router.add_get("/ui/api/session", session_info)
    app.router.add_get("/ui/api/attribution", attribution)
    app.router.add_get("/ui/api/usage", usage)
    app.router.add_get("/ui/api/decisions", decisions)
    app.router.add_post("/ui/api/collection", switch)
    app.router.add_get("/ui/{name:[a-z]+\\.(?:html|css|js|png)}", static)
    app.cleanup_ctx.append(resources)
    app.on_startup.append(_lapsed_at_start)  # after every cleanup context: the database is open
    app.on_response_prepare.append(_security_headers)
