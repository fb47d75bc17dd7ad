"""Release and refusal: what the client receives once a decision is made.

Owns: the allow-list of provider response headers passed back, releasing the original
bytes of a non-stream response, re-framing a buffered stream's parsed events as SSE, and
rendering refusals in the caller's provider dialect.
Must not: decide anything, or add content of its own to a released body.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.carriers import sse
from gateway.carriers.sse import SSEEvent
from gateway.errors import Dialect, GatewayError, render_body, response_headers

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
_PASS_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


def released_headers(upstream: CIMultiDictProxy[str] | Mapping[str, str]) -> dict[str, str]:
    """Provider response headers a client may see (rate limits, provider request ids)."""
    out: dict[str, str] = {}
    for name, value in upstream.items():
        low = name.lower()
        if low in _PASS_HEADERS or low.startswith(_PASS_PREFIXES):
            out[low] = value
    return out


def release_body(status: int, headers: Mapping[str, str], body: bytes, content_type: str) -> web.Response:
    """The provider's original bytes, unchanged."""
    h = CIMultiDict(headers)
    h["Content-Type"] = content_type
    return web.Response(status=status, body=body, headers=h)


def reframe(events: Sequence[SSEEvent]) -> bytes:
    return sse.frame(events)


def release_stream(status: int, headers: Mapping[str, str], framed: bytes) -> web.Response:
    """A buffered, checked stream, sent whole as SSE."""
    h = CIMultiDict(headers)
    h["Content-Type"] = "text/event-stream; charset=utf-8"
    h["Cache-Control"] = "no-cache"
    return web.Response(status=status, body=framed, headers=h)


def refusal(err: GatewayError, dialect: Dialect, request_id: str) -> web.Response:
    return web.Response(
        status=err.status,
        body=render_body(err, dialect, request_id),
        headers=response_headers(err),
    )
