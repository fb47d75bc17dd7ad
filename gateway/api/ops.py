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
from gateway.proxy.upstream import UPSTREAM
from gateway.state import METRICS, RUNTIME, USAGE_LEDGER
from gateway.usage import KINDS
from gateway.vocab import Dialect


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    upstream = app.get(UPSTREAM)
    ready = upstream is not None and not upstream.session.closed and bool(app[RUNTIME].current.profiles)
    return web.json_response({"status": "ready" if ready else "not_ready"}, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    auth.identify(request.app[RUNTIME].current, request.headers, "observe")
    return web.Response(body=request.app[METRICS].render(), content_type="text/plain", charset="utf-8")


def dialect_of(request: web.Request) -> Dialect:
    """/v1/models answers in Anthropic's shape to Anthropic's SDK (which sends its version)."""
    return Dialect.ANTHROPIC if "anthropic-version" in request.headers else Dialect.OPENAI


async def models(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME].current
    identity = auth.identify(runtime, request.headers, "proxy")
    seen: dict[str, str] = {}
    for pid in identity.principal.profiles:
        loaded = runtime.profiles.get(pid)
        if loaded is None:
            continue
        for name in loaded.profile.models:
            if not any(c in name for c in "*?[") and name not in seen:
                seen[name] = loaded.profile.provider
    if dialect_of(request) is Dialect.ANTHROPIC:
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
