"""Calls the gateway makes for itself: embeddings for the context store's vectors.

An embedding call sends memory text to a provider, so it is an outbound call like any
other (SPEC §10.2): the configured embeddings profile, the same before_send checks on the
exact body, the same send path with its retries, the whole response buffered and checked
before_release (the release ledger admits it once), and only then are the vectors read.
Any refusal or failure is `InferenceUnavailable` (the store records the vector as missing,
and `auto` search falls back to fts); running out of time is `InferenceTimeout`.

The caller of record is the gateway itself: principal `wiregate.context`, scope `~context`.
Owns: building and checking that one request and reading its vectors.
Must not: log the texts or the vectors.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gateway.carriers import CARRIERS
from gateway.checks import runner
from gateway.checks.destination import Target
from gateway.checks.runner import Party
from gateway.context.errors import InferenceTimeout, InferenceUnavailable
from gateway.errors import GatewayError
from gateway.obs import logging as log
from gateway.proxy import decide, routing
from gateway.proxy.upstream import UPSTREAM, upstream_headers
from gateway.state import LOCAL_RELEASE_LEDGER, RUNTIME
from gateway.vocab import Mode, ReasonCode

PRINCIPAL = "wiregate.context"
SCOPE = "~context"
ROUTE = "/v1/embeddings"


async def embed(app: web.Application, texts: list[str]) -> list[list[float]]:
    runtime = app[RUNTIME].current
    cfg = runtime.config.context
    loaded = runtime.profiles.get(cfg.embeddings_profile or "")
    carrier = CARRIERS["openai.embeddings"]
    # The same profile rules as any call: valid now, a retention the policy accepts, the model served.
    if (
        loaded is None
        or loaded.credential_error is not None
        or not routing.usable(runtime, loaded, carrier.short_name, cfg.embeddings_model, datetime.now(UTC))
    ):
        log.info("embedding_withheld", reason_codes=[ReasonCode.NO_PROFILE], profile=cfg.embeddings_profile or "")
        raise InferenceUnavailable()
    request: dict[str, Any] = {"model": cfg.embeddings_model, "input": texts, "encoding_format": "float"}
    if cfg.embeddings_dimensions is not None:
        request["dimensions"] = cfg.embeddings_dimensions
    body = json.dumps(request).encode()
    party = Party(PRINCIPAL, None, SCOPE, loaded)
    target = Target.for_profile(loaded, carrier.name, carrier.path)
    headers = upstream_headers(loaded.profile, loaded.credential, {})
    try:
        parsed = decide.parse_request(carrier, body, runtime)
        prepared = decide.prepare_send(
            runtime, carrier, parsed, body, party, target, headers, session=None, route=ROUTE
        )
    except GatewayError:
        raise InferenceUnavailable() from None
    send = prepared.outcome
    if send.mode is not Mode.ENFORCE or not send.verdict.allowed or send.binding is None:
        log.info("embedding_withheld", reason_codes=send.verdict.reason_codes, profile=loaded.profile.id)
        raise InferenceUnavailable()  # observe mode never applies to the gateway's own calls
    deadline = time.monotonic() + cfg.embed_timeout_s
    sent = await app[UPSTREAM].send(target, loaded, prepared.body, headers, deadline=deadline)
    response = sent.response
    if response is None:
        raise InferenceTimeout() if sent.failure == "upstream_timeout" else InferenceUnavailable()
    try:
        if response.status != 200:
            raise InferenceUnavailable()
        raw = await response.content.read(runtime.config.limits.response_bytes + 1)
        if len(raw) > runtime.config.limits.response_bytes:
            raise InferenceUnavailable()
    finally:
        response.close()
    read = decide.read_response(
        runtime,
        carrier,
        raw,
        is_stream=False,
        usage_injected=False,
        party=party,
        headers={"content-type": "application/json"},
        mode=Mode.ENFORCE,
        now=time.time(),
    )
    outcome = await runner.before_release(
        runtime,
        party,
        read.released,
        (read.verdict, read.mode),
        request_binding=send.binding,
        ledger=app[LOCAL_RELEASE_LEDGER],
        seal=False,  # the vectors stay in the gateway
    )
    if not outcome.proceed or not read.complete:
        log.info("embedding_withheld", reason_codes=outcome.verdict.reason_codes, profile=loaded.profile.id)
        raise InferenceUnavailable()
    return _vectors(raw, len(texts))


def _vectors(raw: bytes, count: int) -> list[list[float]]:
    try:
        doc: Any = json.loads(raw)
        data = sorted(doc["data"], key=lambda item: item["index"])
        vectors = [[float(x) for x in item["embedding"]] for item in data]
    except (ValueError, KeyError, TypeError):
        raise InferenceUnavailable() from None
    if len(vectors) != count or any(not v for v in vectors):
        raise InferenceUnavailable()
    return vectors
