"""The aiohttp Application: routes, the request envelope middleware, resources.

Owns: the route table (SPEC §2), the middleware that gives every response an
`X-PowerContext-Request-ID`, renders `GatewayError`s in the caller's dialect and writes one
allow-listed access line, the upstream ClientSession as a cleanup context, and the small
operational routes (health, readiness, metrics, models, capabilities).
Must not: sequence the wire path (proxy/flow.py does) or hold state outside AppKeys.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway import __version__, auth, checkapi
from gateway.carriers import CARRIERS, ROUTES, SHORT_NAMES
from gateway.checks import ReleaseLedger
from gateway.config.runtime import Runtime, RuntimeHolder
from gateway.errors import Dialect, GatewayError
from gateway.inspection import verdict as rc
from gateway.obs import logging as log
from gateway.obs.metrics import Metrics
from gateway.proxy import flow, release
from gateway.proxy.upstream import Upstream
from gateway.state import CALL, SERVICES, Call, Capacity, Services
from gateway.usage import KINDS, UsageLedger

REQUEST_ID_HEADER = "X-PowerContext-Request-ID"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

PROVIDER_ROUTES: dict[str, str] = ROUTES

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def dialect_for(request: web.Request) -> Dialect:
    path = request.path
    if path.startswith("/v1/messages"):
        return Dialect.ANTHROPIC
    if path == "/v1/models" and "anthropic-version" in request.headers:
        return Dialect.ANTHROPIC
    if path.startswith(("/v1/chat/", "/v1/responses", "/v1/embeddings", "/v1/models")):
        return Dialect.OPENAI
    return Dialect.CONTEXT


def _route_label(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return canonical if isinstance(canonical, str) else "unmatched"


@web.middleware
async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
    call = Call(
        request_id=secrets.token_hex(8),  # server-generated; a client value is never trusted
        route=_route_label(request),
        dialect=dialect_for(request),
        started=time.perf_counter(),
    )
    request[CALL] = call
    services = request.app[SERVICES]
    response: web.StreamResponse | None = None
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if call.outcome == "error":
            call.outcome = "ok"
        return response
    except GatewayError as err:
        call.outcome = "refused"
        call.reason_codes = err.reason_codes
        status = err.status
        return release.refusal(err, call.dialect, call.request_id)
    except web.HTTPException as exc:
        err = _http_error(exc)
        call.outcome, call.reason_codes, status = "refused", err.reason_codes, err.status
        return release.refusal(err, call.dialect, call.request_id)
    except asyncio.CancelledError:
        call.outcome = "client_disconnected"
        status = 499
        raise
    except ConnectionResetError:
        call.outcome = "client_disconnected"
        status = 499
        raise
    except Exception as exc:  # an unexpected failure: nothing was released; say only that
        log.error("internal_error", request_id=call.request_id, error_class=type(exc).__name__, route=call.route)
        err = GatewayError(500, "internal_error", ())
        return release.refusal(err, call.dialect, call.request_id)
    finally:
        _account(services, call, status, request)


def _http_error(exc: web.HTTPException) -> GatewayError:
    if exc.status == 404:
        return GatewayError(404, "not_found", (rc.NOT_FOUND,))
    if exc.status == 405:
        return GatewayError(405, "method_not_allowed", (rc.METHOD_NOT_ALLOWED,))
    if exc.status == 413:
        return GatewayError(413, "payload_too_large", (rc.PAYLOAD_TOO_LARGE,))
    return GatewayError(exc.status if 400 <= exc.status < 600 else 400, "invalid_request", (rc.INVALID_REQUEST,))


def _account(services: Services, call: Call, status: int, request: web.Request) -> None:
    seconds = time.perf_counter() - call.started
    m = services.metrics
    m.requests.labels(call.route, call.carrier or "none", call.profile or "none", call.outcome).inc()
    m.request_seconds.labels(call.route).observe(seconds)
    log.info(
        "request",
        request_id=call.request_id,
        trace_id=_trace_id(services.holder.current, request.headers.get("traceparent", "")),
        method=request.method if request.method in _METHODS else "other",  # a method is client text too
        route=call.route,
        status=status,
        duration_ms=round(seconds * 1000, 3),
        principal=call.principal,
        delegate_for=call.delegate_for,
        scope=call.scope,
        profile=call.profile,
        carrier=call.carrier,
        model=call.model,
        stream=call.stream,
        outcome=call.outcome,
        reason_codes=call.reason_codes,
        upstream_status=call.upstream_status,
        attempts=len(call.attempts),
        bytes_in=call.bytes_in,
        bytes_out=call.bytes_out,
    )


def _trace_id(runtime: Runtime, traceparent: str) -> str | None:
    """The W3C trace id, for the log: only a well-formed one (version 00, not all zeros),
    and as a keyed digest unless the operator chose raw ids (it is client text)."""
    trace = _TRACEPARENT.match(traceparent)
    if trace is None or trace.group(1) == "0" * 32:
        return None
    if runtime.config.logging.trace_ids == "raw":
        return trace.group(1)
    return runtime.log_digest(trace.group(1))


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    call = request.get(CALL)
    if isinstance(call, Call):
        response.headers[REQUEST_ID_HEADER] = call.request_id
    else:  # before the middleware ran (should not happen): still never trust the client's
        response.headers[REQUEST_ID_HEADER] = secrets.token_hex(8)


# --- routes -------------------------------------------------------------------------


def _provider_handler(carrier_name: str) -> Handler:
    carrier = CARRIERS[carrier_name]

    async def handler(request: web.Request) -> web.StreamResponse:
        return await flow.handle(request, carrier)

    return handler


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    ready = services.upstream is not None and bool(services.holder.current.profiles)
    return web.json_response({"status": "ready" if ready else "not_ready"}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    auth.identify(services.holder.current, request.headers, "observe")
    return web.Response(body=services.metrics.render(), content_type="text/plain", charset="utf-8")


async def models(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    runtime = services.holder.current
    identity = auth.identify(runtime, request.headers, "proxy")
    seen: dict[str, str] = {}
    for pid in identity.principal.profiles:
        loaded = runtime.profiles.get(pid)
        if loaded is None:
            continue
        for name in loaded.profile.models:
            if not any(c in name for c in "*?[") and name not in seen:
                seen[name] = loaded.profile.provider
    if dialect_for(request) is Dialect.ANTHROPIC:
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"} for m in seen]
        return web.json_response(
            {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )
    data_oa = [{"id": m, "object": "model", "created": 0, "owned_by": p} for m, p in seen.items()]
    return web.json_response({"object": "list", "data": data_oa})


async def usage_report(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    auth.identify(services.holder.current, request.headers, "observe")
    body = services.usage.report()
    body["recent"] = [r.as_json() for r in services.usage.recent()]
    return web.json_response(body)


async def capabilities(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    runtime = services.holder.current
    auth.authenticate(runtime, request.headers)
    limits = runtime.config.limits
    body = {
        "schema": "wiregate.capabilities.v1",
        "version": __version__,
        "deployment_id": runtime.config.deployment_id,
        "carriers": sorted(SHORT_NAMES),
        "routes": sorted(PROVIDER_ROUTES),
        "check_schemas": ["powercontext.context-check.v1"],
        "payload_schemas": ["powercontext.model-json-payload.v1", "powercontext.model-sse-payload.v1"],
        "policy_version": runtime.policy.version,
        "inspection_engine": runtime.policy.engine.matcher.engine,
        "limits": limits.model_dump(),
        "modes": {phase.value: mode.value for phase, mode in runtime.policy.modes.items()},
        "usage": {
            "schema": "wiregate.usage-report.v1",
            "report": "/v1/usage/report",
            "kinds": list(KINDS),
            "provenance": ["known", "estimated", "unknown"],
            "estimators": ["runes/4@1", "character:weighted@1"],
        },
    }
    return web.Response(text=json.dumps(body), content_type="application/json")


# --- app factory ----------------------------------------------------------------------


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, ttl_dns_cache=300, enable_cleanup_closed=True)
    # trust_env=False: proxy settings from the environment never redirect upstream traffic.
    session = aiohttp.ClientSession(connector=connector, trust_env=False, raise_for_status=False)
    app[SERVICES].upstream = Upstream(session)
    try:
        yield
    finally:
        app[SERVICES].upstream = None
        await session.close()


def create_app(
    holder: RuntimeHolder, *, config_path: Path | None = None, metrics_: Metrics | None = None
) -> web.Application:
    app = web.Application(middlewares=[envelope], client_max_size=holder.current.config.limits.request_bytes)
    m = metrics_ or Metrics()
    app[SERVICES] = Services(
        holder=holder,
        metrics=m,
        capacity=Capacity(m),
        config_path=config_path,
        ledger=ReleaseLedger(),
        usage=UsageLedger(),
    )
    for path, carrier in PROVIDER_ROUTES.items():
        app.router.add_post(path, _provider_handler(carrier))
    app.router.add_post("/v1/context/check", checkapi.handle)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/capabilities", capabilities)
    app.router.add_get("/v1/usage/report", usage_report)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.on_response_prepare.append(_stamp_request_id)
    app.cleanup_ctx.append(_client_session)
    return app
