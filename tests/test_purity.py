"""The pure packages import no I/O, clock or randomness library (DESIGN: pure core)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "gateway"
PURE = sorted(
    [*ROOT.joinpath("carriers").glob("*.py"), *ROOT.joinpath("inspection").glob("*.py")]
    + [
        p
        for p in (ROOT / "caching.py", ROOT / "admission.py", ROOT / "vocab.py", ROOT / "units.py", ROOT / "usage.py")
        if p.exists()
    ]
)
FORBIDDEN = {
    "aiohttp",
    "asyncio",
    "socket",
    "ssl",
    "sqlite3",
    "http",
    "urllib",
    "requests",
    "httpx",
    "httpx2",
    "subprocess",
    "time",
    "datetime",
    "random",
    "secrets",
    "os",
    "shutil",
    "pathlib",
    "multidict",
    "gateway.proxy",
    "gateway.app",
    "gateway.server",
    "gateway.config",
}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_module_imports_no_io(path: Path) -> None:
    bad = {name for name in _imports(path) if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


NATIVE = sorted(ROOT.joinpath("carriers").glob("*.c"))
NATIVE_HEADERS = {"Python.h", "string.h"}
NATIVE_FORBIDDEN_CALLS = (
    "fopen",
    "open(",
    "read(",
    "write(",
    "printf",
    "socket",
    "getenv",
    "time(",
    "rand(",
    "system(",
)


@pytest.mark.parametrize("path", NATIVE, ids=lambda p: str(p.relative_to(ROOT)))
def test_native_module_does_no_io(path: Path) -> None:
    """The native path of a pure package is pure too: the C API and string.h only."""
    source = path.read_text()
    headers = {line.split()[1].strip('<>"') for line in source.splitlines() if line.startswith("#include")}
    assert headers <= NATIVE_HEADERS, f"{path.name} includes {sorted(headers - NATIVE_HEADERS)}"
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("/*", "*")))
    called = [name for name in NATIVE_FORBIDDEN_CALLS if name in code]
    assert not called, f"{path.name} calls {called}"
