"""The aiohttp Application: the route table, the request envelope middleware, and one
cleanup context per resource.

Owns: the route table (SPEC §2; provider routes derived from the carrier registry), the
middleware that gives every response an `X-PowerContext-Request-ID` (and, once the gateway
has retried upstream, retry advice for the SDK: `release.retry_advice`; on its own ops,
attribution, context and check routes, `no-store` and `nosniff`), renders
`GatewayError`s in the caller's dialect and writes one allow-listed access line, and the
resources under typed AppKeys (runtime holder, metrics, capacity, calls per principal,
release, usage, cache pace and attribution ledgers, the upstream client session, the bundled
mock provider when configured).
Must not: sequence the wire path (proxy/flow.py does), handle a route itself (api/ does),
or hold state outside AppKeys.
"""

from __future__ import annotations

import asyncio
import functools
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.api import attribution as attribution_api
from gateway.api import check, ops, provider, ui
from gateway.api import context as context_api
from gateway.carriers import CARRIERS, ROUTES
from gateway.config.load import resolve
from gateway.config.runtime import Runtime, RuntimeHolder
from gateway.context.store.database import open_database
from gateway.context.store.migrations import Migration
from gateway.devmock import embedded_mock
from gateway.errors import ClientError, GatewayError, ServiceError
from gateway.http.connections import CONTINUE, EXPECT, SERVER_NAME
from gateway.ledgers.attribution import ATTRIBUTION_MIGRATIONS, AttributionLedger
from gateway.ledgers.pace import PACE_MIGRATIONS, StoredPaceLedger
from gateway.ledgers.release import MemoryReleaseLedger
from gateway.ledgers.stored import LEDGER_MIGRATIONS, StoredReleaseLedger, StoredUsageLedger
from gateway.ledgers.ui_sessions import UI_SESSION_MIGRATIONS, StoredUiSessions
from gateway.obs import logging as log
from gateway.obs.metrics import Metrics
from gateway.obs.timeline import Timeline
from gateway.proxy import projections, release
from gateway.proxy.models import MODEL_CATALOGUE, ModelCatalogue
from gateway.proxy.offload import OFFLOAD, Offload
from gateway.proxy.upstream import UPSTREAM, Upstream
from gateway.state import (
    ATTRIBUTION,
    CALL,
    CAPACITY,
    CONFIG_PATH,
    CONTEXT,
    DATABASE,
    DRAINING,
    LOCAL_RELEASE_LEDGER,
    METRICS,
    PACE_LEDGER,
    PRINCIPAL_CALLS,
    RELEASE_LEDGER,
    RUNTIME,
    TIMELINE,
    UI_SESSIONS,
    USAGE_LEDGER,
    Call,
    Capacity,
    Draining,
    PrincipalCalls,
)
from gateway.vocab import Dialect, Outcome, ReasonCode

REQUEST_ID_HEADER = "X-PowerContext-Request-ID"
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def dialect_for(request: web.Request) -> Dialect:
    """Errors on a provider route are written in its provider's shape."""
    name = ROUTES.get(request.path)
    if name is not None:
        return CARRIERS[name].dialect
    if request.path == "/v1/models":
        return ops.dialect_of(request)
    return Dialect.CONTEXT


def _route_label(request: web.Request) -> str:
    info = request.match_info
    route = getattr(info, "route", None)
    resource = getattr(route, "resource", None)
    canonical = getattr(resource, "canonical", None)
    return canonical if isinstance(canonical, str) else "unmatched"


@web.middleware
async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
    # Server-generated; a client value is never trusted.
    call = Call.start(secrets.token_hex(8), _route_label(request), dialect_for(request))
    request[CALL] = call
    status = 500
    try:
        if request.get(EXPECT, CONTINUE) != CONTINUE:
            raise ClientError(417, "expectation_failed", (ReasonCode.INVALID_REQUEST,))
        response = await handler(request)
        status = response.status
        if call.outcome is None:
            call.outcome = Outcome.OK
        return response
    except GatewayError as err:
        call.outcome, call.reason_codes, status = Outcome.REFUSED, err.reason_codes, err.status
        return release.refusal(err, call.dialect, call.request_id)
    except web.HTTPException as exc:
        refusal = _http_error(exc)
        call.outcome, call.reason_codes, status = Outcome.REFUSED, refusal.reason_codes, refusal.status
        response = release.refusal(refusal, call.dialect, call.request_id)
        if isinstance(exc, web.HTTPMethodNotAllowed):  # RFC 9110: a 405 names what the route allows
            response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        call.outcome, status = Outcome.CLIENT_DISCONNECTED, 499
        raise
    except Exception as exc:  # an unexpected failure: nothing was released; say only that
        log.error("internal_error", request_id=call.request_id, error_class=type(exc).__name__, route=call.route)
        call.outcome = Outcome.ERROR
        return release.refusal(ServiceError(500, "internal_error", ()), call.dialect, call.request_id)
    finally:
        _account(request, call, status)


