"""Reading a request body whole, within every limit that protects the gateway.

Owns: the size limit (413), the accepted encodings (identity, gzip with a bounded inflater;
anything else 415), the media type (415), `100 Continue` for a client that waits for it
(sent only once those checks and the route's own passed), and the two clocks a trickling
client meets — the longest silence between body bytes and the longest time for the whole
body (both 408, `request_timeout`). Used by every route that reads a body.
Must not: parse or judge what the body says.
"""

from __future__ import annotations

import asyncio
import time
import zlib

from aiohttp import web

from gateway.config.model import Limits
from gateway.errors import ClientError
from gateway.http.connections import CONTINUE, CONTINUED, EXPECT, BodyFramingError
from gateway.vocab import ReasonCode


def _timeout() -> ClientError:
    return ClientError(408, "request_timeout", (ReasonCode.REQUEST_TIMEOUT,), retryable=True)


def _unsupported_encoding() -> ClientError:
    return ClientError(415, "unsupported_encoding", (ReasonCode.UNSUPPORTED_ENCODING,))


def _too_large() -> ClientError:
    return ClientError(413, "payload_too_large", (ReasonCode.PAYLOAD_TOO_LARGE,))


async def read_body(
    request: web.Request, limits: Limits, *, media_type: str = "application/json", max_bytes: int | None = None
) -> bytes:
    """The whole body, decoded. `max_bytes`: a route's own, smaller bound (a sign-in, a
    switch), held like the gateway's — on the declared length before anything is read (and
    before `100 Continue`), on the bytes as they arrive, and on the inflated size — so a
    small route never buffers or inflates more than it could use."""
    raw_limit = limits.request_bytes if max_bytes is None else min(limits.request_bytes, max_bytes)
    inflated_limit = (
        limits.decompressed_request_bytes if max_bytes is None else min(limits.decompressed_request_bytes, max_bytes)
    )
    # One Content-Encoding line naming one coding (lines are a list: "identity" then "gzip"
    # on two lines read as identity, once), and no transfer coding but chunked (the parser
    # de-chunks and would pass "gzip, chunked" through still compressed).
    encodings = request.headers.getall("content-encoding", ())
    if len(encodings) > 1:
        raise _unsupported_encoding()
    encoding = encodings[0].strip().lower() if encodings else "identity"
    if encoding not in ("identity", "gzip", ""):
        raise _unsupported_encoding()
    transfer = ",".join(request.headers.getall("transfer-encoding", ())).strip().lower()
    if transfer not in ("", "chunked"):
        raise _unsupported_encoding()
    if request.content_type != media_type:
        raise ClientError(415, "unsupported_media_type", (ReasonCode.UNSUPPORTED_MEDIA_TYPE,))
    if request.content_length is not None and request.content_length > raw_limit:
        raise _too_large()
    if request.get(EXPECT) == CONTINUE:  # every check before the body passed
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started
        request[CONTINUED] = True
    chunks: list[bytes] = []
    total = 0
    deadline = time.monotonic() + limits.body_total_s
    while True:
        wait = min(limits.body_idle_s, deadline - time.monotonic())
        if wait <= 0:
            raise _timeout()
        try:
            async with asyncio.timeout(wait):
                chunk = await request.content.readany()
        except TimeoutError:
            raise _timeout() from None
        except BodyFramingError:
            raise ClientError(400, "invalid_request", (ReasonCode.INVALID_REQUEST,)) from None
        if not chunk:
            break
        total += len(chunk)
        if total > raw_limit:
            raise _too_large()
        chunks.append(chunk)
    raw = b"".join(chunks)
    if encoding == "gzip":
        raw = _gunzip(raw, inflated_limit)
    return raw


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        raise ClientError(400, "invalid_request", (ReasonCode.INVALID_REQUEST,)) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise _too_large()
    if not inflater.eof or inflater.unused_data:
        raise ClientError(400, "invalid_request", (ReasonCode.INVALID_REQUEST,))
    return out
