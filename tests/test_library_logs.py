"""Other libraries' log records, and exceptions nobody caught, keep no text (issue 7's "nothing
sensitive in logs, ever", at the depth of the process): aiohttp logs a refused cookie's name (one a provider set),
asyncio a task's exception with its message, and any record of a library whose logger
wiregate does not route would reach stderr raw through Python's last-resort handler. Every
such line is JSON with a fixed event, the logger's name and the exception's class."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gateway.obs import logging as wlog
from tests.conftest import LogCapture
from tests.harness import sensitive

TASK_SECRET = "task-error-Narwhal-55210"
sensitive(TASK_SECRET)


def _lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_library_records_keep_a_fixed_event(captured_logs: LogCapture) -> None:
    mark = captured_logs.mark()
    logging.getLogger("asyncio").error(
        "Task exception was never retrieved\nfuture: <Task exception=KeyError(%r)>", TASK_SECRET
    )
    logging.getLogger("aiohttp.server").warning("Error handling request from %s", TASK_SECRET)
    logging.getLogger("some.library").info("below the level: %s", TASK_SECRET)
    logging.getLogger("odd name\n" + TASK_SECRET).warning("x")
    lines = _lines(captured_logs.since(mark))
    assert [(line["event"], line["logger"]) for line in lines] == [
        ("library_error", "asyncio"),
        ("library_warning", "aiohttp.server"),
        ("library_warning", "other"),
    ]
    assert TASK_SECRET not in captured_logs.since(mark)


@pytest.mark.parametrize(
    ("code", "rc", "event", "error_class", "where"),
    [
        (f"raise ValueError({TASK_SECRET!r})", 1, "unhandled_exception", "ValueError", "<string>:3"),
        (
            "import threading\n"
            "def fails():\n"
            f"    raise KeyError({TASK_SECRET!r})\n"
            "t = threading.Thread(target=fails); t.start(); t.join()",
            0,
            "unhandled_exception",
            "KeyError",
            "<string>:5",
        ),
        (
            f"class Odd:\n    def __del__(self):\n        raise RuntimeError({TASK_SECRET!r})\nOdd()",
            0,
            "unraisable_exception",
            "RuntimeError",
            "<string>:5",
        ),
    ],
    ids=["main-thread", "thread", "finaliser"],
)
def test_an_exception_nobody_caught_keeps_its_class_and_place_only(
    code: str, rc: int, event: str, error_class: str, where: str
) -> None:
    script = f"from gateway.obs import logging as log\nlog.configure('info')\n{code}\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == rc, run.stderr[-2000:]
    assert TASK_SECRET not in run.stdout + run.stderr and "Traceback" not in run.stderr
    [line] = _lines(run.stderr)
    assert (line["event"], line["error_class"], line["where"]) == (event, error_class, where)


def test_a_check_worker_routes_library_records_too(tmp_path: Path) -> None:
    code = (
        "import logging\n"
        "from gateway.proxy import offload\n"
        "offload._init('unused')\n"
        f"logging.getLogger('hyperscan').warning('a match in %s', {TASK_SECRET!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert TASK_SECRET not in run.stderr
    assert [(r["event"], r["logger"]) for r in _lines(run.stderr)] == [("library_warning", "hyperscan")]


def test_configure_twice_keeps_one_library_handler(captured_logs: LogCapture) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    hooks = (sys.excepthook, threading.excepthook, sys.unraisablehook)
    try:
        wlog.configure("debug", stream=LogCapture(), process_hooks=False)
        wlog.configure("debug", stream=LogCapture(), process_hooks=False)
        assert len(root.handlers) == before
        assert (sys.excepthook, threading.excepthook, sys.unraisablehook) == hooks  # pytest's, untouched
    finally:
        wlog.configure("debug", stream=captured_logs, process_hooks=False)  # the session's sink again


def test_a_warning_is_a_line_without_its_text() -> None:
    """Python's warnings print their message and the source line on stderr: routed through
    logging (`py.warnings`), they keep only the fixed event."""
    script = (
        "import warnings\n"
        "from gateway.obs import logging as log\n"
        "log.configure('info')\n"
        f"warnings.warn('unclosed transport to ' + {TASK_SECRET!r}, ResourceWarning)\n"
        f"warnings.warn({TASK_SECRET!r})\n"
    )
    run = subprocess.run([sys.executable, "-W", "always", "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert TASK_SECRET not in run.stderr
    assert [(r["event"], r["logger"]) for r in _lines(run.stderr)] == [("library_warning", "py.warnings")] * 2
