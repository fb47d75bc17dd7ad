"""Token attribution routes: the registry (any caller), the report (`observe`) and the
collection switch (`admin` to change it).

Must not: return anything but aggregates — no content, paths or raw ids ever reach the
records these read.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

from aiohttp import web

from gateway import auth
from gateway.attribution.blocks import ESTIMATOR, LABEL_HEADER
from gateway.attribution.ledger import TOP_N, Aggregator
from gateway.attribution.registry import Registry
from gateway.errors import ClientError
from gateway.http.body import read_body
from gateway.http.params import ascii_int, ascii_number
from gateway.ledgers.attribution import AttributionLedger, Row, decoded
from gateway.obs import logging as log
from gateway.proxy import projections
from gateway.state import ATTRIBUTION, CALL, CONTEXT, RUNTIME
from gateway.vocab import ReasonCode

SWITCH_BYTES = 1024  # the collection switch's body: more is never read, nor inflated (413)


def _bad() -> ClientError:
    return ClientError(422, "invalid_request", (ReasonCode.INVALID_REQUEST,))


def query_number(value: str | None, default: float) -> float:
    """A finite number from a query parameter, ASCII only (absent or empty: `default`), else 422."""
    if value is None or value == "":
        return default
    number = ascii_number(value)
    if number is None or not math.isfinite(number):
        raise _bad()
    return number


async def _compute(
    ledger: AttributionLedger, registry: Registry, scope: str | None, since: float, until: float, now: float, top: int
) -> dict[str, Any]:
    """Read the rows (on the database's side), then decode and aggregate them off the loop.
    Records this process dropped from its queue (the database was away too long) are
    missing from the rows: the report says so (`records_dropped`) and exposure is not
    `supported`."""
    rows, limited = await ledger.rows(scope, until, now=now)
    dropped = ledger.dropped > 0
    return await asyncio.to_thread(_aggregate, rows, registry, since, limited, top, dropped)


def _aggregate(
    rows: list[Row], registry: Registry, since: float, limited: bool, top: int, dropped: bool = False
) -> dict[str, Any]:
    """One pass, on a worker thread: each row is decoded just before it is added (never every
    record at once), in time order, then the report."""
    agg = Aggregator(registry, since=since)
    for record in decoded(rows):
        agg.add(record)
    return agg.report(limited_scan=limited, top_n=top, dropped=dropped)


async def build_report(
    request: web.Request, scope: str | None, since: float | None, until: float | None, top: int = TOP_N
) -> dict[str, Any]:
    """The report for a scope (None: every scope) over [since, until] (unix seconds). The
    event loop only waits for it: the rows are read on the database's side, decoded and
    aggregated on a worker thread, one report at a time in this process."""
    app = request.app
    runtime = app[RUNTIME].current
    ledger = app[ATTRIBUTION]
    now = time.time()
    start = max(since if since is not None else now - ledger.retention_s, now - ledger.retention_s)
    end = until if until is not None else now
    digest = projections.scope_digest(runtime, scope) if scope is not None else None
    registry = projections.registry_for(runtime.config.attribution)
    async with ledger.report_lock:  # one report at a time: concurrent observers never multiply its memory
        work = asyncio.ensure_future(_compute(ledger, registry, digest, start, end, now, top))
        try:
            body = await asyncio.shield(work)
        except asyncio.CancelledError:
            # The caller went away: the lock is held until the read and the pass end, so
            # the next report never holds its rows beside this one's.
            await asyncio.wait({work})
            if not work.cancelled():
                work.exception()  # retrieved: the caller is gone, there is no one to tell
            raise
    body["window"] = {"since": start, "until": end, "retentionDays": ledger.retention_s / 86400}
    body["scope"] = "selected" if scope is not None else "all"
    body["collection"] = {"collecting": ledger.collecting}
    return body


async def report(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    query = request.query
    scope = query.get("scope") or None
    service = request.app.get(CONTEXT)
    # Authenticates first (an unknown key is 401 whatever the query says) and looks up no
    # creator for a scope past 256 characters, which is refused right after.
    creator_of = await auth.creators(
        runtime, request.headers, service.scope_creator if service else None, body_scope=scope
    )
    asked = scope if scope is not None else request.headers.get(auth.SCOPE_HEADER)
    if asked is not None and len(asked) > 256:
        raise _bad()  # no scope is longer (SPEC §10.1), in the query or in the header
    identity = auth.identify(runtime, request.headers, "observe", body_scope=scope, creator_of=creator_of)
    request[CALL].identify(identity, runtime)
    if scope is None and (
        request.headers.get(auth.SCOPE_HEADER) is not None or not auth.reaches_every_scope(identity.principal)
    ):
        scope = identity.scope  # the header's or the principal's default: every scope only for one that reaches all
    top = ascii_int(query.get("top") or str(TOP_N), 3)
    if top is None or not 1 <= top <= TOP_N:
        raise _bad()  # a whole number, never rounded ("1.9" is not 1)
    since = query_number(query.get("since"), -1.0)
    until = query_number(query.get("until"), -1.0)
    body = await build_report(request, scope, since if since >= 0 else None, until if until >= 0 else None, top)
    return web.json_response(body)


async def collection(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    request[CALL].identify(auth.identify(runtime, request.headers, "observe"), runtime)
    return web.json_response({"collecting": request.app[ATTRIBUTION].collecting})


async def switch(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    identity = auth.identify(runtime, request.headers, "admin")
    request[CALL].identify(identity, runtime)
    raw = await read_body(request, runtime.config.limits, max_bytes=SWITCH_BYTES)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # a kilobyte of "[" nests too deep to read: unreadable
        body = None
    if not isinstance(body, dict) or set(body) != {"collecting"} or type(body["collecting"]) is not bool:
        raise _bad()
    collecting: bool = body["collecting"]
    await switch_collection(request, identity.principal.id, collecting)
    return web.json_response({"collecting": collecting})


async def switch_collection(request: web.Request, principal: str, collecting: bool) -> None:
    """Switch collection (for every replica on the database) and say who did: an audit line
    with the principal's id, the new state and whether it changed."""
    ledger = request.app[ATTRIBUTION]
    before = ledger.collecting
    await ledger.set_collecting(collecting)
    log.info(
        "attribution_collection_switched",
        request_id=request[CALL].request_id,
        principal=principal,
        collecting=collecting,
        changed=before != collecting,
    )


async def registry(request: web.Request) -> web.Response:
    """The block ids a host may use in `x-wiregate-blocks`, and what each means (any
    authenticated caller: hosts label their own requests)."""
    runtime = request.app[RUNTIME].current
    auth.authenticate(runtime, request.headers)
    specs = projections.registry_for(runtime.config.attribution)
    blocks = [
        {
            "blockId": spec.id,
            "displayName": spec.display_name,
            "type": spec.type,
            "origin": spec.origin,
            "control": spec.control,
            "lifetime": spec.lifetime,
            "eligible": spec.eligible,
            "suggestedAction": spec.action,
            "requiredValidation": spec.validation,
            **({"targetPerInjection": spec.target} if spec.target is not None else {}),
        }
        for spec in specs
    ]
    return web.json_response(
        {
            "schema": "wiregate.attribution-registry.v1",
            "labelHeader": LABEL_HEADER,
            "estimator": ESTIMATOR,
            "blocks": sorted(blocks, key=lambda b: b["blockId"]),
        }
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/attribution/registry", registry)
    app.router.add_get("/v1/attribution/report", report)
    app.router.add_get("/v1/attribution/collection", collection)
    app.router.add_post("/v1/attribution/collection", switch)
