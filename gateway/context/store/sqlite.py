# ruff: noqa: S608  -- SQL text only interpolates module constants and "?" placeholder lists
"""The embedded context store: one SQLite file in WAL mode, FTS5 (BM25) search, vectors as float32 blobs.

Owns: `SqliteDatabase` — the file, its connections and the threads they live on (one writer thread
running each write as a `BEGIN IMMEDIATE` transaction, a small pool of read-only reader threads),
and applying registered migrations — and `SqliteContextStore`, the ContextStore on top of it.
Blocking sqlite3 calls never run on the event loop: every call is submitted to a thread the
database owns, opened by `open()` and joined by `close()`.
Must not: validate content, generate ids, read clocks or decide policy; it stores what the service
computed. Cosine similarity is computed on a reader thread (brute force over the scope); text search ranks
with FTS5's bm25(), or with the same scores by `wg_bm25` where `install_ranking` could register it (which
then also leaves unmeasured the rows that provably cannot reach the search's cut, and is given each term's
row count, kept per reader connection for as long as its snapshot is the same: `_rows_holding`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import sqlite3
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from gateway.context.errors import (
    ArtifactAlreadyExists,
    ArtifactNotFound,
    InvalidMemoryState,
    RevisionConflict,
    ScopeIdempotencyConflict,
    ScopeNotFound,
)
from gateway.context.model import SEARCHABLE_FAMILIES, ArtifactRef, AtomicMemoryInput, Family, MemoryState, etag_for
from gateway.context.store.base import (
    ArtifactRevision,
    AtomicMemoryRecord,
    AtomicMemoryState,
    MissingVector,
    NewRevision,
    NewScope,
    ScopeRecord,
    SearchRow,
    TextQuery,
    TextResult,
)
from gateway.context.store.common import (
    MAX_QUERY_TERMS,
    REVISION_COLUMNS,
    PresentTerms,
    admitted,
    at_least,
    check_merge_input,
    floor_cut,
    floor_groups,
    fts_key,
    lifecycle_step,
    pack_vector,
    phrase_map,
    revision_from_row,
)
from gateway.context.store.migrations import LEDGER_TABLE, Migration, plan

try:
    from gateway.context.store import _fts_native
except ImportError:  # built without a C compiler: FTS5's own bm25() ranks, with the same scores
    _fts_native = None  # type: ignore[assignment]

T = TypeVar("T")
_IN_CHUNK = 500  # ids per IN (...) list, well below SQLite's bound on parameters

CONTEXT_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        component="context",
        version=1,
        sqlite=(
            """CREATE TABLE ctx_scopes(
                scope_id TEXT PRIMARY KEY, title TEXT NOT NULL, summary TEXT NOT NULL, parent_scope_id TEXT,
                context_references TEXT NOT NULL, external_references TEXT NOT NULL, version INTEGER NOT NULL,
                created_by TEXT, created_at TEXT NOT NULL, idem_owner TEXT, idem_key TEXT,
                fingerprint TEXT NOT NULL)""",
            "CREATE UNIQUE INDEX ctx_scopes_idem ON ctx_scopes(idem_owner, idem_key) WHERE idem_key IS NOT NULL",
            """CREATE TABLE ctx_artifacts(
                rid INTEGER PRIMARY KEY, scope_id TEXT NOT NULL REFERENCES ctx_scopes(scope_id),
                family TEXT NOT NULL, artifact_id TEXT NOT NULL, head_revision INTEGER NOT NULL, kind TEXT,
                state TEXT, state_version INTEGER NOT NULL DEFAULT 0, merged_into_id TEXT,
                searchable INTEGER NOT NULL, search_text TEXT, vector BLOB,
                UNIQUE(scope_id, family, artifact_id))""",
            """CREATE TABLE ctx_revisions(
                scope_id TEXT NOT NULL, family TEXT NOT NULL, artifact_id TEXT NOT NULL, revision INTEGER NOT NULL,
                content TEXT NOT NULL, content_digest TEXT NOT NULL, created_at TEXT NOT NULL, created_by TEXT,
                source_id TEXT NOT NULL, previous_revision INTEGER, reason TEXT, restored_from_revision INTEGER,
                PRIMARY KEY(scope_id, family, artifact_id, revision)) WITHOUT ROWID""",
            """CREATE VIRTUAL TABLE ctx_fts USING fts5(k, t,
                tokenize="unicode61 remove_diacritics 0 categories 'L* N* M* Co'")""",
        ),
        postgres=(),  # see postgres.CONTEXT_MIGRATIONS
    ),
    Migration(
        # One FTS column whose every token carries its scope-and-family key (a fixed-length prefix): a
        # search reads only its own key's posting lists instead of intersecting every term with the key's
        # list of all its rows, a write appends to short lists instead of the key's ever-growing one, and
        # a term's document frequency in BM25 counts only the scope and family searched (the row count
        # and average length stay those of the whole table).
        component="context",
        version=2,
        sqlite=(
            """CREATE VIRTUAL TABLE ctx_terms USING fts5(t,
                tokenize="unicode61 remove_diacritics 0 categories 'L* N* M* Co'")""",
            "INSERT INTO ctx_terms(rowid, t) SELECT rowid, CASE WHEN t = '' THEN '' ELSE k || replace(t, ' ', ' ' || k)"
            " END FROM ctx_fts",
            "DROP TABLE ctx_fts",
        ),
        postgres=(),
    ),
)


_RANKING_PYTHONS = ((3, 11), (3, 14))  # CPython releases whose sqlite3.Connection holds its handle first
_PROBE = 12_347  # a LIKE-pattern length limit set through Python and read back through the handle


def install_ranking(conn: sqlite3.Connection) -> bool:
    """Register `wg_bm25` (gateway/context/store/_fts_native.c: bm25() with one IDF walk per distinct
    term) on a connection. False where it cannot be — no native module, another interpreter or
    connection type, a SQLite the module cannot prove is the interpreter's own — and then the store
    ranks with FTS5's bm25(), which gives the same scores."""
    if _fts_native is None or type(conn) is not sqlite3.Connection:
        return False
    if not _RANKING_PYTHONS[0] <= sys.version_info[:2] <= _RANKING_PYTHONS[1]:
        return False
    limit = sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH
    kept = conn.getlimit(limit)
    conn.setlimit(limit, _PROBE)
    try:
        return bool(_fts_native.install(conn, sqlite3.sqlite_version, _PROBE))
    finally:
        conn.setlimit(limit, kept)


