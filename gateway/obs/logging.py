"""JSON log lines with an allow-list of fields.

Owns: the log format and the only list of field names that may appear in a log line.
Anything not on the list is dropped before formatting; values are reduced to short
primitives. Bodies, prompts, responses, matched text, keys, credentials and headers have no
field here, so they cannot be logged through this module.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import time
from typing import Any

ALLOWED_FIELDS = frozenset(
    {
        "event",
        "request_id",
        "trace_id",
        "route",
        "method",
        "status",
        "duration_ms",
        "principal",
        "delegate_for",
        "scope",
        "profile",
        "carrier",
        "model",
        "phase",
        "decision",
        "mode",
        "reason_codes",
        "locations",
        "upstream_status",
        "attempt",
        "attempts",
        "bytes_in",
        "bytes_out",
        "error_class",
        "reason",
        "generation",
        "listener",
        "address",
        "file",
        "count",
        "policy_version",
        "stream",
        "outcome",
        "wait_ms",
        "engine",
        "observed",
        "stage",
        "items",
        "content_bytes",
        "receipt",
        "reuse",
        "diagnostic",
        "worker",
        "workers",
        "pid",
        "exit_status",
        "release",
        "window",
        "window_cap",
        "window_capped_rules",
        "window_checks",
        "released_early",
    }
)
# Fields every line of this process carries (`worker` under `wiregate serve --workers N`).
PROCESS_FIELDS: dict[str, Any] = {}
_MAX_STR = 300

LOGGER_NAME = "wiregate"


def _clean(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, (list, tuple, frozenset, set)):
        return [_clean(v) for v in list(value)[:32]]
    return str(value)[:_MAX_STR]


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def _ts(self, created: float) -> str:
        second = int(created)
        if second != self._second:  # one strftime per second, not per line
            self._second = second
            self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._stamp}.{int((created - second) * 1000):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": self._ts(record.created),
            "level": record.levelname.lower(),
            "event": record.getMessage()[:_MAX_STR],
            **PROCESS_FIELDS,
        }
        fields = getattr(record, "wg_fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if value is not None and key in ALLOWED_FIELDS and key != "event":
                    line[key] = _clean(value)
        if record.exc_info and record.exc_info[0] is not None:
            # The class name only: exception text can carry content.
            line["error_class"] = record.exc_info[0].__name__
        return json.dumps(line, separators=(",", ":"), ensure_ascii=True)


_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(b ^ 0x36 for b in range(256))  # translation tables: key XOR ipad / opad, bytewise
_OPAD = bytes(b ^ 0x5C for b in range(256))


@functools.lru_cache(maxsize=8)
def _pads(key: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256's inner and outer hash states for a key (RFC 2104), hashed once. OpenSSL
    3's one-shot HMAC looks its MAC implementation up on every call: measured in the live
    gateway, about 30 µs a digest on a cold path, against a few for two state copies."""
    if len(key) > _BLOCK:
        key = hashlib.sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha256(key.translate(_IPAD)), hashlib.sha256(key.translate(_OPAD))


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (the same bytes as `hmac.digest(key, message, "sha256")`)."""
    inner_state, outer_state = _pads(key)
    inner = inner_state.copy()
    inner.update(message)
    outer = outer_state.copy()
    outer.update(inner.digest())
    return outer.digest()


def digest(value: str, key: bytes) -> str:
    """A keyed digest of a client-supplied value that must not reach a log line as text
    (a requested scope name, a trace id): lines stay correlatable, and without the key
    (derived from the binding key ring) nobody can test guesses against them."""
    return "h:" + hmac_sha256(key, value.encode("utf-8", "surrogatepass"))[:8].hex()


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def log(level: int, event: str, **fields: Any) -> None:
    # The record is made directly: Logger.log would first walk the stack for the caller's
    # file and line (about a quarter of a line's cost), which the JSON line never shows.
    logger = get_logger()
    if logger.isEnabledFor(level):
        record = logger.makeRecord(logger.name, level, LOGGER_NAME, 0, event, (), None, extra={"wg_fields": fields})
        logger.handle(record)


def info(event: str, **fields: Any) -> None:
    log(logging.INFO, event, **fields)


def warning(event: str, **fields: Any) -> None:
    log(logging.WARNING, event, **fields)


def error(event: str, **fields: Any) -> None:
    log(logging.ERROR, event, **fields)


def configure(level: str = "info", stream: Any = None) -> None:
    """Route wiregate's and aiohttp's loggers through the JSON formatter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = get_logger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # aiohttp's own loggers can print exception text that carries request data; we keep
    # only warnings and above, through the same allow-listing formatter.
    for name in ("aiohttp.access", "aiohttp.server", "aiohttp.web", "aiohttp.client"):
        lib = logging.getLogger(name)
        lib.handlers[:] = [handler]
        lib.setLevel(logging.WARNING)
        lib.propagate = False
    # The PostgreSQL driver and its pool log connection failures with the driver's message,
    # which can quote the DSN (`invalid connection option "..."`): their lines keep only a
    # fixed event and the exception's class. (Unrouted, Python's last-resort handler would
    # print them raw on stderr.)
    driver = logging.StreamHandler(stream or sys.stderr)
    driver.setFormatter(JsonFormatter())
    driver.addFilter(_without_text)
    lib = logging.getLogger("psycopg")  # and its children: the pool logs as "psycopg.pool"
    lib.handlers[:] = [driver]
    lib.setLevel(logging.WARNING)
    lib.propagate = False


def _without_text(record: logging.LogRecord) -> bool:
    """A database driver's record with its text replaced by a fixed event."""
    record.msg = "store_driver_" + record.levelname.lower()
    record.args = ()
    return True
