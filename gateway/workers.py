"""One gateway per core: `wiregate serve --workers N`.

Owns: the supervisor — it binds what the workers share (the Unix socket, bound once and
inherited by every worker; the HTTPS port, reserved here and bound by each worker with
SO_REUSEPORT so the kernel spreads connections over them), starts N worker processes of
`wiregate serve` on the same configuration, forwards SIGHUP (every worker reloads) and
SIGTERM/SIGINT (every worker drains and stops; then the socket file is removed), and restarts
a worker that dies, the others reloading with it so all serve the files on disk as the new
one does — unless workers keep dying right after they start (a configuration that cannot
serve), when it stops them all and fails.
Must not: serve requests or load the configuration beyond the listener settings.

What each worker keeps to itself: its concurrency limits (`concurrent_buffered_responses`,
`per_principal_concurrent` apply per worker), its check-worker pool, and proxied calls'
send bindings. What they share: the configuration files, the key ring, and the one database
(release ledger for presented bindings, usage, the context store, the /ui/ sessions).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from gateway.config.load import read_config, resolve
from gateway.listeners import prepare_socket_path, set_socket_mode, socket_umask
from gateway.obs import logging as log
from gateway.startup import EARLY, blocked_while_starting

ENV_WORKER = "WIREGATE_WORKER"
ENV_HTTPS_PORT = "WIREGATE_WORKER_HTTPS_PORT"
ENV_UDS_FD = "WIREGATE_WORKER_UDS_FD"

QUICK_DEATH_S = 5.0  # a worker that dies sooner than this after starting counts as a failed start
QUICK_DEATHS = 3  # in a row: stop everything, unless another worker is still serving
RESPAWN_BACKOFF_S = 5.0  # then a failing slot is tried again this often (the files may be fixed)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    started: float


class Supervisor:
    def __init__(self, config_path: Path, count: int) -> None:
        self.config_path = config_path.resolve()
        self.count = count
        self.workers: list[_Worker] = []
        self.stopping = False
        self.reload_pending = False
        self.quick_deaths = 0
        self._respawn_at: dict[int, float] = {}  # slot → when to try starting it again
        self._port_holder: socket.socket | None = None
        self._uds: socket.socket | None = None
        self._uds_path: Path | None = None
        self._https_port: int | None = None

    # --- shared listeners ---------------------------------------------------------------

    def bind(self) -> None:
        config = read_config(self.config_path)
        base = self.config_path.parent
        if config.server.https is not None:
            holder = socket.socket(socket.AF_INET6 if ":" in config.server.https.host else socket.AF_INET)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            holder.bind((config.server.https.host, config.server.https.port))
            self._port_holder = holder  # bound, never listening: it only reserves the port
            self._https_port = holder.getsockname()[1]
        if config.server.uds is not None:
            path = resolve(base, config.server.uds.path)
            mode = int(config.server.uds.mode, 8)
            prepare_socket_path(path)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old = os.umask(socket_umask(mode))
            try:
                sock.bind(str(path))
            finally:
                os.umask(old)
            set_socket_mode(path, mode)
            sock.listen(512)
            sock.set_inheritable(True)
            self._uds, self._uds_path = sock, path

    # --- workers ------------------------------------------------------------------------

    def _spawn(self, index: int) -> _Worker:
        env = dict(os.environ)
        env[ENV_WORKER] = str(index)
        pass_fds: tuple[int, ...] = ()
        if self._https_port is not None:
            env[ENV_HTTPS_PORT] = str(self._https_port)
        if self._uds is not None:
            env[ENV_UDS_FD] = str(self._uds.fileno())
            pass_fds = (self._uds.fileno(),)
        argv = [sys.executable, "-m", "gateway", "serve", "--config", str(self.config_path)]
        with blocked_while_starting():  # a reload forwarded while it loads must not kill it
            proc = subprocess.Popen(argv, env=env, pass_fds=pass_fds, stdin=subprocess.DEVNULL)
        log.info("worker_started", worker=index, pid=proc.pid)
        return _Worker(index, proc, time.monotonic())

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.send_signal(sig)

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def _on_hup(self, signum: int, frame: FrameType | None) -> None:
        self.reload_pending = True

    def run(self) -> int:
        """Until SIGTERM/SIGINT; the exit status is 0 when every worker stopped cleanly."""
        self.bind()
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        self.stopping |= EARLY.stop  # asked while the supervisor was starting
        self.reload_pending |= EARLY.reload
        log.info("supervising", workers=self.count)
        failed = False
        try:
            self.workers = [] if self.stopping else [self._spawn(i) for i in range(self.count)]
            while not self.stopping:
                if self.reload_pending:
                    self.reload_pending = False
                    self._signal_all(signal.SIGHUP)
                for n, worker in enumerate(self.workers):
                    status = worker.proc.poll()
                    if status is None:
                        continue
                    due = self._respawn_at.get(n)
                    if due is not None:  # a slot that failed to start: tried again in a while
                        if time.monotonic() >= due:
                            del self._respawn_at[n]
                            self._respawn(n)
                        continue
                    log.error("worker_exited", worker=worker.index, exit_status=status)
                    lived = time.monotonic() - worker.started
                    self.quick_deaths = self.quick_deaths + 1 if lived < QUICK_DEATH_S else 0
                    if self.quick_deaths >= QUICK_DEATHS:
                        if not any(w.proc.poll() is None for w in self.workers):
                            failed = True  # nothing serves: a start that keeps failing ends the service
                            self.stopping = True
                            break
                        # Others still serve (say the files on disk were broken after they
                        # loaded): keep them, and try this slot again later.
                        self._respawn_at[n] = time.monotonic() + RESPAWN_BACKOFF_S
                        log.warning("worker_respawn_delayed", worker=worker.index)
                        continue
                    self._respawn(n)
                time.sleep(0.1)
        finally:
            clean = self._stop_all()
            self._close()
        return 2 if failed else (0 if clean else 1)

    def _respawn(self, n: int) -> None:
        """A new worker in slot `n`, and a reload of the others: the new one loads the files
        on disk as they are now, so the others load them too (a change not yet signalled
        would otherwise be served by one worker only). A reload they refuse keeps what they
        serve, and the new worker, on the same files, fails to start the same way."""
        self.workers[n] = self._spawn(self.workers[n].index)
        others = [w for i, w in enumerate(self.workers) if i != n and w.proc.poll() is None]
        for worker in others:
            worker.proc.send_signal(signal.SIGHUP)
        if others:
            log.info("workers_reloading", reason="respawn", count=len(others))

    def _stop_all(self) -> bool:
        self._signal_all(signal.SIGTERM)
        clean = True
        for worker in self.workers:
            try:
                status = worker.proc.wait(120)
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                status = worker.proc.wait()
            clean = clean and status == 0
        return clean

    def _close(self) -> None:
        if self._port_holder is not None:
            self._port_holder.close()
        if self._uds is not None:
            self._uds.close()
        if self._uds_path is not None:
            self._uds_path.unlink(missing_ok=True)


def shared_from_env() -> tuple[int, int | None, socket.socket | None] | None:
    """In a worker: (index, HTTPS port, the inherited Unix socket); None outside one."""
    index = os.environ.get(ENV_WORKER)
    if index is None:
        return None
    port = os.environ.get(ENV_HTTPS_PORT)
    fd = os.environ.get(ENV_UDS_FD)
    uds = socket.socket(fileno=int(fd)) if fd is not None else None
    if uds is not None:
        uds.setblocking(False)
    return int(index), int(port) if port is not None else None, uds
