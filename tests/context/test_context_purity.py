"""The pure context modules import no I/O, clock or randomness library, nor any impure context module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_purity import FORBIDDEN, _imports

CONTEXT = Path(__file__).resolve().parents[2] / "gateway" / "context"
PURE = [
    "model.py",
    "errors.py",
    "content.py",
    "search.py",
    "excerpt.py",
    "builder.py",
    "receipt.py",
    "rerank.py",
    "store/migrations.py",
]
ALSO_FORBIDDEN = {
    "psycopg",
    "psycopg_pool",
    "uuid",
    "os",
    "threading",
    "concurrent",
    "gateway.context.service",
    "gateway.context.store.sqlite",
    "gateway.context.store.postgres",
    "gateway.context.reuse",
}


@pytest.mark.parametrize("name", PURE)
def test_pure_context_module(name: str) -> None:
    names = _imports(CONTEXT / name)
    bad = {n for n in names for f in FORBIDDEN | ALSO_FORBIDDEN if n == f or n.startswith(f + ".")}
    assert not bad, f"{name} imports {sorted(bad)}"
    local = {n for n in names if n.startswith("gateway.")}
    allowed = {"gateway.context." + p.removesuffix(".py").replace("/", ".") for p in PURE} | {"gateway.context"}
    assert local <= allowed


def test_only_the_store_touches_a_database() -> None:
    for path in CONTEXT.rglob("*.py"):
        names = _imports(path)
        if {"sqlite3", "psycopg", "psycopg_pool"} & names:
            assert path.parent.name == "store", path