def _http_error(exc: web.HTTPException) -> GatewayError:
    if exc.status == 404:
        return ClientError(404, "not_found", (ReasonCode.NOT_FOUND,))
    if exc.status == 405:
        return ClientError(405, "method_not_allowed", (ReasonCode.METHOD_NOT_ALLOWED,))
    if exc.status == 413:
        return ClientError(413, "payload_too_large", (ReasonCode.PAYLOAD_TOO_LARGE,))
    status = exc.status if 400 <= exc.status < 600 else 400
    return ClientError(status, "invalid_request", (ReasonCode.INVALID_REQUEST,))


def _trace_id(runtime: Runtime, traceparent: str) -> str | None:
    """The W3C trace id, for the log: only a well-formed one (version 00, not all zeros),
    and as a keyed digest unless the operator chose raw ids (it is client text)."""
    trace = _TRACEPARENT.match(traceparent)
    if trace is None or trace.group(1) == "0" * 32:
        return None
    if runtime.config.logging.trace_ids == "raw":
        return trace.group(1)
    return runtime.log_digest(trace.group(1))


def _account(request: web.Request, call: Call, status: int) -> None:
    """One access line and the request metrics; a provider call's facts come from its trail."""
    seconds = time.perf_counter() - call.started
    fields: dict[str, Any] = {
        "profile": call.profile,
        "outcome": call.outcome.value if call.outcome else None,
        "reason_codes": call.reason_codes,
    }
    if call.exchange is not None and call.trail is not None:
        runtime, catalogue = call.exchange.runtime, request.app[MODEL_CATALOGUE]
        vouched = functools.partial(catalogue.vouches, runtime)
        facts = projections.access_fields(call.exchange, call.trail, vouched)
        fields.update({k: v for k, v in facts.items() if v is not None})
    metrics = request.app[METRICS]
    metrics.requests.labels(call.route, call.carrier or "none", fields["profile"] or "none", fields["outcome"]).inc()
    metrics.request_seconds.labels(call.route).observe(seconds)
    log.info(
        "request",
        request_id=call.request_id,
        trace_id=_trace_id(request.app[RUNTIME].current, request.headers.get("traceparent", "")),
        method=request.method if request.method in _METHODS else "other",  # a method is client text too
        route=call.route,
        status=status,
        duration_ms=round(seconds * 1000, 3),
        principal=call.principal,
        delegate_for=call.delegate_for,
        scope=call.scope,
        carrier=call.carrier,
        bytes_in=call.bytes_in,
        **fields,
    )


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER_NAME  # aiohttp would name itself and its version
    call = request.get(CALL)
    if isinstance(call, Call):
        response.headers[REQUEST_ID_HEADER] = call.request_id
    else:  # before the middleware ran (should not happen): still never trust the client's
        response.headers[REQUEST_ID_HEADER] = secrets.token_hex(8)


# The gateway's own answers on the ops, attribution, context and check routes (reports,
# metrics, usage, what a caller may use, stored memories, prepared context, verdicts): per
# caller, so no cache may keep them and no browser may sniff them, the refusals included.
# The provider routes mirror their provider's headers and are left as they are; /ui/ has
# its own (`gateway.api.ui.SECURITY_HEADERS`).
OWN_ROUTE_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_OWN_ROUTE_MODULES = frozenset({ops.__name__, attribution_api.__name__, context_api.__name__, check.__name__})


