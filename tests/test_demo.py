"""`make demo` runs end to end: an allowed call, a blocked call, a cached second turn."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway.demo"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("1. allowed: HTTP 200")
    assert lines[1].startswith("2. blocked: HTTP 403") and "secret_value" in lines[1] and "sk-demo" not in out.stdout
    assert "cache read 0" in lines[2] and "cache read 0" not in lines[3]
