"""The bundled mock provider, served by the gateway itself when `[mock_provider] enabled`.

Owns: the cleanup context that starts the mock provider (gateway/mockprovider) on
127.0.0.1 at the configured port when the app starts and stops it when the app stops, its
AppKey, and whether it is serving (readiness).
Must not: listen anywhere but loopback, or change how the gateway reaches it — the mock-*
profiles call it over real loopback TCP like any provider (signed profile, destination
check, credential, both checks).

Why in-process, on the gateway's own event loop, rather than a supervised child process:
the mock is a development fixture whose load is the developer's own calls, and every
handler of it is asynchronous (its delays are `asyncio.sleep`), so it cannot stall the
loop; in return there is nothing to supervise — no second interpreter, no PID to reap, no
orphan after a crash — it starts in milliseconds before the gateway's listeners, and it
stops in the same `runner.cleanup()` as the gateway, after in-flight calls have finished
(cleanup contexts run in reverse order, so the upstream session closes before it).
Settings take effect at start; a reload does not move it. Under `wiregate serve --workers N`
only worker 0 serves it (one mock, one record of what it received).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from gateway.config.load import read_reference
from gateway.listeners import ListenerError
from gateway.mockprovider import MockState, create_app
from gateway.mockprovider.server import start_runner, stop_runner, tcp_port
from gateway.obs import logging as log
from gateway.state import RUNTIME, WORKER

LOOPBACK = "127.0.0.1"


@dataclass
class EmbeddedMock:
    """The running mock provider: its runner and the port it is bound to."""

    runner: web.AppRunner
    state: MockState  # what it has received (the demo counts it)
    port: int | None
    stopped: bool = False

    @property
    def serving(self) -> bool:
        server = self.runner.server
        return not self.stopped and server is not None and self.port is not None


MOCK_PROVIDER = web.AppKey("wiregate_mock_provider", EmbeddedMock)


async def embedded_mock(app: web.Application) -> AsyncIterator[None]:
    """Start the mock provider when the configuration enables it (a cleanup context)."""
    runtime = app[RUNTIME].current
    settings = runtime.config.mock_provider
    if not settings.enabled or app.get(WORKER, 0) != 0:  # under --workers N, worker 0 serves it
        yield
        return
    api_key = None
    if settings.api_key is not None:
        value = await asyncio.to_thread(read_reference, settings.api_key, runtime.base_dir, "mock_provider.api_key")
        api_key = value.strip() or None
    state = MockState(api_key=api_key)
    try:
        runner = await start_runner(create_app(state), host=LOOPBACK, port=settings.port, uds=None)
    except OSError as exc:
        raise ListenerError(
            f"mock provider: cannot listen on {LOOPBACK}:{settings.port} ({exc.strerror or type(exc).__name__}); "
            "is another gateway or `wiregate mock-provider` running? ([mock_provider] in wiregate.toml)"
        ) from None
    mock = app[MOCK_PROVIDER] = EmbeddedMock(runner, state, tcp_port(runner))
    log.info("listening", listener="mock_provider", address=f"{LOOPBACK}:{mock.port}")
    try:
        yield
    finally:
        mock.stopped = True
        await stop_runner(runner, None)
