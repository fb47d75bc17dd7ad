"""The layer rules of DESIGN.md hold (import-linter contracts in pyproject.toml), and the
contracts can fail: a pure module that imports aiohttp, even indirectly, breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_contracts_hold() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "0 broken" in result.stdout


def test_a_pure_module_importing_io_indirectly_breaks_them(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    # usage.py is pure; carriers import it: an HTTP client there reaches every carrier
    usage = tmp_path / "gateway" / "usage.py"
    usage.write_text(usage.read_text() + "\nimport aiohttp  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "Pure packages import no I/O library" in result.stdout and "BROKEN" in result.stdout
    assert "gateway.carriers" in result.stdout
