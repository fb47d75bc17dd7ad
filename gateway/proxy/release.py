"""Release and refusal: what the client receives once a decision is made.

Owns: the allow-list of provider response headers passed back, releasing the original
bytes of a non-stream response, re-framing a buffered stream's parsed events as SSE,
rendering refusals in the caller's provider dialect, and the retry advice every failed
answer carries once wiregate itself has retried (`retry_advice`).
Must not: decide anything, or add content of its own to a released body.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway import hop
from gateway.carriers import sse
from gateway.carriers.sse import SSEEvent
from gateway.errors import GatewayError, render_body, response_headers
from gateway.vocab import Dialect

_PASS_HEADERS = frozenset(
    {
        "x-request-id",
        "request-id",
        "retry-after",
        "retry-after-ms",
        "x-should-retry",
        "openai-processing-ms",
        "openai-version",
        "anthropic-organization-id",
    }
)
# A rate-limit header name: the prefix, then a short lowercase name (the rest of a name is
# text the provider chose, so it is held to a form that cannot carry much).
_PASS_NAME = re.compile(r"(?:x-ratelimit|anthropic-ratelimit)-[a-z][a-z0-9-]{0,47}")
# What these headers hold: counts, durations ("6m0s", "1.5s"), timestamps, ids.
_PASS_VALUE = re.compile(r"[A-Za-z0-9 .:+_-]{0,128}")


def released_headers(upstream: CIMultiDictProxy[str] | Mapping[str, str]) -> dict[str, str]:
    """Provider response headers a client may see (rate limits, provider request ids),
    only in the forms such headers have; before_release inspects names and values too.
    None that the response's Connection header lists (hop-by-hop, RFC 9110 §7.6.1)."""
    listed = hop.connection_listed(upstream)
    out: dict[str, str] = {}
    for name, value in upstream.items():
        low = name.lower()
        if low in listed:
            continue
        if (low in _PASS_HEADERS or _PASS_NAME.fullmatch(low)) and _PASS_VALUE.fullmatch(value):
            out[low] = value
    return out


def released_content_type(upstream: str | None) -> str:
    """A released non-stream body is JSON (anything else was refused): the client gets our
    own content type, never a value the provider chose."""
    if upstream is not None and upstream.replace(" ", "").lower() == "application/json;charset=utf-8":
        return "application/json; charset=utf-8"
    return "application/json"


def release_body(status: int, headers: Mapping[str, str], body: bytes, content_type: str) -> web.Response:
    """The provider's original bytes, unchanged."""
    h = CIMultiDict(headers)
    h["Content-Type"] = content_type
    return web.Response(status=status, body=body, headers=h)


SHOULD_RETRY = "x-should-retry"


def retry_advice(status: int, attempts: int) -> dict[str, str]:
    """Headers that stop the caller's SDK from retrying what wiregate already retried.

    The official SDKs retry 408/409/429/5xx themselves (two retries by default) unless the
    response says `x-should-retry: false`; their retries on top of ours would multiply the
    upstream attempts (3 x 3 for a persistent 503). So any non-2xx answer to a call that
    made more than one upstream attempt (retries, or a fallback profile) says false, for
    every status and body type: a released provider error, our own refusal, or a stream.
    A call with a single attempt gets no advice: retrying is then the SDK's to decide."""
    if attempts > 1 and not 200 <= status < 300:
        return {SHOULD_RETRY: "false"}
    return {}


def reframe(events: Sequence[SSEEvent]) -> bytes:
    return sse.frame(events)


def release_stream(status: int, headers: Mapping[str, str], framed: bytes) -> web.Response:
    """A buffered, checked stream, sent whole as SSE."""
    h = CIMultiDict(headers)
    h["Content-Type"] = "text/event-stream; charset=utf-8"
    h["Cache-Control"] = "no-cache"
    return web.Response(status=status, body=framed, headers=h)


def refusal(err: GatewayError, dialect: Dialect, request_id: str) -> web.Response:
    response = web.Response(
        status=err.status,
        body=render_body(err, dialect, request_id),
        headers=response_headers(err),
    )
    if err.status in (408, 413):
        # The rest of the body is not worth reading (or waiting for): close, don't linger.
        response.force_close()
    return response
