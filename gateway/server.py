"""Running the app: listeners up, SIGHUP reload, graceful stop.

Owns: `RunningGateway` (start the one Application on the TLS TCP site and the UDS site,
report their addresses, reload configuration atomically, stop cleanly and remove the
socket file) and `serve` (the CLI's foreground loop with signal handling).
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from gateway.api.ui import end_lapsed_sessions
from gateway.app import create_app
from gateway.config.load import ConfigError, load_runtime, resolve
from gateway.config.runtime import RuntimeHolder
from gateway.http.connections import GuardedRunner, TLSSite
from gateway.listeners import prepare_socket_path, server_tls_context, socket_umask
from gateway.obs import logging as log
from gateway.proxy.offload import OFFLOAD
from gateway.state import DRAINING, METRICS, WORKER


@dataclass
class RunningGateway:
    config_path: Path
    holder: RuntimeHolder
    runner: web.AppRunner
    https_port: int | None = None
    uds_path: Path | None = None
    sites: list[web.BaseSite] = field(default_factory=list)
    tls_paths: tuple[Path, Path] | None = None
    _tls: ssl.SSLContext | None = None

    @property
    def app(self) -> web.Application:
        return self.runner.app

    async def reload(self) -> bool:
        """Re-read everything (off the event loop); swap on success, keep the running runtime
        on failure."""
        metrics = self.app[METRICS]
        try:
            runtime = await asyncio.to_thread(
                load_runtime, self.config_path, generation=self.holder.current.generation + 1
            )
        except ConfigError as exc:
            metrics.reloads.labels("failed").inc()
            log.error("config_reload_failed", reason=str(exc), generation=self.holder.current.generation)
            return False
        self.holder.swap(runtime)
        end_lapsed_sessions(self.app, runtime)
        _log_warnings(runtime.warnings)
        if self._tls is not None and self.tls_paths is not None:
            try:  # new connections get the new certificate
                await asyncio.to_thread(self._tls.load_cert_chain, str(self.tls_paths[0]), str(self.tls_paths[1]))
            except (OSError, ssl.SSLError):
                log.error("tls_reload_failed", reason="certificate or key unreadable")
        metrics.reloads.labels("ok").inc()
        log.info(
            "config_reloaded",
            generation=runtime.generation,
            policy_version=runtime.policy.version,
            count=len(runtime.profiles),
        )
        return True

    async def stop(self) -> None:
        """Readiness turns 503 first (for `server.drain_s`), then the listeners close and
        in-flight calls finish within `server.shutdown_grace_s`; the ledgers flush last."""
        app = self.runner.app
        if not app[DRAINING].on:
            app[DRAINING].on = True
            log.info("draining")
            drain = self.holder.current.config.server.drain_s
            if drain > 0:
                await asyncio.sleep(drain)
        await self.runner.cleanup()
        if self.uds_path is not None:
            await asyncio.to_thread(self.uds_path.unlink, missing_ok=True)


@dataclass(frozen=True)
class Shared:
    """What a worker of `wiregate serve --workers N` gets from its supervisor: the HTTPS port
    every worker binds with SO_REUSEPORT, and the Unix socket the supervisor bound (its path
    is the supervisor's to remove)."""

    https_port: int | None
    uds: socket.socket | None
    index: int = 0


async def start(
    config_path: Path,
    *,
    https_port: int | None = None,
    uds_path: Path | None = None,
    shared: Shared | None = None,
) -> RunningGateway:
    """Load, build and start listening. Overrides are for tests and benchmarks; `shared`
    for a worker under the supervisor. Everything that reads files or compiles runs off the
    event loop."""
    config_path = await asyncio.to_thread(config_path.resolve)
    runtime = await asyncio.to_thread(load_runtime, config_path)
    holder = RuntimeHolder(runtime)
    app = create_app(holder, config_path=config_path)
    if shared is not None:
        app[WORKER] = shared.index
    cfg = runtime.config
    runner = GuardedRunner(
        app,
        limits=cfg.limits,
        handler_cancellation=True,
        auto_decompress=False,
        access_log=None,
        shutdown_timeout=cfg.server.shutdown_grace_s,
    )
    await runner.setup()
    running = RunningGateway(config_path=config_path, holder=holder, runner=runner)
    base = runtime.base_dir
    try:
        if cfg.server.https is not None:
            cert, key = resolve(base, cfg.server.https.cert), resolve(base, cfg.server.https.key)
            tls = await asyncio.to_thread(server_tls_context, cert, key)
            port = cfg.server.https.port if https_port is None else https_port
            if shared is not None and shared.https_port is not None:
                port = shared.https_port
            site: web.BaseSite = TLSSite(
                runner,
                cfg.server.https.host,
                port,
                ssl_context=tls,
                handshake_s=cfg.limits.request_head_s,
                reuse_port=shared is not None,
            )
            await site.start()
            running.sites.append(site)
            running._tls, running.tls_paths = tls, (cert, key)
            server = getattr(site, "_server", None)
            sockets = getattr(server, "sockets", None) or []
            running.https_port = sockets[0].getsockname()[1] if sockets else port
            log.info("listening", listener="https", address=f"{cfg.server.https.host}:{running.https_port}")
        if cfg.server.uds is not None and shared is not None and shared.uds is not None:
            site = web.SockSite(runner, shared.uds)
            await site.start()
            running.sites.append(site)
            log.info("listening", listener="uds", address=str(shared.uds.getsockname()))
        elif cfg.server.uds is not None:
            path = uds_path or resolve(base, cfg.server.uds.path)
            mode = int(cfg.server.uds.mode, 8)
            await asyncio.to_thread(prepare_socket_path, path)
            old = os.umask(socket_umask(mode))
            try:
                site = web.UnixSite(runner, str(path))
                await site.start()
            finally:
                os.umask(old)
            await asyncio.to_thread(os.chmod, path, mode)
            running.sites.append(site)
            running.uds_path = path
            log.info("listening", listener="uds", address=str(path))
    except BaseException:
        await running.stop()
        raise
    _log_warnings(runtime.warnings)
    log.info(
        "started",
        generation=runtime.generation,
        policy_version=runtime.policy.version,
        count=len(runtime.profiles),
        engine=runtime.policy.engine.matcher.engine,
    )
    return running


def _log_warnings(warnings: tuple[str, ...]) -> None:
    for warning in warnings:
        log.warning("insecure_configuration", reason=warning)


async def serve(config_path: Path, shared: Shared | None = None) -> None:
    """Foreground: serve until SIGINT/SIGTERM; SIGHUP reloads."""
    running = await start(config_path, shared=shared)
    # Everything loaded so far (compiled databases, profiles, modules) lives for the whole
    # process: keep it out of the cyclic collector's scans.
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[bool]] = set()

    offload = running.runner.app[OFFLOAD]
    offload.warm_soon(running.holder.current)  # large calls find warm workers

    async def reload_and_warm() -> bool:
        reloaded = await running.reload()
        if reloaded:
            offload.warm_soon(running.holder.current)
        return reloaded

    def reload() -> None:
        task = asyncio.create_task(reload_and_warm())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, reload)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await running.stop()
