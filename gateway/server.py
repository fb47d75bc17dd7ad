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
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from gateway.api.ui import end_lapsed_sessions
from gateway.app import create_app
from gateway.config.load import ConfigError, load_runtime, resolve
from gateway.config.runtime import RuntimeHolder
from gateway.http.connections import GuardedRunner, TLSSite
from gateway.listeners import ListenerError, prepare_socket_path, server_tls_context, set_socket_mode, socket_umask
from gateway.obs import logging as log
from gateway.proxy.offload import OFFLOAD
from gateway.startup import EARLY
from gateway.state import ATTRIBUTION, DRAINING, METRICS, WORKER


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
    _reloading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reload at a time

    @property
    def app(self) -> web.Application:
        return self.runner.app

    async def reload(self) -> bool:
        """Re-read everything (off the event loop); swap on success, keep the running runtime
        on failure. Reloads run one at a time, in the order asked: two SIGHUPs close together
        never apply the older files last."""
        async with self._reloading:
            return await self._reload()

    async def _reload(self) -> bool:
        metrics = self.app[METRICS]
        current = self.holder.current.generation
        try:
            runtime = await asyncio.to_thread(load_runtime, self.config_path, generation=current + 1)
        except ConfigError as exc:
            metrics.reloads.labels("failed").inc()
            log.error("config_reload_failed", reason=str(exc), generation=current)
            return False
        except Exception as exc:  # a file no loader foresaw: refused the same way, class only
            metrics.reloads.labels("failed").inc()
            log.error("config_reload_failed", error_class=type(exc).__name__, generation=current)
            return False
        self.holder.swap(runtime)
        try:
            await end_lapsed_sessions(self.app, runtime)
        except Exception as exc:  # the database went away: the new runtime still applies
            log.error("ui_sessions_update_failed", error_class=type(exc).__name__)
        attribution = self.app.get(ATTRIBUTION)
        if attribution is not None:  # its bounds follow the file like the registry does
            settings = runtime.config.attribution
            attribution.configure(retention_s=settings.retention_days * 86400, max_records=settings.max_records)
        _log_warnings(runtime.warnings)
        if self._tls is not None and self.tls_paths is not None:
            await self._reload_tls(self._tls, *self.tls_paths)
        metrics.reloads.labels("ok").inc()
        log.info(
            "config_reloaded",
            generation=runtime.generation,
            policy_version=runtime.policy.version,
            count=len(runtime.profiles),
        )
        return True

    @staticmethod
    async def _reload_tls(live: ssl.SSLContext, cert: Path, key: Path) -> None:
        """New connections get the new certificate — once the pair has loaded into a context
        of its own: loading into the live one installs the certificate before it finds the key
        does not match, and every handshake would fail from then on."""
        try:
            await asyncio.to_thread(_load_pair, live, cert, key)
        except (ListenerError, OSError, ssl.SSLError):
            log.error("tls_reload_failed", reason="certificate or key unreadable or not a pair: the old pair serves")

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
            await asyncio.to_thread(set_socket_mode, path, mode)
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


def _load_pair(live: ssl.SSLContext, cert: Path, key: Path) -> None:
    """Both files read once into a private copy, the copy checked as a pair in a context of
    its own, then loaded into the live one (a file replaced meanwhile changes nothing)."""
    with tempfile.TemporaryDirectory(prefix="wiregate-tls-") as tmp:
        copy_cert, copy_key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        copy_cert.write_bytes(cert.read_bytes())
        fd = os.open(copy_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.read_bytes())
        server_tls_context(copy_cert, copy_key)
        live.load_cert_chain(str(copy_cert), str(copy_key))


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
    if EARLY.stop:  # asked while starting
        stop.set()
    elif EARLY.reload:
        reload()
    try:
        await stop.wait()
    finally:
        log.info("stopping")
        await running.stop()
