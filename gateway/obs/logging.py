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
import os
import re
import sys
import threading
import time
from types import TracebackType
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
        "receipt_id",  # a UUID the gateway chose (COMPAT §7.1: correlated with the request id here)
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
        "logger",
        "where",
        "collecting",
        "changed",
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


def configure(level: str = "info", stream: Any = None, *, process_hooks: bool = True) -> None:
    """Route every log record of the process through the JSON formatter: wiregate's own
    lines as written; every other library's (aiohttp, asyncio, the PostgreSQL driver, and
    any not named here) with its text replaced by a fixed event; and, with `process_hooks`,
    Python's warnings and exceptions nobody caught as their class and place (a test runner
    that reports those itself keeps its own hooks). Safe to call again."""
    out = stream or sys.stderr
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    root = get_logger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # Other libraries' records reach the top logger. Their text is a library's own: it can
    # quote what it was handed (aiohttp a cookie's name or a peer's bytes, asyncio a task's
    # exception message, the PostgreSQL driver its DSN in `invalid connection option "..."`),
    # and without a handler Python's last-resort one would print it raw on stderr. Each line
    # keeps a fixed event ("library_<level>"), the logger's name and the exception's class;
    # warnings and above.
    library = logging.StreamHandler(out)
    library.setFormatter(JsonFormatter())
    library.addFilter(_TextFree())
    library.setLevel(logging.WARNING)
    library.wiregate = True  # type: ignore[attr-defined]  # found and replaced by the next configure
    top = logging.getLogger()
    top.handlers[:] = [h for h in top.handlers if not getattr(h, "wiregate", False)] + [library]
    logging.getLogger("aiohttp").setLevel(logging.WARNING)  # its access lines are INFO: ours replace them
    if not process_hooks:
        return
    # Python's warnings print their message and source line on stderr: routed through the
    # "py.warnings" logger, they keep only the fixed event too.
    logging.captureWarnings(True)
    # A traceback prints the exception's message, which can carry content.
    sys.excepthook = _unhandled
    threading.excepthook = _unhandled_in_thread
    sys.unraisablehook = _unraisable


_LOGGER_NAME = re.compile(r"[A-Za-z0-9_.]{1,64}")  # a module path; anything else is not shown


class _TextFree(logging.Filter):
    """Another library's record with its text replaced by a fixed event, `library_<level>`,
    and its logger's name beside it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"library_{record.levelname.lower()}"
        record.args = ()
        record.stack_info = None
        record.wg_fields = {"logger": record.name if _LOGGER_NAME.fullmatch(record.name) else "other"}
        return True


def where(tb: TracebackType | None) -> str | None:
    """The innermost frame of a traceback as `file.py:line` (code, never data)."""
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"


def _unhandled(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        return  # an interrupted process: no line to write
    error("unhandled_exception", error_class=kind.__name__, where=where(tb))


def _unhandled_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # as threading's own hook: a thread may end itself this way
    error("unhandled_exception", error_class=args.exc_type.__name__, where=where(args.exc_traceback))


def _unraisable(args: Any) -> None:
    """An exception Python could not raise (in a finaliser, a closed generator's cleanup):
    its message would print with the object's repr, which can carry content."""
    kind = args.exc_type
    error(
        "unraisable_exception", error_class=kind.__name__ if kind is not None else None, where=where(args.exc_traceback)
    )
