"""A store that cannot be opened stops `wiregate serve` with a content-free reason: the
driver's own message can quote the DSN (an option name, a word without "="), so neither it
nor its traceback reaches stderr or a log line; and the driver's own log records keep only
a fixed event."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import devsetup
from gateway.context.store.database import StoreUnavailable, open_database
from tests.conftest import LogCapture
from tests.harness import build_env, sensitive

WORD = "dsn-word-Axolotl-4471"  # a word of the DSN that the driver would quote
PASSWORD = "dsn-password-Pangolin-3390"
sensitive(WORD, PASSWORD)
WIREGATE = Path(sys.prefix) / "bin" / "wiregate"


@pytest.mark.parametrize(
    ("store", "dsn", "error_class"),
    [
        # psycopg: `invalid connection option "<WORD>"`
        ("postgres", f"host=127.0.0.1 port=5432 password={PASSWORD} {WORD}=1", "ProgrammingError"),
        # psycopg: `missing "=" after "<WORD>"`
        ("postgres", f"host=127.0.0.1 password={PASSWORD} {WORD}", "ProgrammingError"),
        # nothing listens on port 1: refused at once
        ("postgres", f"host=127.0.0.1 port=1 user={WORD} password={PASSWORD} connect_timeout=2", "OperationalError"),
        # a regular file where the store's directory must be
        ("sqlite", None, "FileExistsError"),
    ],
    ids=["unknown-option", "word-without-equals", "unreachable", "sqlite-path"],
)
def test_serve_stops_with_a_content_free_reason(tmp_path: Path, store: str, dsn: str | None, error_class: str) -> None:
    if dsn is not None:
        extra = '[store]\nbackend = "postgres"\ndsn = "file:secrets/store-dsn"\n'
    else:
        extra = '[store]\npath = "blocked/wiregate.db"\n'
    env = build_env(tmp_path / "env", "http://127.0.0.1:9", config_extra=extra)
    if dsn is not None:
        devsetup.write_private(env.dir / "secrets" / "store-dsn", dsn.encode())
    else:
        (env.dir / "blocked").write_text("not a directory")
    run = subprocess.run(
        [str(WIREGATE), "serve", "--config", str(env.config)], capture_output=True, text=True, timeout=60
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2, out[-2000:]
    assert WORD not in out and PASSWORD not in out and "Traceback" not in out
    lines = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    [refused] = [line for line in lines if line["event"] == "store_unavailable"]
    assert refused["error_class"] == error_class
    assert refused["reason"] == f"the {store} store could not be opened ({error_class})"


@pytest.mark.asyncio
async def test_the_error_is_not_chained(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable) as caught:
        await open_database("postgres", dsn=f"host=127.0.0.1 {WORD}=1", schema="wg_unused")
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert WORD not in str(caught.value)


def test_driver_log_records_keep_no_text(captured_logs: LogCapture) -> None:
    mark = captured_logs.mark()
    logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "pool-1", f'invalid option "{WORD}"')
    logging.getLogger("psycopg").info("below the level: %s", WORD)
    lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.strip()]
    assert [(line["event"], line["logger"]) for line in lines] == [("library_warning", "psycopg.pool")]
    assert WORD not in captured_logs.since(mark)
