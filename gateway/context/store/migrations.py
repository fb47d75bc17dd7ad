"""Schema migrations shared by every table owner (context store, ledgers, usage, attribution).

Owns: the `Migration` record (component, version, statements per backend, and an optional
PostgreSQL data step for what SQL cannot express) and the pure planning rule — per component,
versions are 1, 2, 3 … with no gaps or repeats, applied in order, each once.
The backends apply a plan inside one transaction per migration and record it in
`wg_schema_migrations(component, version)`; PostgreSQL runs a migration's data step, when it has
one, after its statements and before recording it.
Must not: open connections or hold state; which migrations exist is an explicit tuple each owner
exports (no registration on import).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LEDGER_TABLE = "wg_schema_migrations"


@dataclass(frozen=True, slots=True)
class Migration:
    component: str  # e.g. "context", "release_ledger"
    version: int  # 1-based, contiguous per component
    sqlite: tuple[str, ...]  # statements for SQLite
    postgres: tuple[str, ...]  # statements for PostgreSQL
    # PostgreSQL only: `await step(conn)` after the statements, in the same transaction — a data
    # migration that needs Python (the context store's re-index with the analyzer, for one).
    postgres_step: Callable[[Any], Awaitable[None]] | None = None


class MigrationError(RuntimeError):
    pass


def plan(applied: Mapping[str, int], migrations: Sequence[Migration]) -> list[Migration]:
    """The migrations still to apply, in order. Raises MigrationError on gaps or duplicates."""
    by_component: dict[str, list[Migration]] = {}
    for m in migrations:
        by_component.setdefault(m.component, []).append(m)
    todo: list[Migration] = []
    for component, items in by_component.items():
        versions = [m.version for m in items]
        if sorted(versions) != list(range(1, len(items) + 1)):
            raise MigrationError(f"migrations of {component!r} are not 1..n")
        done = applied.get(component, 0)
        if done > len(items):
            raise MigrationError(f"database has {component!r} v{done}, code knows v{len(items)}")
        todo.extend(sorted((m for m in items if m.version > done), key=lambda m: m.version))
    return todo
