"""Operational routes: liveness, readiness, metrics, the models a caller may use, what
this deployment supports, and the usage report.

Must not: expose content or identities beyond the caller's own.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from gateway import __version__, auth
from gateway.carriers import CARRIERS, ROUTES, SHORT_NAMES
from gateway.config.runtime import Runtime
from gateway.context.rerank import POLICY_ID as RERANK_POLICY_ID
from gateway.devmock import MOCK_PROVIDER
from gateway.proxy import models as catalogue
from gateway.proxy.upstream import UPSTREAM
from gateway.state import DATABASE, DRAINING, METRICS, RUNTIME, USAGE_LEDGER, WORKER
from gateway.usage import KINDS
from gateway.vocab import Dialect


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready: not stopping, configuration loaded (with profiles; the inspection databases are
    compiled as part of loading it), the upstream client open, and the store answering."""
    app = request.app
    if app[DRAINING].on:
        return web.json_response({"status": "draining"}, status=503)
    upstream = app.get(UPSTREAM)
    runtime = app[RUNTIME].current
    if upstream is None or upstream.session.closed or not runtime.profiles:
        return web.json_response({"status": "not_ready"}, status=503)
    if runtime.config.mock_provider.enabled and app.get(WORKER, 0) == 0:  # the mock-* profiles need it
        mock = app.get(MOCK_PROVIDER)
        if mock is None or not mock.serving:
            return web.json_response({"status": "not_ready", "reason": "mock_provider_down"}, status=503)
    database = app.get(DATABASE)
    if database is None or not await database.ping():
        return web.json_response({"status": "not_ready", "reason": "store_unreachable"}, status=503)
    return web.json_response({"status": "ready"})


async def metrics(request: web.Request) -> web.Response:
    auth.identify(request.app[RUNTIME].current, request.headers, "observe")
    return web.Response(body=request.app[METRICS].render(), content_type="text/plain", charset="utf-8")


def dialect_of(request: web.Request) -> Dialect:
    """/v1/models answers in Anthropic's shape to Anthropic's SDK (which sends its version)."""
    return Dialect.ANTHROPIC if "anthropic-version" in request.headers else Dialect.OPENAI


async def models(request: web.Request) -> web.Response:
    """What the caller may use: its profiles' upstream model lists filtered by their
    patterns (or their exact names where an upstream cannot be asked), in the OpenAI list
    shape, or Anthropic's to a caller that sends `anthropic-version`."""
    runtime = request.app[RUNTIME].current
    identity = auth.identify(runtime, request.headers, "proxy")
    listed = await catalogue.for_principal(request.app, runtime, identity.principal)
    if dialect_of(request) is Dialect.ANTHROPIC:
        data = [
            {"type": "model", "id": m.id, "display_name": m.display_name or m.id, "created_at": m.created_at}
            for m in listed
        ]
        return web.json_response(
            {
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )
    data_oa = [{"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by} for m in listed]
    return web.json_response({"object": "list", "data": data_oa})


async def usage_report(request: web.Request) -> web.Response:
    auth.identify(request.app[RUNTIME].current, request.headers, "observe")
    ledger = request.app[USAGE_LEDGER]
    body = await ledger.report()
    body["recent"] = [r.as_json() for r in await ledger.recent()]
    return web.json_response(body)


def powercontext_capabilities(runtime: Runtime) -> dict[str, Any]:
    """PowerContext 1.4.1's `Capabilities` object (closed): what wiregate's context layer
    offers, in the fields a 1.4.1 client knows."""
    vector = runtime.config.context.embeddings_profile is not None
    return {
        "prompts": {},
        "artifact_dreaming": False,
        "artifact_dreaming_operations": [],
        "source_types": ["content"],
        "artifact_families": ["atomic-memory", "topic-memory", "experience", "profile"],
        "memory_extraction": False,
        "extraction": None,
        "experience_generation": False,
        "managed_skill_generation": False,
        "external_skill_registry": False,
        "handoff_generation": False,
        "search_modes": ["auto", "fts", "vector", "hybrid"] if vector else ["auto", "fts"],
        "context_versions": ["powercontext.prepared-context.v1"],
    }


def context_capabilities(runtime: Runtime) -> dict[str, Any]:
    """What only wiregate declares about its context layer: the seeds' opt-ins and schemas."""
    cfg = runtime.config.context
    return {
        "enabled": cfg.enabled,
        "store": runtime.config.store.backend,
        "prepare_opt_ins": ["include_receipt", "include_reuse"],
        "schemas": [
            "powercontext.prepared-context.v1",
            "powercontext.prepared-context-with-reuse.v1",
            "powercontext.prepared-context-receipt.v1",
            "powercontext.context-reuse.v1",
        ],
        "families": ["atomic-memory", "topic-memory", "experience", "profile"],
        "lifecycle_states": ["active", "forgotten", "merged", "retired"],
        # the prepare reranker in force (recorded in every receipt it shapes), or null
        "rerank": (
            {"policy_id": RERANK_POLICY_ID, **runtime.rerank.effective_settings()}
            if runtime.rerank is not None
            else None
        ),
        "replay": {
            "header": "x-wiregate-prepared-context",
            "location_schema": "powercontext.model-json-text-location.v1",
            "carriers": sorted(SHORT_NAMES),
            "max_per_request": 16,
            "reuse_ttl_s": cfg.reuse_ttl_s,
        },
        "limits": {
            "max_bytes": [512, 32768],
            "entries": 8,
            "experiences": 2,
            "item_bytes": 2000,
            "min_truncation_bytes": 64,
            "receipt_bytes": 8192,
            "query_chars": 8192,
            "request_bytes": cfg.request_bytes,
        },
    }


async def capabilities(request: web.Request) -> web.Response:
    """A PowerContext client (it always sends `X-PowerContext-Dream-Contract`) gets 1.4.1's
    closed `Capabilities` object exactly; anyone else gets those fields and wiregate's own
    beside them."""
    runtime = request.app[RUNTIME].current
    auth.authenticate(runtime, request.headers)
    if "x-powercontext-dream-contract" in request.headers:
        return web.Response(text=json.dumps(powercontext_capabilities(runtime)), content_type="application/json")
    limits = runtime.config.limits
    body = {
        **powercontext_capabilities(runtime),
        "schema": "wiregate.capabilities.v1",
        "version": __version__,
        "deployment_id": runtime.config.deployment_id,
        "carriers": sorted(SHORT_NAMES),
        "routes": sorted(ROUTES),
        "providers": sorted({c.provider for c in CARRIERS.values()}),
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
        "context": context_capabilities(runtime),
        "attribution": {
            "schema": "wiregate.attribution-report.v1",
            "report": "/v1/attribution/report",
            "registry": "/v1/attribution/registry",
            "collection": "/v1/attribution/collection",
            "estimator": "runes/4@1",
            "label_header": "x-wiregate-blocks",
            "session_header": "x-wiregate-session",
            "retention_days": runtime.config.attribution.retention_days,
        },
    }
    return web.Response(text=json.dumps(body), content_type="application/json")
