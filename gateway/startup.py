"""What a starting `wiregate serve` process keeps before it can act on it.

Owns: `EARLY`, the signals that arrived before the event loop's handlers existed, and
`blocked_while_starting`, how a supervisor starts a worker so that a signal cannot reach it
before `EARLY` is installed.
Must not: import anything heavy (the CLI installs it before loading the server).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

HANDLED = frozenset({signal.SIGHUP, signal.SIGTERM, signal.SIGINT})


class EarlySignals:
    """Signals that arrive while the process is still starting, before the event loop's
    handlers exist: a SIGHUP is a reload to run once serving, a SIGTERM or SIGINT a stop as
    soon as it can be graceful — never the default action, which would kill the process
    half-started (and, under `--workers`, count as a quick death)."""

    def __init__(self) -> None:
        self.reload = False
        self.stop = False

    def install(self) -> None:
        signal.signal(signal.SIGHUP, self._hup)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        # A worker starts with these blocked (`blocked_while_starting`): what arrived while
        # it was loading Python is delivered now, to the handlers above.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)

    def _hup(self, signum: int, frame: object) -> None:
        self.reload = True

    def _stop(self, signum: int, frame: object) -> None:
        self.stop = True


EARLY = EarlySignals()


@contextlib.contextmanager
def blocked_while_starting() -> Iterator[None]:
    """Start a process with SIGHUP, SIGTERM and SIGINT blocked (a child inherits the mask
    across exec): until its `EARLY.install` they stay pending instead of killing it. A
    supervisor forwards a reload to a worker it started a moment ago; the worker is still
    importing Python then, and the default action of SIGHUP would end it."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
