"""Connections: what a client may hold open, and for how long, before a request exists.

Owns: the connection caps (in all, and per client: a TCP peer address or a Unix-socket
peer uid), the request-head deadline (from the first byte of a head to its end, and the
TLS handshake), the idle keep-alive limit, the content-free answer to a request aiohttp
cannot parse (its own error page echoes the request line), the `Expect` header taken off
before routing (aiohttp would answer `100 Continue` before any check, and an unknown value
with a page that echoes it), and the runner and sites that put them in place. Nothing
about a connection is logged but its listener, and requests that cannot be read as HTTP
as a sampled, content-free `bad_http` line with their count.
Must not: read bodies or know routes (the app does).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import secrets
import socket
import struct
import termios
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.http import HttpVersion11, RawRequestMessage
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.model import Limits
from gateway.obs import logging as log

# What every response says in `Server`: the product, no version (aiohttp's default names
# its own version and Python's, which tells a scanner which parser bugs to try).
SERVER_NAME = "wiregate"


def _raw_response(status: int, reason: str, code: str, message: str, reason_code: str) -> bytes:
    body = json.dumps(
        {"error": {"code": code, "message": message, "details": {"reason_codes": [reason_code]}}},
        separators=(",", ":"),
    ).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\nserver: {SERVER_NAME}\r\n"
        f"x-powercontext-request-id: {secrets.token_hex(8)}\r\n\r\n"
    )
    return head.encode() + body


BAD_HTTP_LOG_S = 60.0  # at most one `bad_http` line per minute (it counts the others)


@dataclass
class ConnectionGuard:
    """Shared by every connection of one runner (both listeners)."""

    limits: Limits
    open: int = 0
    per_client: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    head_timeouts: int = 0
    write_stalls: int = 0  # connections cut off because their client stopped reading
    bad_requests: int = 0  # requests that could not be read as HTTP
    _unlogged: int = 0  # of those, not yet in a `bad_http` line
    _logged_at: float | None = None

    def bad_http(self, error_class: str | None, now: float) -> None:
        """Count a request that could not be read as HTTP; at most one `bad_http` line per
        BAD_HTTP_LOG_S, with how many arrived since the last one."""
        self.bad_requests += 1
        self._unlogged += 1
        if self._logged_at is None or now - self._logged_at >= BAD_HTTP_LOG_S:
            log.warning("bad_http", count=self._unlogged, error_class=error_class)
            self._unlogged, self._logged_at = 0, now

    def admit(self, client: str) -> bool:
        if (
            self.open >= self.limits.max_connections
            or self.per_client[client] >= self.limits.max_connections_per_client
        ):
            self.refused += 1
            return False
        self.open += 1
        self.per_client[client] += 1
        return True

    def release(self, client: str) -> None:
        self.open -= 1
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]


def _send_queue(transport: asyncio.BaseTransport) -> int | None:
    """Bytes the kernel holds for the peer on this connection (TCP: not yet acknowledged;
    a Unix socket: not yet read), through TLS too; None where it cannot be read."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")  # SIOCOUTQ on a socket
    except (OSError, ValueError):
        return None
    return int(struct.unpack("i", answer)[0])


def client_of(transport: asyncio.BaseTransport) -> str:
    """Who a connection belongs to: the TCP peer address, or the Unix-socket peer's uid."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and peer:
        return f"tcp:{peer[0]}"
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_UNIX and hasattr(socket, "SO_PEERCRED"):
        try:
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return f"uid:{struct.unpack('3i', creds)[1]}"
        except OSError:
            pass
    return "unix"


class BodyFramingError(Exception):
    """A request body's framing (its chunks) broke while the body was being read."""


