"""Writing a `Reply` to the client, applying a step's timing and fault injection.

This module owns *how* bytes leave the mock: header delay, slow drip between stream
events, small socket writes (`split_bytes`), and the faults ``reset_before_headers``
(the request was read, then the connection drops with nothing written), ``reset_mid_stream``,
``truncated_json``, ``hang`` and ``hang_after_headers``.  Every response is written
inside the handler with a `web.StreamResponse`, so the caller learns whether the
whole answer really went out, and a `Progress` observer hears when the headers and
each write leave.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from .reply import Reply
from .state import Step

_SPLIT_PAUSE_S = 0.001
_ABORT_FLUSH_POLLS = 1000  # x _SPLIT_PAUSE_S: give up flushing after about a second


class Progress(Protocol):
    """Observer of a delivery (the request record, in the app)."""

    def headers_sent(self, status: int) -> None: ...

    def writing(self) -> None:
        """Called just before each write of response bytes (including the end marker)."""


@dataclass(frozen=True)
class Delivered:
    """Outcome of `deliver`: the response object and whether it was fully written."""

    response: web.StreamResponse
    complete: bool
    client_gone: bool = False


async def _sleep_forever() -> None:
    """Park the handler until it is cancelled (client disconnect or shutdown)."""
    await asyncio.get_running_loop().create_future()


class _Sender:
    """Writes one response as `step` prescribes and reports progress."""

    def __init__(self, request: web.Request, reply: Reply, step: Step, progress: Progress):
        self._request = request
        self._step = step
        self._progress = progress
        self.response = web.StreamResponse(status=reply.status)
        self.response.headers["Content-Type"] = reply.content_type
        if reply.is_stream:
            self.response.headers["Cache-Control"] = "no-cache"
        self.response.headers.update(reply.headers)
        self._wrote_any = False

    async def start(self, content_length: int | None = None) -> None:
        """Send the status line and headers (chunked when `content_length` is None)."""
        self.response.content_length = content_length
        await self.response.prepare(self._request)
        self._progress.headers_sent(self.response.status)

    async def write(self, data: bytes) -> None:
        """Write `data`, in writes of at most ``split_bytes`` with a pause between."""
        size = self._step.split_bytes or len(data) or 1
        for offset in range(0, len(data), size):
            if self._step.split_bytes and self._wrote_any:
                await asyncio.sleep(_SPLIT_PAUSE_S)
            self._progress.writing()
            await self.response.write(data[offset : offset + size])
            self._wrote_any = True

    async def write_events(self, events: Sequence[bytes]) -> None:
        """One write per event with ``drip_ms`` between; with ``split_bytes`` and no drip,
        the events are joined first so writes also straddle event boundaries."""
        if self._step.split_bytes is not None and not self._step.drip_ms:
            events = [b"".join(events)]
        for index, event in enumerate(events):
            if index and self._step.drip_ms:
                await asyncio.sleep(self._step.drip_ms / 1000)
            await self.write(event)

    async def finish(self) -> Delivered:
        self._progress.writing()
        await self.response.write_eof()
        return Delivered(self.response, complete=True)

    async def abort(self) -> Delivered:
        """Drop the connection once the bytes written so far have left the process."""
        transport = self._request.transport
        if transport is not None:
            for _ in range(_ABORT_FLUSH_POLLS):
                if not transport.get_write_buffer_size():
                    break
                await asyncio.sleep(_SPLIT_PAUSE_S)
            transport.abort()
        return Delivered(self.response, complete=False)


async def _deliver_body(sender: _Sender, body: bytes, fault: str | None) -> Delivered:
    if fault == "truncated_json":
        body = body[: len(body) // 2]
    # For a reset the declared length stays that of the full body: the client
    # must see a short read, not a complete (shorter) message.
    await sender.start(content_length=len(body))
    if fault == "hang_after_headers":
        await _sleep_forever()
    if fault == "reset_mid_stream":
        await sender.write(body[: len(body) // 2])
        return await sender.abort()
    await sender.write(body)
    return await sender.finish()


async def _deliver_stream(sender: _Sender, events: list[bytes], fault: str | None) -> Delivered:
    if fault == "truncated_json":
        events = events[:-1]
    await sender.start()
    if fault == "hang_after_headers":
        await sender.write_events(events[:1])
        await _sleep_forever()
    if fault == "reset_mid_stream":
        await sender.write_events(events[: max(1, len(events) // 2)])
        return await sender.abort()
    await sender.write_events(events)
    return await sender.finish()


async def deliver(request: web.Request, reply: Reply, step: Step, progress: Progress) -> Delivered:
    """Send `reply` as `step` prescribes.

    A client that goes away mid-write is reported as ``client_gone`` rather than
    raised, so aiohttp does not log it as a handler error.  Cancellation propagates.
    """
    if step.delay_ms:
        await asyncio.sleep(step.delay_ms / 1000)
    if step.fault == "hang":
        await _sleep_forever()
    sender = _Sender(request, reply, step, progress)
    if step.fault == "reset_before_headers":
        return await sender.abort()
    try:
        if reply.events is not None:
            return await _deliver_stream(sender, list(reply.events), step.fault)
        return await _deliver_body(sender, reply.body, step.fault)
    except ConnectionResetError:
        return Delivered(sender.response, complete=False, client_gone=True)
