"""What a starting `wiregate serve` process keeps before it can act on it.

Owns: `EARLY`, the signals that arrived before the event loop's handlers existed.
Must not: import anything heavy (the CLI installs it before loading the server).
"""

from __future__ import annotations

import signal


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

    def _hup(self, signum: int, frame: object) -> None:
        self.reload = True

    def _stop(self, signum: int, frame: object) -> None:
        self.stop = True


EARLY = EarlySignals()