class GuardedHandler(RequestHandler):
    """aiohttp's request handler with the caps and the head deadline in front of it."""

    def __init__(self, manager: Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._client: str | None = None
        self._refused = False
        self._awaiting_head = True
        self._unread: Any = None  # the body of an answered request that is still arriving
        self._head_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_backlog: tuple[int, int | None] = (0, None)  # when the stall clock last started

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        client = client_of(transport)
        if not self._guard.admit(client):
            self._refused = True
            transport.write(  # type: ignore[attr-defined]
                _raw_response(
                    503,
                    "Service Unavailable",
                    "too_many_connections",
                    "Too many open connections.",
                    "too_many_connections",
                )
            )
            transport.close()
            return
        self._client = client
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_timer()
        self._cancel_write_timer()
        if self._refused:
            return
        if self._client is not None:
            self._guard.release(self._client)
            self._client = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """The head deadline starts with the first bytes of a head: never with the rest of
        the body of a request already answered (refused before it was read), which aiohttp
        reads and drops."""
        if self._awaiting_head and self._head_timer is None and data and self._unread is None:
            self._head_timer = self._loop.call_later(self._guard.limits.request_head_s, self._head_expired)
        heads = self._request_count
        super().data_received(data)
        if self._unread is not None and self._unread.at_eof():
            self._unread = None
        if self._request_count != heads and not isinstance(self._messages[-1][0], RawRequestMessage):
            # The parser refused what came: framing broken in the middle of a body being read
            # leaves that body waiting for bytes that will never come (aiohttp queues its 400
            # behind the request): the body's reader is told now.
            current = self._current_request
            if current is not None and not current.content.at_eof():
                current.content.set_exception(BodyFramingError())
        if self._request_count != heads:  # a whole head arrived
            self._cancel_head_timer()
            self._awaiting_head = False

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> tuple[Any, bool]:
        # Refused before `100 Continue`: the client may still send the body or may not, so
        # nothing after this answer on the connection can be read as a request.
        unsent_body = request.get(EXPECT) == CONTINUE and not request.get(CONTINUED)
        if unsent_body and not resp.prepared:
            resp.force_close()  # says `Connection: close`
        result = await super().finish_response(request, resp, start_time)
        # The next bytes start the next head, unless one already came (pipelined: its
        # request waits in aiohttp's queue, and the bytes after it are its body).
        self._awaiting_head = not self._messages
        self._unread = None if request.content.at_eof() else request.content
        if isinstance(request.content.exception(), BodyFramingError):
            self.force_close()  # nothing after broken framing can be read as a request
        if unsent_body or (resp.status in (408, 413) and not request.content.at_eof()):
            # A body that stalled or was too large is not waited for or drained (aiohttp
            # would linger reading it): the answer is out, close the connection now. (A
            # provider's 408 or 413, relayed after the whole body was read, keeps it open.)
            self.force_close()
        return result

    def pause_writing(self) -> None:
        """The send buffer is full: the client has until `write_stall_s` to read some of it
        (every write in flight — a released body, a heartbeat, a windowed event — waits on
        this, so one deadline here covers them all)."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_backlog = self._backlog()
            self._write_timer = self._loop.call_later(self._guard.limits.write_stall_s, self._write_stalled)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _backlog(self) -> tuple[int, int | None]:
        """What waits to reach the client: bytes in the transport's buffer, and bytes in the
        kernel's send queue (None where it cannot be read). The client reading shows in the
        kernel's queue first: the transport's buffer moves only once the kernel says the
        socket has room again, which may take a large share of its buffer."""
        transport = self.transport
        if not isinstance(transport, asyncio.WriteTransport):
            return 0, None
        return transport.get_write_buffer_size(), _send_queue(transport)

    def _write_stalled(self) -> None:
        """`write_stall_s` after the buffer filled: a client that read anything since keeps
        its connection (the clock starts again); one that read nothing is cut as if it had
        gone — every write waiting on it fails, the call ends and gives back what it held."""
        self._write_timer = None
        (buffered, queued), (was_buffered, was_queued) = self._backlog(), self._write_backlog
        read = buffered < was_buffered or (queued is not None and was_queued is not None and queued < was_queued)
        if read:  # some of it reached the client: slow, not stalled
            self._write_backlog = (buffered, queued)
            self._write_timer = self._loop.call_later(self._guard.limits.write_stall_s, self._write_stalled)
            return
        self._guard.write_stalls += 1
        if self.transport is not None:
            self.transport.abort()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        self._guard.head_timeouts += 1
        if self.transport is not None:
            self.transport.write(
                _raw_response(
                    408,
                    "Request Timeout",
                    "request_timeout",
                    "The request head did not arrive in time.",
                    "request_timeout",
                )
            )
        self.force_close()
        if self.transport is not None:
            self.transport.close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse: a fixed, content-free answer (aiohttp's own
        page quotes the request line back). Not aiohttp's error line per request either:
        garbage from a scanner would fill the error log; `bad_http` lines are sampled."""
        if request.writer.output_size > 0:  # as aiohttp: part of a response is out, the connection is broken
            raise ConnectionError("the response had started")
        error_class = type(exc).__name__ if exc is not None else None
        if status >= 500:
            log.error("internal_error", error_class=error_class)
        else:
            self._guard.bad_http(error_class, time.monotonic())
        code = "invalid_request" if 400 <= status < 500 else "internal_error"
        body = {
            "error": {
                "code": code,
                "message": "The request could not be processed as HTTP.",
                "details": {"reason_codes": ["invalid_request"]},
            }
        }
        fixed = web.Response(status=status, text=json.dumps(body), content_type="application/json")
        fixed.headers["x-powercontext-request-id"] = secrets.token_hex(8)
        fixed.headers["Server"] = SERVER_NAME
        fixed.force_close()
        return fixed


# The client's `Expect` header (HTTP/1.1 only; an HTTP/1.0 server ignores it), kept here,
# trimmed and lower-cased, instead of in the headers aiohttp routes on: the body reader
# sends `100 Continue` once the request passed every check before its body, and the app
# refuses any other value.
EXPECT = web.RequestKey("wiregate_expect", str)
CONTINUE = "100-continue"
CONTINUED = web.RequestKey("wiregate_continued", bool)  # `100 Continue` went out: the body may follow


def _expect_aside(factory: Callable[..., web.BaseRequest]) -> Callable[..., web.BaseRequest]:
    def make(message: RawRequestMessage, *args: Any) -> web.BaseRequest:
        # (aiohttp's stand-in message for a request it could not parse has a plain dict)
        values = message.headers.getall("Expect", ()) if isinstance(message.headers, CIMultiDictProxy) else ()
        if not values:
            return factory(message, *args)
        headers = CIMultiDict(message.headers)
        del headers["Expect"]
        request = factory(message._replace(headers=CIMultiDictProxy(headers)), *args)
        if message.version == HttpVersion11:
            request[EXPECT] = ", ".join(values).strip().lower()
        return request

    return make


class GuardedServer(Server):
    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=self._loop, guard=self.guard, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """An AppRunner whose connections go through one `ConnectionGuard`."""

    def __init__(self, app: web.Application, *, limits: Limits, **kwargs: Any) -> None:
        kwargs.setdefault("keepalive_timeout", limits.idle_connection_s)
        super().__init__(app, **kwargs)
        self.guard = ConnectionGuard(limits)

    async def _make_server(self) -> Server:
        default = await super()._make_server()
        server = GuardedServer(
            default.request_handler,
            request_factory=_expect_aside(default.request_factory),
            handler_cancellation=default.handler_cancellation,
            loop=default._loop,
            guard=self.guard,
            **default._kwargs,
        )
        return server


TLS_SHUTDOWN_S = 2.0  # how long a closed TLS connection waits for the client's close_notify


class TLSSite(web.TCPSite):
    """A TCP site whose TLS handshake has the request-head deadline."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *, handshake_s: float, **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._handshake_s = handshake_s

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            server,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
            ssl_handshake_timeout=self._handshake_s if self._ssl_context is not None else None,
            # Once the gateway closes a connection (a head deadline, an idle keep-alive), TLS
            # waits for the client's close_notify; a client that never sends it would keep its
            # connection slot for the default 30 s.
            ssl_shutdown_timeout=TLS_SHUTDOWN_S if self._ssl_context is not None else None,
        )
        if self._server.sockets:
            self._bound_port = self._server.sockets[0].getsockname()[1]
        else:
            self._bound_port = self._port