class DatabaseClosed(RuntimeError):
    """The database was closed (or is closing) when work for it was submitted."""


class SqliteDatabase:
    """One SQLite file and the threads that may touch it. Other table owners register migrations here."""

    def __init__(
        self,
        path: str,
        migrations: Sequence[Migration] = CONTEXT_MIGRATIONS,
        *,
        synchronous: str = "FULL",  # FULL: a committed write survives power loss too (NORMAL: process kill only)
        readers: int = 2,  # read threads; WAL lets them read while the writer writes
        busy_timeout_ms: int = 5000,  # how long a writer waits for another process's write lock
    ) -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        self._path = path
        self._migrations = tuple(migrations)
        self._synchronous = synchronous
        self._readers = readers
        self._busy_ms = busy_timeout_ms
        self._writer: ThreadPoolExecutor | None = None
        self._reader: ThreadPoolExecutor | None = None
        self._write_conn: sqlite3.Connection | None = None
        self._local = threading.local()
        self._read_conns: list[sqlite3.Connection] = []
        self._ranking: set[int] = set()  # id() of the open connections that have wg_bm25
        self._lock = threading.Lock()

    def _connect(self, *, read_only: bool) -> sqlite3.Connection:
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_ms)}")
        conn.execute("PRAGMA foreign_keys=ON")
        if read_only:
            conn.execute("PRAGMA query_only=1")
        else:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
        if install_ranking(conn):
            with self._lock:
                self._ranking.add(id(conn))
        return conn

    def ranks_natively(self, conn: sqlite3.Connection) -> bool:
        """Does this open connection have `wg_bm25`?"""
        return id(conn) in self._ranking

    async def open(self) -> None:
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctx-sqlite-w")
        self._reader = ThreadPoolExecutor(max_workers=self._readers, thread_name_prefix="ctx-sqlite-r")
        loop = asyncio.get_running_loop()
        self._write_conn = await loop.run_in_executor(self._writer, partial(self._connect, read_only=False))
        await self.write(self._migrate)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE}(component TEXT NOT NULL, version INTEGER NOT NULL,"
            " PRIMARY KEY(component, version))"
        )
        applied: dict[str, int] = {}
        for component, version in conn.execute(f"SELECT component, max(version) FROM {LEDGER_TABLE} GROUP BY 1"):
            applied[component] = version
        for m in plan(applied, self._migrations):
            for statement in m.sqlite:
                conn.execute(statement)
            conn.execute(f"INSERT INTO {LEDGER_TABLE}(component, version) VALUES (?, ?)", (m.component, m.version))

    async def close(self) -> None:
        """Stop the threads and close every connection (joining threads blocks: off the loop)."""
        reader, writer, write_conn = self._reader, self._writer, self._write_conn
        self._writer = self._reader = None
        self._write_conn = None
        await asyncio.to_thread(self._shutdown, reader, writer, write_conn)

    def _shutdown(
        self,
        reader: ThreadPoolExecutor | None,
        writer: ThreadPoolExecutor | None,
        write_conn: sqlite3.Connection | None,
    ) -> None:
        if reader is not None:
            reader.shutdown(wait=True)
        if writer is not None:
            if write_conn is not None:
                writer.submit(write_conn.close).result()
            writer.shutdown(wait=True)
        with self._lock:
            for conn in self._read_conns:
                conn.close()
            self._read_conns.clear()
            self._ranking.clear()

    def _reader_conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(read_only=True)
            self._local.conn = conn
            with self._lock:
                self._read_conns.append(conn)
        return conn

    async def read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` on a reader thread inside one read transaction (a consistent snapshot)."""
        if self._reader is None:
            raise DatabaseClosed("database is not open")

        def run() -> T:
            conn = self._reader_conn()
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return await asyncio.get_running_loop().run_in_executor(self._reader, run)

    async def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` on the writer thread as one `BEGIN IMMEDIATE` transaction; any exception rolls back."""
        if self._writer is None or self._write_conn is None:
            raise DatabaseClosed("database is not open")
        conn = self._write_conn

        def run() -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await asyncio.get_running_loop().run_in_executor(self._writer, run)


def _scope_from_row(row: Sequence[Any]) -> ScopeRecord:
    sid, title, summary, parent, refs, ext, version, created_by, created_at = row
    return ScopeRecord(
        sid, title, summary, parent, tuple(json.loads(refs)), tuple(json.loads(ext)), version, created_by, created_at
    )


_SCOPE_COLS = (
    "scope_id, title, summary, parent_scope_id, context_references, external_references, version, "
    "created_by, created_at"
)
_HEAD_SQL = (
    "SELECT a.artifact_id, r.revision, r.content, r.content_digest, r.created_at, r.created_by, r.source_id, "
    "r.previous_revision, r.reason, r.restored_from_revision FROM ctx_artifacts a JOIN ctx_revisions r "
    "ON r.scope_id = a.scope_id AND r.family = a.family AND r.artifact_id = a.artifact_id "
    "AND r.revision = a.head_revision "
)
_HEAD_STATE_SQL = "SELECT a.state_version, " + _HEAD_SQL.removeprefix("SELECT ")  # the state version first


def _head_from_row(scope_id: str, family: str, row: Sequence[Any]) -> ArtifactRevision:
    return revision_from_row(scope_id, family, row[0], row[1:])


# Atomic memory states whose content is frozen: 1.4.1 edits an active or forgotten memory only.
_FROZEN_STATES = frozenset({MemoryState.MERGED.value, MemoryState.RETIRED.value})


def _searchable(family: str, state: MemoryState | None) -> bool:
    return Family(family) in SEARCHABLE_FAMILIES and state in (None, MemoryState.ACTIVE)


MERGE_IDLE_S = 1.0  # after the last index write, the FTS index's segments are merged (see merge_index)
MERGE_PAGES = 64  # pages merged per write transaction: a write that arrives meanwhile waits for one step


def _merge_step(conn: sqlite3.Connection) -> bool:
    """One bounded step of FTS5's incremental merge of every segment into one; False when there was
    nothing left to merge (FTS5 then changes fewer than two rows)."""
    before = conn.total_changes
    conn.execute("INSERT INTO ctx_terms(ctx_terms, rank) VALUES('merge', ?)", (-MERGE_PAGES,))
    return conn.total_changes - before >= 2


DOC_COUNTS_KEPT = 4096  # term counts a reader connection keeps for its current snapshot


class SqliteContextStore:
    """ContextStore over a SqliteDatabase (which the caller opens and closes, possibly shared).

    Every write transaction adds a segment to the FTS5 index, and FTS5 merges them only a few at a
    time, so a store written one memory at a time keeps many, and every query term is looked up in
    each. `merge_idle_s` after the last index write (or after opening) they are merged into one, in
    bounded steps; a pass stops when the next index write arrives, which re-arms it. Ranking does not
    change (bm25 reads the table's totals, not its segments); queries get cheaper (a 1,000-memory
    store written that way: a term probe 75 -> 16 µs, a ranked search 0.59 -> 0.32 ms)."""

    text_metric = ("sqlite_bm25", False)  # FTS5 bm25() (1.4.1's name for it): more negative is a better match

    def __init__(self, db: SqliteDatabase, *, merge_idle_s: float | None = MERGE_IDLE_S) -> None:
        self._db = db
        self._present = PresentTerms()
        self._merge_idle_s = merge_idle_s  # None: never merged beyond FTS5's own automerge
        self._merge_timer: asyncio.TimerHandle | None = None
        self._merging: asyncio.Task[int] | None = None
        self._index_writes = 0
        # Per reader thread (one connection each): (its connection, the snapshot's data version,
        # phrase -> rows holding it), see `_rows_holding`.
        self._doc_counts = threading.local()

    async def open(self) -> None:
        await self._db.open()
        self._arm_merge()  # a store opened with segments left to merge gets them merged once idle

    async def close(self) -> None:
        if self._merge_timer is not None:
            self._merge_timer.cancel()
            self._merge_timer = None
        merging, self._merging = self._merging, None
        if merging is not None and not merging.done():
            merging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await merging  # a step already on the writer thread finishes before the database closes
        await self._db.close()

    async def _index_write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write transaction that changes the FTS index; arms the idle merge."""
        result = await self._db.write(fn)
        self._index_writes += 1
        self._arm_merge()
        return result

    def _arm_merge(self) -> None:
        if self._merge_idle_s is not None:
            if self._merge_timer is not None:
                self._merge_timer.cancel()
            self._merge_timer = asyncio.get_running_loop().call_later(self._merge_idle_s, self._start_merge)

    def _start_merge(self) -> None:
        self._merge_timer = None
        if self._merging is None or self._merging.done():
            self._merging = asyncio.create_task(self.merge_index(), name="context-fts-merge")
        else:
            # A pass armed by an earlier pause is still in its last step (the write that armed
            # this timer ends it): try again after another idle interval, or the writes since
            # would stay unmerged until the next write.
            self._arm_merge()

    async def merge_index(self) -> int:
        """Merge the FTS index's segments, one bounded step per write transaction, until one segment
        is left or an index write arrives. Returns the steps that merged something. A step that fails
        (another process held the write lock past the busy timeout, the database closed) ends the
        pass quietly: merging is an optimisation, and the next index write re-arms it."""
        started, steps = self._index_writes, 0
        try:
            while self._index_writes == started and await self._db.write(_merge_step):
                steps += 1
        except (sqlite3.Error, DatabaseClosed):
            pass
        return steps

    # ---- scopes -------------------------------------------------------------------------------

    async def create_scope(self, new: NewScope) -> tuple[ScopeRecord, bool]:
        def run(conn: sqlite3.Connection) -> tuple[ScopeRecord, bool]:
            owner = new.created_by or ""
            if new.idempotency_key is not None:
                row = conn.execute(
                    f"SELECT {_SCOPE_COLS}, fingerprint FROM ctx_scopes WHERE idem_owner = ? AND idem_key = ?",
                    (owner, new.idempotency_key),
                ).fetchone()
                if row is not None:
                    if row[-1] != new.fingerprint:
                        raise ScopeIdempotencyConflict()
                    return _scope_from_row(row[:-1]), False
            self._insert_scope(conn, new, owner)
            return self._scope(conn, new.scope_id), True

        return await self._db.write(run)

    @staticmethod
    def _insert_scope(conn: sqlite3.Connection, new: NewScope, owner: str) -> None:
        conn.execute(
            f"INSERT INTO ctx_scopes({_SCOPE_COLS}, idem_owner, idem_key, fingerprint) "
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
            (
                new.scope_id,
                new.title,
                new.summary,
                new.parent_scope_id,
                json.dumps(list(new.context_references)),
                json.dumps([dict(r) for r in new.external_references]),
                new.created_by,
                new.created_at,
                owner if new.idempotency_key is not None else None,
                new.idempotency_key,
                new.fingerprint,
            ),
        )

    @staticmethod
    def _scope(conn: sqlite3.Connection, scope_id: str) -> ScopeRecord:
        row = conn.execute(f"SELECT {_SCOPE_COLS} FROM ctx_scopes WHERE scope_id = ?", (scope_id,)).fetchone()
        if row is None:
            raise ScopeNotFound()
        return _scope_from_row(row)

    async def ensure_scope(self, new: NewScope) -> ScopeRecord:
        def run(conn: sqlite3.Connection) -> ScopeRecord:
            if conn.execute("SELECT 1 FROM ctx_scopes WHERE scope_id = ?", (new.scope_id,)).fetchone() is None:
                self._insert_scope(conn, new, new.created_by or "")
            return self._scope(conn, new.scope_id)

        return await self._db.write(run)

    async def get_scope(self, scope_id: str) -> ScopeRecord | None:
        def run(conn: sqlite3.Connection) -> ScopeRecord | None:
            row = conn.execute(f"SELECT {_SCOPE_COLS} FROM ctx_scopes WHERE scope_id = ?", (scope_id,)).fetchone()
            return _scope_from_row(row) if row is not None else None

        return await self._db.read(run)

    async def list_scopes(self, after: str | None, limit: int) -> list[ScopeRecord]:
        def run(conn: sqlite3.Connection) -> list[ScopeRecord]:
            rows = conn.execute(
                f"SELECT {_SCOPE_COLS} FROM ctx_scopes WHERE scope_id > ? ORDER BY scope_id LIMIT ?",
                (after or "", limit),
            ).fetchall()
            return [_scope_from_row(r) for r in rows]

        return await self._db.read(run)

    # ---- artifacts ----------------------------------------------------------------------------

    @staticmethod
    def _insert_revision(
        conn: sqlite3.Connection, scope_id: str, family: str, artifact_id: str, revision: int, rev: NewRevision
    ) -> None:
        conn.execute(
            f"INSERT INTO ctx_revisions(scope_id, family, artifact_id, {REVISION_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                scope_id,
                family,
                artifact_id,
                revision,
                rev.content_json,
                rev.content_digest,
                rev.created_at,
                rev.created_by,
                rev.source_id,
                revision - 1 if revision > 1 else None,
                rev.reason,
                rev.restored_from_revision,
            ),
        )

    @staticmethod
    def _index(conn: sqlite3.Connection, rid: int, scope_id: str, family: str, rev: NewRevision | None) -> None:
        conn.execute("DELETE FROM ctx_terms WHERE rowid = ?", (rid,))
        if rev is not None and rev.search_text is not None:
            key = fts_key(scope_id, family)
            conn.execute(
                "INSERT INTO ctx_terms(rowid, t) VALUES (?, ?)", (rid, " ".join(key + t for t in rev.search_tokens))
            )

    def _create(
        self, conn: sqlite3.Connection, scope_id: str, family: str, artifact_id: str, rev: NewRevision
    ) -> ArtifactRevision:
        if conn.execute("SELECT 1 FROM ctx_scopes WHERE scope_id = ?", (scope_id,)).fetchone() is None:
            raise ScopeNotFound()
        state = MemoryState.ACTIVE if family == Family.ATOMIC_MEMORY else None
        searchable = _searchable(family, state) and rev.search_text is not None
        try:
            cur = conn.execute(
                "INSERT INTO ctx_artifacts(scope_id, family, artifact_id, head_revision, kind, state, searchable, "
                "search_text, vector) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)",
                (
                    scope_id,
                    family,
                    artifact_id,
                    rev.kind,
                    state.value if state else None,
                    int(searchable),
                    rev.search_text,
                    pack_vector(rev.vector),
                ),
            )
        except sqlite3.IntegrityError:
            raise ArtifactAlreadyExists() from None
        rid = cur.lastrowid
        assert rid is not None
        self._insert_revision(conn, scope_id, family, artifact_id, 1, rev)
        if searchable:
            self._index(conn, rid, scope_id, family, rev)
        return self._revision(conn, scope_id, family, artifact_id, 1)

    async def create_artifact(self, scope_id: str, family: str, artifact_id: str, rev: NewRevision) -> ArtifactRevision:
        return await self._index_write(lambda conn: self._create(conn, scope_id, family, artifact_id, rev))

    async def replace_artifact(
        self, scope_id: str, family: str, artifact_id: str, expected_etag: str, rev: NewRevision
    ) -> ArtifactRevision:
        def run(conn: sqlite3.Connection) -> ArtifactRevision:
            row = conn.execute(
                "SELECT rid, head_revision, state FROM ctx_artifacts WHERE scope_id = ? AND family = ? "
                "AND artifact_id = ?",
                (scope_id, family, artifact_id),
            ).fetchone()
            if row is None:
                raise ArtifactNotFound()
            rid, head, state = row
            if etag_for(head) != expected_etag:
                raise RevisionConflict(expected_etag, etag_for(head))
            if state in _FROZEN_STATES:
                raise InvalidMemoryState()
            searchable = _searchable(family, MemoryState(state) if state else None) and rev.search_text is not None
            conn.execute(
                "UPDATE ctx_artifacts SET head_revision = ?, kind = ?, searchable = ?, search_text = ?, vector = ? "
                "WHERE rid = ?",
                (head + 1, rev.kind, int(searchable), rev.search_text, pack_vector(rev.vector), rid),
            )
            self._insert_revision(conn, scope_id, family, artifact_id, head + 1, rev)
            self._index(conn, rid, scope_id, family, rev if searchable else None)
            return self._revision(conn, scope_id, family, artifact_id, head + 1)

        return await self._index_write(run)

    @staticmethod
    def _revision(
        conn: sqlite3.Connection, scope_id: str, family: str, artifact_id: str, revision: int
    ) -> ArtifactRevision:
        row = conn.execute(
            f"SELECT {REVISION_COLUMNS} FROM ctx_revisions WHERE scope_id = ? AND family = ? AND artifact_id = ? "
            "AND revision = ?",
            (scope_id, family, artifact_id, revision),
        ).fetchone()
        if row is None:
            raise ArtifactNotFound()
        return revision_from_row(scope_id, family, artifact_id, row)

    async def get_head(self, scope_id: str, family: str, artifact_id: str) -> ArtifactRevision | None:
        def run(conn: sqlite3.Connection) -> ArtifactRevision | None:
            row = conn.execute(
                _HEAD_SQL + "WHERE a.scope_id = ? AND a.family = ? AND a.artifact_id = ?",
                (scope_id, family, artifact_id),
            ).fetchone()
            return _head_from_row(scope_id, family, row) if row is not None else None

        return await self._db.read(run)

    async def get_revision(
        self, scope_id: str, family: str, artifact_id: str, revision: int
    ) -> ArtifactRevision | None:
        def run(conn: sqlite3.Connection) -> ArtifactRevision | None:
            try:
                return self._revision(conn, scope_id, family, artifact_id, revision)
            except ArtifactNotFound:
                return None

        return await self._db.read(run)

    async def list_heads(self, scope_id: str, family: str, after: str | None, limit: int) -> list[ArtifactRevision]:
        def run(conn: sqlite3.Connection) -> list[ArtifactRevision]:
            rows = conn.execute(
                _HEAD_SQL + "WHERE a.scope_id = ? AND a.family = ? AND a.artifact_id > ? "
                "AND (a.state IS NULL OR a.state NOT IN ('merged', 'retired')) ORDER BY a.artifact_id LIMIT ?",
                (scope_id, family, after or "", limit),
            ).fetchall()
            return [_head_from_row(scope_id, family, r) for r in rows]

        return await self._db.read(run)

    async def list_revisions(
        self, scope_id: str, family: str, artifact_id: str, before: int | None, limit: int
    ) -> list[ArtifactRevision]:
        def run(conn: sqlite3.Connection) -> list[ArtifactRevision]:
            rows = conn.execute(
                f"SELECT {REVISION_COLUMNS} FROM ctx_revisions WHERE scope_id = ? AND family = ? AND artifact_id = ? "
                "AND revision < ? ORDER BY revision DESC LIMIT ?",
                (scope_id, family, artifact_id, before if before is not None else 2**62, limit),
            ).fetchall()
            return [revision_from_row(scope_id, family, artifact_id, r) for r in rows]

        return await self._db.read(run)

    # ---- atomic memory ------------------------------------------------------------------------

    async def get_states(self, scope_id: str, artifact_ids: Sequence[str]) -> dict[str, AtomicMemoryState]:
        wanted = list(dict.fromkeys(artifact_ids))

        def run(conn: sqlite3.Connection) -> dict[str, AtomicMemoryState]:
            found: dict[str, AtomicMemoryState] = {}
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                for aid, head, state, version, merged_into in conn.execute(
                    "SELECT artifact_id, head_revision, state, state_version, merged_into_id FROM ctx_artifacts "
                    f"WHERE scope_id = ? AND family = ? AND artifact_id IN ({','.join('?' * len(chunk))})",
                    (scope_id, Family.ATOMIC_MEMORY.value, *chunk),
                ):
                    ref = ArtifactRef(Family.ATOMIC_MEMORY.value, aid, head)
                    found[aid] = AtomicMemoryState(ref, MemoryState(state), version, merged_into)
            return found

        return await self._db.read(run) if wanted else {}

    @staticmethod
    def _record(conn: sqlite3.Connection, scope_id: str, artifact_id: str) -> AtomicMemoryRecord:
        row = conn.execute(
            "SELECT a.head_revision, a.kind, r.content, a.state, a.state_version, a.merged_into_id "
            "FROM ctx_artifacts a JOIN ctx_revisions r ON r.scope_id = a.scope_id AND r.family = a.family "
            "AND r.artifact_id = a.artifact_id AND r.revision = a.head_revision "
            "WHERE a.scope_id = ? AND a.family = ? AND a.artifact_id = ?",
            (scope_id, Family.ATOMIC_MEMORY.value, artifact_id),
        ).fetchone()
        if row is None:
            raise ArtifactNotFound()
        return _atomic_record(artifact_id, row)

    async def list_atomic(
        self, scope_id: str, states: frozenset[MemoryState], kind: str | None, after: str | None, limit: int
    ) -> list[AtomicMemoryRecord]:
        def run(conn: sqlite3.Connection) -> list[AtomicMemoryRecord]:
            marks = ",".join("?" for _ in states)
            sql = (
                "SELECT a.artifact_id, a.head_revision, a.kind, r.content, a.state, a.state_version, a.merged_into_id "
                "FROM ctx_artifacts a JOIN ctx_revisions r ON r.scope_id = a.scope_id AND r.family = a.family "
                "AND r.artifact_id = a.artifact_id AND r.revision = a.head_revision "
                f"WHERE a.scope_id = ? AND a.family = ? AND a.state IN ({marks}) AND a.artifact_id > ? "
            )
            args: list[Any] = [scope_id, Family.ATOMIC_MEMORY.value, *sorted(s.value for s in states), after or ""]
            if kind is not None:
                sql += "AND a.kind = ? "
                args.append(kind)
            sql += "ORDER BY a.artifact_id LIMIT ?"
            args.append(limit)
            return [_atomic_record(r[0], r[1:]) for r in conn.execute(sql, args).fetchall()]

        return await self._db.read(run)

    @staticmethod
    def _target_row(conn: sqlite3.Connection, scope_id: str, target: AtomicMemoryInput) -> Sequence[Any] | None:
        """`(rid, head_revision, state, state_version)` of a lifecycle target or merge input, or None."""
        if target.artifact.family != Family.ATOMIC_MEMORY.value:
            return None
        row: Sequence[Any] | None = conn.execute(
            "SELECT rid, head_revision, state, state_version FROM ctx_artifacts WHERE scope_id = ? AND family = ? "
            "AND artifact_id = ?",
            (scope_id, Family.ATOMIC_MEMORY.value, target.artifact.artifact_id),
        ).fetchone()
        return row

    async def change_state(
        self, scope_id: str, target: AtomicMemoryInput, state: MemoryState
    ) -> tuple[AtomicMemoryRecord, bool]:
        def run(conn: sqlite3.Connection) -> tuple[AtomicMemoryRecord, bool]:
            row = self._target_row(conn, scope_id, target)
            step = lifecycle_step(row[1:] if row is not None else None, target, state)
            assert row is not None
            rid = row[0]
            if step == "ok":
                conn.execute(
                    "UPDATE ctx_artifacts SET state = ?, state_version = state_version + 1, searchable = 0 "
                    "WHERE rid = ?",
                    (state.value, rid),
                )
                self._index(conn, rid, scope_id, Family.ATOMIC_MEMORY.value, None)
            return self._record(conn, scope_id, target.artifact.artifact_id), step == "ok"

        return await self._index_write(run)

    async def merge(
        self, scope_id: str, inputs: Sequence[AtomicMemoryInput], artifact_id: str, rev: NewRevision
    ) -> list[AtomicMemoryRecord]:
        def run(conn: sqlite3.Connection) -> list[AtomicMemoryRecord]:
            rids: list[int] = []
            for target in inputs:  # in the caller's order: the first input that fails answers
                row = self._target_row(conn, scope_id, target)
                check_merge_input(row[1:] if row is not None else None, target)
                assert row is not None
                rids.append(row[0])
            self._create(conn, scope_id, Family.ATOMIC_MEMORY.value, artifact_id, rev)
            for rid in rids:
                conn.execute(
                    "UPDATE ctx_artifacts SET state = ?, state_version = state_version + 1, merged_into_id = ?, "
                    "searchable = 0 WHERE rid = ?",
                    (MemoryState.MERGED.value, artifact_id, rid),
                )
                self._index(conn, rid, scope_id, Family.ATOMIC_MEMORY.value, None)
            ids = sorted({t.artifact.artifact_id for t in inputs} | {artifact_id})
            return [self._record(conn, scope_id, i) for i in ids]

        return await self._index_write(run)

    # ---- search -------------------------------------------------------------------------------

    async def search_text(
        self,
        scope_id: str,
        family: str,
        terms: Sequence[str],
        limit: int,
        kind: str | None = None,
        min_match: int = 1,
        enough: int | None = None,
    ) -> list[SearchRow]:
        if not terms:
            return []
        query = TextQuery(scope_id, family, tuple(terms), limit, kind, min_match, enough)
        return await self._db.read(partial(self._text_rows, query=query))

    async def search_text_many(self, queries: Sequence[TextQuery]) -> list[TextResult]:
        def run(conn: sqlite3.Connection) -> list[TextResult]:
            out = []
            for query in queries:
                started = time.perf_counter()
                rows = self._text_rows(conn, query)
                out.append(TextResult(rows, time.perf_counter() - started))
            return out

        return await self._db.read(run)

    def _text_rows(self, conn: sqlite3.Connection, query: TextQuery) -> list[SearchRow]:
        """One text search, inside a read transaction on a reader thread."""
        scope_id, family, terms, limit = query.scope_id, query.family, query.terms, query.limit
        kind, min_match, enough = query.kind, query.min_match, query.enough
        if not terms:
            return []
        key = fts_key(scope_id, family)

        def phrase(term: str) -> str:  # a query term as its one-token phrase in this key's index
            return f'"{key}{term}"'

        # Terms absent from this scope and family cannot help a document reach the floor: drop them, and
        # push the floor into the match so BM25 only scores documents admission could accept.
        # The terms not known to be present are probed together first: a query's unknown terms are
        # mostly absent ones (a remembered term is not probed again), and then one probe says so for all.
        candidates = terms[:MAX_QUERY_TERMS]
        unknown = self._present.unknown(scope_id, family, candidates)

        def holds(expression: str) -> bool:
            probe = "SELECT 1 FROM ctx_terms WHERE ctx_terms MATCH ? LIMIT 1"
            return conn.execute(probe, (expression,)).fetchone() is not None

        found: set[str] = set()
        if len(unknown) == 1 or (unknown and holds(" OR ".join(phrase(t) for t in unknown))):
            found = {t for t in unknown if holds(phrase(t))}
        present = self._present.settle(scope_id, family, candidates, unknown, found)
        groups = floor_groups(present, min_match)
        if not present or groups == []:
            return []
        # BM25 scores each present term a row holds once (PowerContext's plain OR); `at_least` pushes the
        # floor into the match without scoring a term once per k-term group.
        # The floor names a term in several phrases, and bm25() walks each phrase's postings for its IDF;
        # `wg_bm25` walks each term's once, with the same scores (its map says which phrase holds which).
        wanted = floor_cut(limit, enough, groups, min_match)
        native = len(present) <= 64 and self._db.ranks_natively(conn)
        k = 1 if groups is None else min_match
        match = at_least(present, k, phrase, exclusive=not native)
        rank, rank_args = "bm25(ctx_terms)", []
        if native:
            # `wg_bm25` skips the length read (and scores 0.0) for a row that cannot reach the cut below;
            # with a kind filter there is no cut before it (0: every row scored).
            prune = wanted if kind is None else 0
            known = ",".join(str(n) for n in self._rows_holding(conn, [phrase(t) for t in present]))
            rank = "wg_bm25(ctx_terms, ?, ?, ?)"
            rank_args = [phrase_map(present, k, exclusive=False), prune, known]
        # Score every match once, in the FTS table alone; join the artifacts rows only of matches that can
        # still be in the top `limit` by (score, artifact_id) — every row scoring no worse than the
        # limit-th best, ties included — and read revision bodies only for the final rows. The index holds
        # exactly the searchable rows of its key, so the cut is exact; a kind filter drops rows after
        # scoring and so cannot cut before the join.
        if kind is None:
            cut = "AND m.s <= coalesce((SELECT s FROM m ORDER BY s LIMIT 1 OFFSET ?), 1e308) "
            cut_args: list[Any] = [max(0, wanted - 1)]
        else:
            cut, cut_args = "AND a.kind = ? ", [kind]
        sql = (
            "WITH m AS MATERIALIZED "
            f"(SELECT rowid AS rid, {rank} AS s FROM ctx_terms WHERE ctx_terms MATCH ?), "
            "top AS (SELECT a.rid, a.artifact_id, m.s FROM m JOIN ctx_artifacts a ON a.rid = m.rid "
            f"WHERE a.searchable = 1 AND a.scope_id = ? AND a.family = ? {cut}"
            "ORDER BY m.s, a.artifact_id LIMIT ?) "
            "SELECT top.artifact_id, r.revision, r.content, r.content_digest, r.created_at, r.created_by, "
            "r.source_id, r.previous_revision, r.reason, r.restored_from_revision, top.s, a.state_version "
            "FROM top JOIN ctx_artifacts a ON a.rid = top.rid JOIN ctx_revisions r "
            "ON r.scope_id = a.scope_id AND r.family = a.family AND r.artifact_id = a.artifact_id "
            "AND r.revision = a.head_revision ORDER BY top.s, top.artifact_id"
        )
        args: list[Any] = [*rank_args, match, scope_id, family, *cut_args, wanted]
        return [
            SearchRow(_head_from_row(scope_id, family, r[:10]), float(r[10]), r[11])
            for r in conn.execute(sql, args).fetchall()
        ]

    def _rows_holding(self, conn: sqlite3.Connection, phrases: Sequence[str]) -> list[int]:
        """How many rows of the index hold each one-token phrase, in this read transaction's snapshot:
        what `wg_bm25` would otherwise count by walking each term's whole posting list on every
        statement (a fifth of a 100,000-memory search). Kept per reader connection while its
        snapshot's `PRAGMA data_version` stays the same (a reader never writes; any commit by another
        connection, process or replica on the file changes it); the missing ones are counted by
        `wg_df` in one statement, the same walk."""
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        held: tuple[sqlite3.Connection, int, dict[str, int]] | None = getattr(self._doc_counts, "held", None)
        if held is None or held[0] is not conn or held[1] != version:
            held = self._doc_counts.held = (conn, version, {})
        counts = held[2]
        missing = list(dict.fromkeys(p for p in phrases if p not in counts))
        if missing:
            if len(counts) + len(missing) > DOC_COUNTS_KEPT:
                counts.clear()
            sql = "SELECT wg_df(ctx_terms) FROM ctx_terms WHERE ctx_terms MATCH ? LIMIT 1"
            row = conn.execute(sql, (" OR ".join(missing),)).fetchone()
            found = [int(n) for n in row[0].split(",")] if row is not None else [0] * len(missing)
            counts.update(zip(missing, found, strict=True))
        return [counts[p] for p in phrases]

    async def search_vector(
        self,
        scope_id: str,
        family: str,
        vector: Sequence[float],
        limit: int,
        min_cosine: float,
        kind: str | None = None,
    ) -> list[SearchRow]:
        query = array("d", vector).tobytes()

        def run(conn: sqlite3.Connection) -> list[SearchRow]:
            sql = (
                "SELECT artifact_id, vector FROM ctx_artifacts WHERE scope_id = ? AND family = ? "
                "AND searchable = 1 AND vector IS NOT NULL "
            )
            args: list[Any] = [scope_id, family]
            if kind is not None:
                sql += "AND kind = ?"
                args.append(kind)
            scored = admitted(query, conn.execute(sql, args).fetchall(), min_cosine)
            best = heapq.nsmallest(limit, scored, key=lambda x: (-x[0], x[1]))
            out: list[SearchRow] = []
            for cos, artifact_id in best:
                row = conn.execute(
                    _HEAD_STATE_SQL + "WHERE a.scope_id = ? AND a.family = ? AND a.artifact_id = ?",
                    (scope_id, family, artifact_id),
                ).fetchone()
                out.append(SearchRow(_head_from_row(scope_id, family, row[1:]), cos, row[0]))
            return out

        return await self._db.read(run)

    async def vectors_complete(self, scope_id: str, family: str) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM ctx_artifacts WHERE scope_id = ? AND family = ? AND searchable = 1 "
                "AND vector IS NULL LIMIT 1",
                (scope_id, family),
            ).fetchone()
            return row is None

        return await self._db.read(run)

    async def missing_vectors(self, limit: int) -> list[MissingVector]:
        def run(conn: sqlite3.Connection) -> list[MissingVector]:
            rows = conn.execute(
                "SELECT scope_id, family, artifact_id, head_revision, search_text FROM ctx_artifacts "
                "WHERE searchable = 1 AND vector IS NULL ORDER BY rid LIMIT ?",
                (limit,),
            ).fetchall()
            return [MissingVector(*r) for r in rows]

        return await self._db.read(run)

    async def set_vector(
        self, scope_id: str, family: str, artifact_id: str, revision: int, vector: Sequence[float]
    ) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "UPDATE ctx_artifacts SET vector = ? WHERE scope_id = ? AND family = ? AND artifact_id = ? "
                "AND head_revision = ?",
                (pack_vector(vector), scope_id, family, artifact_id, revision),
            )
            return cur.rowcount == 1

        return await self._db.write(run)


def _atomic_record(artifact_id: str, row: Sequence[Any]) -> AtomicMemoryRecord:
    head, kind, content, state, version, merged_into = row
    text = json.loads(content)["text"]
    return AtomicMemoryRecord(
        ArtifactRef(Family.ATOMIC_MEMORY.value, artifact_id, head), kind, text, MemoryState(state), version, merged_into
    )
