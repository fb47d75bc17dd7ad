"""Runners for the mock provider: a background-thread server for tests and the CLI loop.

* `MockProviderServer` runs the app on its own event loop in a daemon thread, so
  synchronous and asynchronous tests alike can use it (``with MockProviderServer()
  as server: ...``).
* `serve_forever` is what ``wiregate mock-provider`` awaits.

Both listen on loopback TCP and/or a Unix socket, and both use
``handler_cancellation=True`` so a client disconnect cancels the request handler
(recorded as ``cancelled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import stat
import threading
from types import TracebackType

from aiohttp import web

from .app import create_app
from .cache import DEFAULT_CACHE_MIN_TOKENS
from .state import MockState, time_scale_from_env

logger = logging.getLogger("wiregate.mockprovider")

_SHUTDOWN_TIMEOUT_S = 2.0
_START_TIMEOUT_S = 10.0


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the mock provider only listens on loopback, not {host!r}")


def _remove_stale_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)


async def start_runner(app: web.Application, *, host: str, port: int | None, uds: str | None) -> web.AppRunner:
    """Set up `app` and start a TCP site (if `port` is not None) and/or a UDS site."""
    if port is None and uds is None:
        raise ValueError("give a TCP port, a Unix socket path, or both")
    _require_loopback(host)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        if port is not None:
            await web.TCPSite(runner, host, port).start()
        if uds is not None:
            _remove_stale_socket(uds)
            await web.UnixSite(runner, uds).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def tcp_port(runner: web.AppRunner) -> int | None:
    """The bound TCP port of `runner` (None when it only listens on a Unix socket)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return int(address[1])
    return None


async def stop_runner(runner: web.AppRunner, uds: str | None) -> None:
    await runner.cleanup()
    if uds is not None:
        _remove_stale_socket(uds)


def _format_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class MockProviderServer:
    """The mock provider on a background thread.

    With ``uds`` set it listens on that Unix socket only; otherwise on loopback TCP
    (``port=0`` picks a free port).  `url` is the base URL to give an SDK (add
    ``/v1`` for OpenAI); over a Unix socket it is ``http://localhost``, to be used
    with a UDS transport.  `cache_min_tokens` is the Anthropic minimum cacheable
    prefix (`MockState.cache_min_tokens`; settable later through `state`).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        uds: str | None = None,
        api_key: str | None = None,
        cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
        time_scale: float | None = None,
    ) -> None:
        _require_loopback(host)
        self._host = host
        self._requested_port = port
        self._uds = uds
        scale = time_scale_from_env() if time_scale is None else time_scale
        self._state = MockState(api_key=api_key, cache_min_tokens=cache_min_tokens, time_scale=scale)
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    @property
    def state(self) -> MockState:
        return self._state

    @property
    def uds(self) -> str | None:
        return self._uds

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the mock provider is not listening on TCP")
        return self._port

    @property
    def url(self) -> str:
        if self._uds is not None:
            return "http://localhost"
        return _format_url(self._host, self.port)

    def start(self) -> MockProviderServer:
        """Start listening; returns once the socket is bound."""
        if self._thread is not None:
            raise RuntimeError("the mock provider was already started")
        self._thread = threading.Thread(target=self._run, name="wiregate-mockprovider", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise RuntimeError("the mock provider did not start in time")
        if self._startup_error is not None:
            self._thread.join()
            raise RuntimeError("the mock provider failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        """Cancel in-flight handlers, close the listeners and join the thread."""
        loop, stop_event, thread = self._loop, self._stop_event, self._thread
        if thread is None:
            return
        if loop is not None and stop_event is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # loop already finished
                loop.call_soon_threadsafe(stop_event.set)
        thread.join()
        self._thread = None

    def __enter__(self) -> MockProviderServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop_event = asyncio.Event()
        port = None if self._uds is not None else self._requested_port
        try:
            runner = await start_runner(create_app(self._state), host=self._host, port=port, uds=self._uds)
        except BaseException as error:
            self._startup_error = error
            self._ready.set()
            return
        self._port = tcp_port(runner)
        self._ready.set()
        try:
            await self._stop_event.wait()
        finally:
            await stop_runner(runner, self._uds)


async def serve_forever(
    *,
    host: str,
    port: int | None,
    uds: str | None,
    api_key: str | None,
    cache_min_tokens: int = DEFAULT_CACHE_MIN_TOKENS,
    time_scale: float | None = None,
) -> None:
    """Run the mock provider until cancelled (``wiregate mock-provider``)."""
    scale = time_scale_from_env() if time_scale is None else time_scale
    state = MockState(api_key=api_key, cache_min_tokens=cache_min_tokens, time_scale=scale)
    runner = await start_runner(create_app(state), host=host, port=port, uds=uds)
    bound_port = tcp_port(runner)
    endpoints = [_format_url(host, bound_port)] if bound_port is not None else []
    endpoints += [f"unix:{uds}"] if uds is not None else []
    logger.info(
        "mock provider listening on %s (API key %s)",
        ", ".join(endpoints),
        "required" if api_key else "not required",
    )
    try:
        await asyncio.Event().wait()
    finally:
        await stop_runner(runner, uds)