async def _own_route_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every response of a route whose handler is in `gateway.api.ops`,
    `gateway.api.attribution`, `gateway.api.context` or `gateway.api.check` carries
    `OWN_ROUTE_HEADERS`."""
    handler = getattr(request.match_info, "handler", None)
    if getattr(handler, "__module__", None) in _OWN_ROUTE_MODULES:
        response.headers.update(OWN_ROUTE_HEADERS)


async def _advise_on_retries(request: web.Request, response: web.StreamResponse) -> None:
    """Every response leaves through here (released, refused, heartbeat or passed through):
    once wiregate has retried upstream, a failure tells the SDK not to retry it again."""
    call = request.get(CALL)
    trail = call.trail if isinstance(call, Call) else None
    if trail is not None:
        response.headers.update(release.retry_advice(response.status, len(trail.attempts)))


# --- resources, one cleanup context each ---------------------------------------------------


async def _upstream(app: web.Application) -> AsyncIterator[None]:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=256, ttl_dns_cache=300, enable_cleanup_closed=True)
    # trust_env=False: proxy settings from the environment never redirect upstream traffic.
    # No cookie jar: a provider's Set-Cookie (a CDN's bot-management cookie) would otherwise
    # ride along on every later call, whoever makes it, linking tenants at the provider.
    session = aiohttp.ClientSession(
        connector=connector, trust_env=False, raise_for_status=False, cookie_jar=aiohttp.DummyCookieJar()
    )
    app[UPSTREAM] = Upstream(session)
    try:
        yield
    finally:
        await session.close()  # readiness sees it closed


# Every table owner's migrations, applied when the database opens (the context store's own
# come first, from the store module).
STORE_MIGRATIONS: tuple[Migration, ...] = (
    *LEDGER_MIGRATIONS,
    *PACE_MIGRATIONS,
    *ATTRIBUTION_MIGRATIONS,
    *UI_SESSION_MIGRATIONS,
)


async def _database(app: web.Application) -> AsyncIterator[None]:
    """The one database (SQLite file by default, PostgreSQL for replicas) and the context
    service on it. Store settings are read once: changing them needs a restart."""
    runtime = app[RUNTIME].current
    settings = runtime.config.store
    db = await open_database(
        settings.backend,
        path=resolve(runtime.base_dir, settings.path),
        dsn=runtime.store_dsn,
        schema=settings.pg_schema,
        pool_max=settings.pool_max,
        migrations=STORE_MIGRATIONS,
        sqlite_sync=settings.sqlite_sync,
    )
    app[DATABASE] = db
    # Bindings a caller presents may come back to any replica: their ledger is the shared
    # database. A proxied call's own send binding never leaves its exchange: in process.
    app[RELEASE_LEDGER] = StoredReleaseLedger(db)
    # Its entries never come back (the binding never leaves the exchange), so it stays small:
    # it only guards the one release of each call in flight.
    app[LOCAL_RELEASE_LEDGER] = MemoryReleaseLedger(capacity=4096)
    app[USAGE_LEDGER] = usage_ledger = StoredUsageLedger(db)
    app[PACE_LEDGER] = StoredPaceLedger(db)
    app[UI_SESSIONS] = StoredUiSessions(db)  # every worker and replica on the database knows a session
    app[ATTRIBUTION] = attribution = AttributionLedger(
        db,
        retention_s=runtime.config.attribution.retention_days * 86400,
        max_records=runtime.config.attribution.max_records,
        on_write=app[METRICS].attribution_seconds.labels("write").inc,
    )
    app[CONTEXT] = service = context_api.service(app, db)
    try:
        await attribution.load()
        await service.start()
        yield
    finally:
        try:
            await usage_ledger.close()
        except Exception as exc:  # the database went away: say so, still close it
            log.error("usage_flush_failed", error_class=type(exc).__name__)
        try:
            await attribution.close()
        except Exception as exc:
            log.error("attribution_flush_failed", error_class=type(exc).__name__)
        await db.close()


async def _offload(app: web.Application) -> AsyncIterator[None]:
    """Worker processes for large bodies (started on first use; a gateway without its
    configuration file, as some embedders build it, decides every body on the loop)."""
    workers = app[RUNTIME].current.config.server.check_workers
    app[OFFLOAD] = offload = Offload(app.get(CONFIG_PATH), workers, app[METRICS])
    try:
        yield
    finally:
        await offload.close()


def create_app(
    holder: RuntimeHolder, *, config_path: Path | None = None, metrics: Metrics | None = None
) -> web.Application:
    app = web.Application(middlewares=[envelope], client_max_size=holder.current.config.limits.request_bytes)
    app[RUNTIME] = holder
    app[METRICS] = metrics or Metrics()
    app[CAPACITY] = Capacity(app[METRICS])
    app[DRAINING] = Draining()
    app[PRINCIPAL_CALLS] = PrincipalCalls()
    app[MODEL_CATALOGUE] = ModelCatalogue()
    app[TIMELINE] = Timeline()
    if config_path is not None:
        app[CONFIG_PATH] = config_path
    for route, name in ROUTES.items():
        app.router.add_post(route, provider.handler_for(CARRIERS[name]))
    app.router.add_post("/v1/context/check", check.handle)
    context_api.add_routes(app)
    app.router.add_get("/v1/models", ops.models)
    app.router.add_get("/v1/capabilities", ops.capabilities)
    app.router.add_get("/v1/usage/report", ops.usage_report)
    attribution_api.add_routes(app)
    ui.add_routes(app)
    app.router.add_get("/healthz", ops.healthz)
    app.router.add_get("/readyz", ops.readyz)
    app.router.add_get("/metrics", ops.metrics)
    app.on_response_prepare.append(_stamp_request_id)
    app.on_response_prepare.append(_advise_on_retries)
    app.on_response_prepare.append(_own_route_headers)
    app.cleanup_ctx.append(embedded_mock)  # first up, last down: in-flight calls finish first
    app.cleanup_ctx.append(_database)
    app.cleanup_ctx.append(_upstream)
    app.cleanup_ctx.append(_offload)
    return app
