# ruff: noqa: S608  -- SQL text only interpolates module constants and "%s" placeholder lists
"""The PostgreSQL context store: psycopg 3 async with a psycopg_pool pool, tsvector/tsquery search.

Owns: `PostgresDatabase` — the pool, the optional schema it lives in (search_path), and applying
registered migrations under an advisory lock — and `PostgresContextStore`, the ContextStore on it.
Text search indexes analyzer-v1 tokens with `array_to_tsvector` (no PostgreSQL parser in between,
so lexemes equal our terms exactly; a token past PostgreSQL's lexeme bound is indexed and looked up
as a fixed-length stand-in, `_lexeme`) and ranks with `ts_rank` (term coverage, not BM25). Vectors
live in a `real[]` column (pgvector is not required); cosine is a dot product of unit vectors
computed in SQL over the scope's searchable rows — a sequential scan, linear in rows × dimensions.
Replace is a compare-and-set under `SELECT … FOR UPDATE`, so concurrent writers never lose an update.
Must not: validate content, generate ids, read clocks or decide policy.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from gateway.context import search
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
    check_merge_input,
    floor_cut,
    floor_groups,
    lifecycle_step,
    revision_from_row,
)
from gateway.context.store.migrations import LEDGER_TABLE, Migration, plan

T = TypeVar("T")
Conn = psycopg.AsyncConnection[Any]

CONTEXT_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        component="context",
        version=1,
        sqlite=(),  # see sqlite.CONTEXT_MIGRATIONS
        postgres=(
            """CREATE TABLE ctx_scopes(
                scope_id text COLLATE "C" PRIMARY KEY, title text NOT NULL, summary text NOT NULL,
                parent_scope_id text, context_references text NOT NULL, external_references text NOT NULL,
                version integer NOT NULL, created_by text, created_at text NOT NULL, idem_owner text,
                idem_key text, fingerprint text NOT NULL)""",
            "CREATE UNIQUE INDEX ctx_scopes_idem ON ctx_scopes(idem_owner, idem_key) WHERE idem_key IS NOT NULL",
            """CREATE TABLE ctx_artifacts(
                rid bigserial PRIMARY KEY, scope_id text COLLATE "C" NOT NULL REFERENCES ctx_scopes(scope_id),
                family text COLLATE "C" NOT NULL, artifact_id text COLLATE "C" NOT NULL,
                head_revision integer NOT NULL, kind text, state text, state_version integer NOT NULL DEFAULT 0,
                merged_into_id text, searchable boolean NOT NULL, search_text text, tsv tsvector, vector real[],
                UNIQUE(scope_id, family, artifact_id))""",
            "CREATE INDEX ctx_artifacts_tsv ON ctx_artifacts USING gin(tsv) WHERE searchable",
            "CREATE INDEX ctx_artifacts_searchable ON ctx_artifacts(scope_id, family, artifact_id) WHERE searchable",
            """CREATE TABLE ctx_revisions(
                scope_id text COLLATE "C" NOT NULL, family text COLLATE "C" NOT NULL,
                artifact_id text COLLATE "C" NOT NULL, revision integer NOT NULL, content text NOT NULL,
                content_digest text NOT NULL, created_at text NOT NULL, created_by text, source_id text NOT NULL,
                previous_revision integer, reason text, restored_from_revision integer,
                PRIMARY KEY(scope_id, family, artifact_id, revision))""",
        ),
    ),
    Migration(
        # Version 1 left tokens past PostgreSQL's lexeme bound out of the index (SQLite indexes them):
        # the rows that hold one are indexed again, with their stand-ins (`_lexeme`).
        component="context",
        version=2,
        sqlite=(),
        postgres=(),
        postgres_step=lambda conn: _index_long_tokens(conn),
    ),
)
_MIGRATION_LOCK = 0x77670001  # advisory lock key: one migrator at a time across replicas


class PostgresDatabase:
    """A connection pool (optionally confined to one schema). Other table owners register migrations here."""

    def __init__(
        self,
        conninfo: str,
        migrations: Sequence[Migration] = CONTEXT_MIGRATIONS,
        *,
        schema: str | None = None,
        min_size: int = 1,  # connections kept open
        max_size: int = 8,  # ceiling on concurrent statements against the server
    ) -> None:
        if schema is not None and not (schema.isidentifier() and schema.isascii()):
            raise ValueError("schema must be a plain identifier")
        self._conninfo = conninfo
        self._migrations = tuple(migrations)
        self._schema = schema
        kwargs: dict[str, Any] = {"autocommit": True}
        if schema is not None:
            kwargs["options"] = f"-c search_path={schema}"
        self._pool = AsyncConnectionPool(conninfo, min_size=min_size, max_size=max_size, kwargs=kwargs, open=False)

    async def open(self) -> None:
        if self._schema is not None:
            # Under the migrations' lock: replicas starting together on an empty database
            # would otherwise race on the schema (IF NOT EXISTS is not safe concurrently).
            connect = psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
            async with await connect as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
                await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
        await self._pool.open(wait=True)
        await self.write(self._migrate)

    async def _migrate(self, conn: Conn) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE}(component text NOT NULL, version integer NOT NULL, "
            "PRIMARY KEY(component, version))"
        )
        cur = await conn.execute(f"SELECT component, max(version) FROM {LEDGER_TABLE} GROUP BY 1")
        applied = {c: v for c, v in await cur.fetchall()}
        for m in plan(applied, self._migrations):
            for statement in m.postgres:
                await conn.execute(statement)  # migration text is a trusted constant
            if m.postgres_step is not None:
                await m.postgres_step(conn)
            await conn.execute(
                f"INSERT INTO {LEDGER_TABLE}(component, version) VALUES (%s, %s)", (m.component, m.version)
            )

    async def close(self) -> None:
        await self._pool.close()

    async def drop_schema(self) -> None:
        """Tests: remove the schema this database was confined to."""
        if self._schema is None:
            raise RuntimeError("no schema")
        async with await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{self._schema}" CASCADE')

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Conn]:
        async with self._pool.connection() as conn:
            yield conn

    async def read(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """Reads are single statements in autocommit mode (each its own snapshot): no BEGIN/COMMIT round trips."""
        async with self._pool.connection() as conn:
            return await fn(conn)

    async def write(self, fn: Callable[[Conn], Awaitable[T]]) -> T:
        """One transaction; any exception rolls it back."""
        async with self._pool.connection() as conn, conn.transaction():
            return await fn(conn)


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
_RECORD_SQL = (
    "SELECT a.artifact_id, a.head_revision, a.kind, r.content, a.state, a.state_version, a.merged_into_id "
    "FROM ctx_artifacts a JOIN ctx_revisions r ON r.scope_id = a.scope_id AND r.family = a.family "
    "AND r.artifact_id = a.artifact_id AND r.revision = a.head_revision "
)


def _nul(value: str | None) -> bool:
    """PostgreSQL text cannot hold U+0000: psycopg refuses a parameter holding one (DataError)
    before the statement runs. Nothing stored holds one (the API refuses NUL in every text it
    stores or filters by, and path ids holding one never get here), so a lookup by a key with
    one finds nothing, without asking the server: the answer SQLite gives for the same key."""
    return value is not None and "\x00" in value


def _after(after: str | None) -> str:
    """A listing position (a cursor's, which a client can write) the server can bind. Columns
    compare bytewise (COLLATE "C", as SQLite's BINARY), and no stored key holds a NUL, so
    `key > p + NUL + rest` is exactly `key > p`: the position is cut at its first NUL."""
    return (after or "").split("\x00", 1)[0]


def _scope_from_row(row: Sequence[Any]) -> ScopeRecord:
    sid, title, summary, parent, refs, ext, version, created_by, created_at = row
    return ScopeRecord(
        sid, title, summary, parent, tuple(json.loads(refs)), tuple(json.loads(ext)), version, created_by, created_at
    )


def _atomic_record(row: Sequence[Any]) -> AtomicMemoryRecord:
    artifact_id, head, kind, content, state, version, merged_into = row
    return AtomicMemoryRecord(
        ArtifactRef(Family.ATOMIC_MEMORY.value, artifact_id, head),
        kind,
        json.loads(content)["text"],
        MemoryState(state),
        version,
        merged_into,
    )


# Atomic memory states whose content is frozen: 1.4.1 edits an active or forgotten memory only.
_FROZEN_STATES = frozenset({MemoryState.MERGED.value, MemoryState.RETIRED.value})


def _searchable(family: str, state: MemoryState | None) -> bool:
    return Family(family) in SEARCHABLE_FAMILIES and state in (None, MemoryState.ACTIVE)


_MAX_LEXEME_BYTES = 2047  # PostgreSQL's bound on a tsvector lexeme and on a tsquery operand
# Analyzer-v1 tokens are runs of letters, marks and digits: none holds '#' or ':', so no token spells a stand-in.
_STAND_IN_PREFIX = "#sha256:"


def _lexeme(term: str) -> str:
    """The lexeme a token is indexed and looked up as: the token itself, or — past PostgreSQL's
    bound (an unbroken run of Thai, Lao, Khmer or Myanmar passes it within a sentence) — a
    fixed-length stand-in, the SHA-256 of its UTF-8 after a prefix no token can spell. The same
    when writing and when searching, so a long token matches exactly itself, as it does in
    SQLite's index; it is one lexeme for ts_rank like any other term."""
    raw = term.encode("utf-8")
    if len(raw) <= _MAX_LEXEME_BYTES:
        return term
    return _STAND_IN_PREFIX + hashlib.sha256(raw).hexdigest()


def _text_candidates(query: TextQuery) -> list[str]:
    """The lexemes of a query's first MAX_QUERY_TERMS terms (the terms SQLite looks up)."""
    if _nul(query.kind):  # no stored kind holds one: nothing to find
        return []
    return [_lexeme(t) for t in query.terms[:MAX_QUERY_TERMS]]


def _index_lexemes(tokens: Sequence[str]) -> list[str]:
    return sorted({_lexeme(t) for t in tokens})


def _lexemes(rev: NewRevision | None) -> list[str] | None:
    if rev is None or rev.search_text is None:
        return None
    return _index_lexemes(rev.search_tokens)


def _tsquery(lexemes: Sequence[str]) -> str:
    # Lexemes are runs of letters/marks/digits (analyzer v1) or stand-ins: no quote, backslash or operator.
    return " | ".join(f"'{t}'" for t in lexemes[:MAX_QUERY_TERMS])


# A token longer than `_MAX_LEXEME_BYTES` comes only from a text longer than these many bytes: an
# ASCII text's tokens are its own lowercase runs; otherwise NFC (which decomposes first, U+0390 at
# worst) and then casefold (U+0390 again) each make a character's UTF-8 at most three times as long.
_LONG_ASCII_TEXT = _MAX_LEXEME_BYTES
_LONG_TEXT = _MAX_LEXEME_BYTES // 9
_REINDEX_BATCH = 500


async def _index_long_tokens(conn: Conn) -> None:
    """Context migration 2: index again, with `search_text`'s analyzer-v1 tokens (those its
    writer stored), every searchable row a token past the lexeme bound was left out of."""
    after = 0
    while True:
        cur = await conn.execute(
            "SELECT rid, search_text FROM ctx_artifacts WHERE searchable AND rid > %s AND search_text IS NOT NULL "
            "AND (octet_length(search_text) > %s OR (octet_length(search_text) > %s "
            "AND octet_length(search_text) <> char_length(search_text))) ORDER BY rid LIMIT %s",
            (after, _LONG_ASCII_TEXT, _LONG_TEXT, _REINDEX_BATCH),
        )
        rows = await cur.fetchall()
        if not rows:
            return
        after = rows[-1][0]
        updates = []
        for rid, text in rows:
            tokens = search.tokens(text)
            if any(len(t.encode("utf-8")) > _MAX_LEXEME_BYTES for t in tokens):
                updates.append((_index_lexemes(tokens), rid))
        if updates:
            async with conn.cursor() as upd:
                await upd.executemany(
                    "UPDATE ctx_artifacts SET tsv = array_to_tsvector(%s::text[]) WHERE rid = %s", updates
                )


class PostgresContextStore:
    # ts_rank is no BM25 and ranks the other way: it keeps its own name, after 1.4.1's
    # `<backend>_<function>` pattern (`sqlite_bm25`, `oceanbase_match`); text rows hold −ts_rank.
    text_metric = ("postgres_ts_rank", True)

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._present = PresentTerms()

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    # ---- scopes -------------------------------------------------------------------------------

    async def _insert_scope(self, conn: Conn, new: NewScope) -> bool:
        cur = await conn.execute(
            f"INSERT INTO ctx_scopes({_SCOPE_COLS}, idem_owner, idem_key, fingerprint) "
            "VALUES (%s, %s, %s, %s, %s, %s, 1, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1",
            (
                new.scope_id,
                new.title,
                new.summary,
                new.parent_scope_id,
                json.dumps(list(new.context_references)),
                json.dumps([dict(r) for r in new.external_references]),
                new.created_by,
                new.created_at,
                (new.created_by or "") if new.idempotency_key is not None else None,
                new.idempotency_key,
                new.fingerprint,
            ),
        )
        return await cur.fetchone() is not None

    async def _scope(self, conn: Conn, scope_id: str) -> ScopeRecord | None:
        cur = await conn.execute(f"SELECT {_SCOPE_COLS} FROM ctx_scopes WHERE scope_id = %s", (scope_id,))
        row = await cur.fetchone()
        return _scope_from_row(row) if row is not None else None

    async def create_scope(self, new: NewScope) -> tuple[ScopeRecord, bool]:
        async def run(conn: Conn) -> tuple[ScopeRecord, bool]:
            if await self._insert_scope(conn, new):
                scope = await self._scope(conn, new.scope_id)
                assert scope is not None
                return scope, True
            cur = await conn.execute(
                f"SELECT {_SCOPE_COLS}, fingerprint FROM ctx_scopes WHERE idem_owner = %s AND idem_key = %s",
                (new.created_by or "", new.idempotency_key),
            )
            row = await cur.fetchone()
            if row is None:
                raise ScopeIdempotencyConflict()  # an id collision; never silently merge two scopes
            if row[-1] != new.fingerprint:
                raise ScopeIdempotencyConflict()
            return _scope_from_row(row[:-1]), False

        return await self._db.write(run)

    async def ensure_scope(self, new: NewScope) -> ScopeRecord:
        async def run(conn: Conn) -> ScopeRecord:
            await self._insert_scope(conn, new)
            scope = await self._scope(conn, new.scope_id)
            assert scope is not None
            return scope

        return await self._db.write(run)

    async def get_scope(self, scope_id: str) -> ScopeRecord | None:
        return await self._db.read(lambda conn: self._scope(conn, scope_id))

    async def list_scopes(self, after: str | None, limit: int) -> list[ScopeRecord]:
        async def run(conn: Conn) -> list[ScopeRecord]:
            cur = await conn.execute(
                f"SELECT {_SCOPE_COLS} FROM ctx_scopes WHERE scope_id > %s ORDER BY scope_id LIMIT %s",
                (_after(after), limit),
            )
            return [_scope_from_row(r) for r in await cur.fetchall()]

        return await self._db.read(run)

    # ---- artifacts ----------------------------------------------------------------------------

    @staticmethod
    async def _insert_revision(
        conn: Conn, scope_id: str, family: str, artifact_id: str, revision: int, rev: NewRevision
    ) -> None:
        await conn.execute(
            f"INSERT INTO ctx_revisions(scope_id, family, artifact_id, {REVISION_COLUMNS}) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
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
    async def _revision(conn: Conn, scope_id: str, family: str, artifact_id: str, revision: int) -> ArtifactRevision:
        cur = await conn.execute(
            f"SELECT {REVISION_COLUMNS} FROM ctx_revisions WHERE scope_id = %s AND family = %s AND artifact_id = %s "
            "AND revision = %s",
            (scope_id, family, artifact_id, revision),
        )
        row = await cur.fetchone()
        if row is None:
            raise ArtifactNotFound()
        return revision_from_row(scope_id, family, artifact_id, row)

    async def _create(
        self, conn: Conn, scope_id: str, family: str, artifact_id: str, rev: NewRevision
    ) -> ArtifactRevision:
        if await self._scope(conn, scope_id) is None:
            raise ScopeNotFound()
        state = MemoryState.ACTIVE if family == Family.ATOMIC_MEMORY else None
        searchable = _searchable(family, state) and rev.search_text is not None
        cur = await conn.execute(
            "INSERT INTO ctx_artifacts(scope_id, family, artifact_id, head_revision, kind, state, searchable, "
            "search_text, tsv, vector) VALUES (%s, %s, %s, 1, %s, %s, %s, %s, array_to_tsvector(%s::text[]), "
            "%s::real[]) ON CONFLICT DO NOTHING RETURNING 1",
            (
                scope_id,
                family,
                artifact_id,
                rev.kind,
                state.value if state else None,
                searchable,
                rev.search_text,
                _lexemes(rev) if searchable else None,
                list(rev.vector) if rev.vector is not None else None,
            ),
        )
        if await cur.fetchone() is None:
            raise ArtifactAlreadyExists()
        await self._insert_revision(conn, scope_id, family, artifact_id, 1, rev)
        return await self._revision(conn, scope_id, family, artifact_id, 1)

    async def create_artifact(self, scope_id: str, family: str, artifact_id: str, rev: NewRevision) -> ArtifactRevision:
        return await self._db.write(lambda conn: self._create(conn, scope_id, family, artifact_id, rev))

    async def replace_artifact(
        self, scope_id: str, family: str, artifact_id: str, expected_etag: str, rev: NewRevision
    ) -> ArtifactRevision:
        if _nul(artifact_id):
            raise ArtifactNotFound()

        async def run(conn: Conn) -> ArtifactRevision:
            cur = await conn.execute(
                "SELECT rid, head_revision, state FROM ctx_artifacts WHERE scope_id = %s AND family = %s "
                "AND artifact_id = %s FOR UPDATE",
                (scope_id, family, artifact_id),
            )
            row = await cur.fetchone()
            if row is None:
                raise ArtifactNotFound()
            rid, head, state = row
            if etag_for(head) != expected_etag:
                raise RevisionConflict(expected_etag, etag_for(head))
            if state in _FROZEN_STATES:
                raise InvalidMemoryState()
            searchable = _searchable(family, MemoryState(state) if state else None) and rev.search_text is not None
            await conn.execute(
                "UPDATE ctx_artifacts SET head_revision = %s, kind = %s, searchable = %s, search_text = %s, "
                "tsv = array_to_tsvector(%s::text[]), vector = %s::real[] WHERE rid = %s",
                (
                    head + 1,
                    rev.kind,
                    searchable,
                    rev.search_text,
                    _lexemes(rev) if searchable else None,
                    list(rev.vector) if rev.vector is not None else None,
                    rid,
                ),
            )
            await self._insert_revision(conn, scope_id, family, artifact_id, head + 1, rev)
            return await self._revision(conn, scope_id, family, artifact_id, head + 1)

        return await self._db.write(run)

    async def get_head(self, scope_id: str, family: str, artifact_id: str) -> ArtifactRevision | None:
        if _nul(artifact_id):
            return None

        async def run(conn: Conn) -> ArtifactRevision | None:
            cur = await conn.execute(
                _HEAD_SQL + "WHERE a.scope_id = %s AND a.family = %s AND a.artifact_id = %s",
                (scope_id, family, artifact_id),
            )
            row = await cur.fetchone()
            return revision_from_row(scope_id, family, row[0], row[1:]) if row is not None else None

        return await self._db.read(run)

    async def get_revision(
        self, scope_id: str, family: str, artifact_id: str, revision: int
    ) -> ArtifactRevision | None:
        if _nul(artifact_id):
            return None

        async def run(conn: Conn) -> ArtifactRevision | None:
            try:
                return await self._revision(conn, scope_id, family, artifact_id, revision)
            except ArtifactNotFound:
                return None

        return await self._db.read(run)

    async def list_heads(self, scope_id: str, family: str, after: str | None, limit: int) -> list[ArtifactRevision]:
        async def run(conn: Conn) -> list[ArtifactRevision]:
            cur = await conn.execute(
                _HEAD_SQL + "WHERE a.scope_id = %s AND a.family = %s AND a.artifact_id > %s "
                "AND (a.state IS NULL OR a.state NOT IN ('merged', 'retired')) ORDER BY a.artifact_id LIMIT %s",
                (scope_id, family, _after(after), limit),
            )
            return [revision_from_row(scope_id, family, r[0], r[1:]) for r in await cur.fetchall()]

        return await self._db.read(run)

    async def list_revisions(
        self, scope_id: str, family: str, artifact_id: str, before: int | None, limit: int
    ) -> list[ArtifactRevision]:
        if _nul(artifact_id):
            return []

        async def run(conn: Conn) -> list[ArtifactRevision]:
            cur = await conn.execute(
                f"SELECT {REVISION_COLUMNS} FROM ctx_revisions WHERE scope_id = %s AND family = %s "
                "AND artifact_id = %s AND revision < %s ORDER BY revision DESC LIMIT %s",
                (scope_id, family, artifact_id, before if before is not None else 2**31 - 1, limit),
            )
            return [revision_from_row(scope_id, family, artifact_id, r) for r in await cur.fetchall()]

        return await self._db.read(run)

    # ---- atomic memory ------------------------------------------------------------------------

    async def get_states(self, scope_id: str, artifact_ids: Sequence[str]) -> dict[str, AtomicMemoryState]:
        wanted = [aid for aid in dict.fromkeys(artifact_ids) if not _nul(aid)]

        async def run(conn: Conn) -> dict[str, AtomicMemoryState]:
            cur = await conn.execute(
                "SELECT artifact_id, head_revision, state, state_version, merged_into_id FROM ctx_artifacts "
                "WHERE scope_id = %s AND family = %s AND artifact_id = ANY(%s)",
                (scope_id, Family.ATOMIC_MEMORY.value, wanted),
            )
            return {
                aid: AtomicMemoryState(ArtifactRef(Family.ATOMIC_MEMORY.value, aid, head), MemoryState(state), v, m)
                for aid, head, state, v, m in await cur.fetchall()
            }

        return await self._db.read(run) if wanted else {}

    @staticmethod
    async def _record(conn: Conn, scope_id: str, artifact_id: str) -> AtomicMemoryRecord:
        if _nul(artifact_id):
            raise ArtifactNotFound()
        cur = await conn.execute(
            _RECORD_SQL + "WHERE a.scope_id = %s AND a.family = %s AND a.artifact_id = %s",
            (scope_id, Family.ATOMIC_MEMORY.value, artifact_id),
        )
        row = await cur.fetchone()
        if row is None:
            raise ArtifactNotFound()
        return _atomic_record(row)

    async def list_atomic(
        self, scope_id: str, states: frozenset[MemoryState], kind: str | None, after: str | None, limit: int
    ) -> list[AtomicMemoryRecord]:
        if _nul(kind):
            return []

        async def run(conn: Conn) -> list[AtomicMemoryRecord]:
            sql = _RECORD_SQL + "WHERE a.scope_id = %s AND a.family = %s AND a.state = ANY(%s) AND a.artifact_id > %s "
            args: list[Any] = [scope_id, Family.ATOMIC_MEMORY.value, sorted(s.value for s in states), _after(after)]
            if kind is not None:
                sql += "AND a.kind = %s "
                args.append(kind)
            sql += "ORDER BY a.artifact_id LIMIT %s"
            args.append(limit)
            cur = await conn.execute(sql, args)  # built from constants only
            return [_atomic_record(r) for r in await cur.fetchall()]

        return await self._db.read(run)

    @staticmethod
    async def _target_row(conn: Conn, scope_id: str, target: AtomicMemoryInput) -> Sequence[Any] | None:
        """`(rid, head_revision, state, state_version)` of a lifecycle target or merge input, locked
        for the transaction, or None."""
        if target.artifact.family != Family.ATOMIC_MEMORY.value:
            return None
        cur = await conn.execute(
            "SELECT rid, head_revision, state, state_version FROM ctx_artifacts WHERE scope_id = %s "
            "AND family = %s AND artifact_id = %s FOR UPDATE",
            (scope_id, Family.ATOMIC_MEMORY.value, target.artifact.artifact_id),
        )
        row: Sequence[Any] | None = await cur.fetchone()
        return row

    async def change_state(
        self, scope_id: str, target: AtomicMemoryInput, state: MemoryState
    ) -> tuple[AtomicMemoryRecord, bool]:
        async def run(conn: Conn) -> tuple[AtomicMemoryRecord, bool]:
            row = await self._target_row(conn, scope_id, target)
            step = lifecycle_step(row[1:] if row is not None else None, target, state)
            assert row is not None
            rid = row[0]
            if step == "ok":
                await conn.execute(
                    "UPDATE ctx_artifacts SET state = %s, state_version = state_version + 1, searchable = false, "
                    "tsv = NULL WHERE rid = %s",
                    (state.value, rid),
                )
            return await self._record(conn, scope_id, target.artifact.artifact_id), step == "ok"

        return await self._db.write(run)

    async def merge(
        self, scope_id: str, inputs: Sequence[AtomicMemoryInput], artifact_id: str, rev: NewRevision
    ) -> list[AtomicMemoryRecord]:
        async def run(conn: Conn) -> list[AtomicMemoryRecord]:
            rows: dict[str, Sequence[Any] | None] = {}
            for target in sorted(inputs, key=lambda t: t.artifact.artifact_id):  # one lock order: no deadlocks
                rows[target.artifact.artifact_id] = await self._target_row(conn, scope_id, target)
            rids: list[int] = []
            for target in inputs:  # in the caller's order: the first input that fails answers
                row = rows[target.artifact.artifact_id]
                check_merge_input(row[1:] if row is not None else None, target)
                assert row is not None
                rids.append(row[0])
            await self._create(conn, scope_id, Family.ATOMIC_MEMORY.value, artifact_id, rev)
            await conn.execute(
                "UPDATE ctx_artifacts SET state = %s, state_version = state_version + 1, merged_into_id = %s, "
                "searchable = false, tsv = NULL WHERE rid = ANY(%s)",
                (MemoryState.MERGED.value, artifact_id, rids),
            )
            ids = sorted({t.artifact.artifact_id for t in inputs} | {artifact_id})
            return [await self._record(conn, scope_id, i) for i in ids]

        return await self._db.write(run)

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
        query = TextQuery(scope_id, family, tuple(terms), limit, kind, min_match, enough)
        if not _text_candidates(query):
            return []

        async def run(conn: Conn) -> list[SearchRow]:
            return await self._text_rows(conn, query)

        return await self._db.read(run)

    async def search_text_many(self, queries: Sequence[TextQuery]) -> list[TextResult]:
        async def run(conn: Conn) -> list[TextResult]:
            out = []
            for query in queries:
                started = time.perf_counter()
                rows = await self._text_rows(conn, query) if _text_candidates(query) else []
                out.append(TextResult(rows, time.perf_counter() - started))
            return out

        return await self._db.read(run)

    async def _text_rows(self, conn: Conn, query: TextQuery) -> list[SearchRow]:
        """One text search, inside a read transaction."""
        scope_id, family, limit, kind = query.scope_id, query.family, query.limit, query.kind
        min_match, enough = query.min_match, query.enough
        candidates = _text_candidates(query)
        # Drop terms absent from this scope and family (GIN probes, only for terms not already known to be
        # present), then push the lexical floor into the tsquery so ranking only sees documents admission
        # could accept.
        unknown = self._present.unknown(scope_id, family, candidates)
        found: set[str] = set()
        if unknown:
            cur = await conn.execute(
                "SELECT t FROM unnest(CAST(%s AS text[])) AS u(t) WHERE EXISTS (SELECT 1 FROM ctx_artifacts a "
                "WHERE a.searchable AND a.scope_id = %s AND a.family = %s "
                "AND a.tsv @@ CAST(quote_literal(u.t) AS tsquery))",
                (unknown, scope_id, family),
            )
            found = {r[0] for r in await cur.fetchall()}
        present = self._present.settle(scope_id, family, candidates, unknown, found)
        groups = floor_groups(present, min_match)
        if not present or groups == []:
            return []
        if groups is None:
            tsquery = _tsquery(present)
        else:
            tsquery = " | ".join("(" + " & ".join(f"'{t}'" for t in g) + ")" for g in groups)
        # Rank on the artifacts rows first; read revision bodies only for the top rows.
        kind_filter = "AND a.kind = %s " if kind is not None else ""
        sql = (
            "WITH q AS (SELECT CAST(%s AS tsquery) AS q), top AS (SELECT a.rid, a.artifact_id, "
            "ts_rank(a.tsv, q.q) AS s FROM ctx_artifacts a, q WHERE a.searchable AND a.tsv @@ q.q "
            f"AND a.scope_id = %s AND a.family = %s {kind_filter}ORDER BY s DESC, a.artifact_id LIMIT %s) "
            "SELECT top.artifact_id, r.revision, r.content, r.content_digest, r.created_at, r.created_by, "
            "r.source_id, r.previous_revision, r.reason, r.restored_from_revision, top.s, a.state_version "
            "FROM top JOIN ctx_artifacts a ON a.rid = top.rid JOIN ctx_revisions r "
            "ON r.scope_id = a.scope_id AND r.family = a.family AND r.artifact_id = a.artifact_id "
            "AND r.revision = a.head_revision ORDER BY top.s DESC, top.artifact_id"
        )
        wanted = floor_cut(limit, enough, groups, min_match)
        args: list[Any] = [tsquery, scope_id, family, *([kind] if kind is not None else []), wanted]
        cur = await conn.execute(sql, args)  # built from constants only
        return [
            SearchRow(revision_from_row(scope_id, family, r[0], r[1:10]), -float(r[10]), r[11])
            for r in await cur.fetchall()
        ]

    async def search_vector(
        self,
        scope_id: str,
        family: str,
        vector: Sequence[float],
        limit: int,
        min_cosine: float,
        kind: str | None = None,
    ) -> list[SearchRow]:
        if _nul(kind):
            return []

        async def run(conn: Conn) -> list[SearchRow]:
            sql = (
                "SELECT * FROM (SELECT a.artifact_id, r.revision, r.content, r.content_digest, r.created_at, "
                "r.created_by, r.source_id, r.previous_revision, r.reason, r.restored_from_revision, "
                "(SELECT sum(x * y) FROM unnest(a.vector, CAST(%s AS real[])) AS t(x, y)) AS cos, a.state_version "
                "FROM ctx_artifacts a JOIN ctx_revisions r ON r.scope_id = a.scope_id AND r.family = a.family "
                "AND r.artifact_id = a.artifact_id AND r.revision = a.head_revision "
                "WHERE a.searchable AND a.vector IS NOT NULL AND a.scope_id = %s AND a.family = %s "
                "AND cardinality(a.vector) = %s "
            )
            args: list[Any] = [list(vector), scope_id, family, len(vector)]
            if kind is not None:
                sql += "AND a.kind = %s "
                args.append(kind)
            sql += ") AS s WHERE cos >= %s ORDER BY cos DESC, artifact_id LIMIT %s"
            args += [min_cosine, limit]
            cur = await conn.execute(sql, args)  # built from constants only
            return [
                SearchRow(revision_from_row(scope_id, family, r[0], r[1:10]), float(r[10]), r[11])
                for r in await cur.fetchall()
            ]

        return await self._db.read(run)

    async def vectors_complete(self, scope_id: str, family: str) -> bool:
        async def run(conn: Conn) -> bool:
            cur = await conn.execute(
                "SELECT 1 FROM ctx_artifacts WHERE scope_id = %s AND family = %s AND searchable "
                "AND vector IS NULL LIMIT 1",
                (scope_id, family),
            )
            return await cur.fetchone() is None

        return await self._db.read(run)

    async def missing_vectors(self, limit: int) -> list[MissingVector]:
        async def run(conn: Conn) -> list[MissingVector]:
            cur = await conn.execute(
                "SELECT scope_id, family, artifact_id, head_revision, search_text FROM ctx_artifacts "
                "WHERE searchable AND vector IS NULL ORDER BY rid LIMIT %s",
                (limit,),
            )
            return [MissingVector(*r) for r in await cur.fetchall()]

        return await self._db.read(run)

    async def set_vector(
        self, scope_id: str, family: str, artifact_id: str, revision: int, vector: Sequence[float]
    ) -> bool:
        async def run(conn: Conn) -> bool:
            cur = await conn.execute(
                "UPDATE ctx_artifacts SET vector = %s::real[] WHERE scope_id = %s AND family = %s "
                "AND artifact_id = %s AND head_revision = %s",
                (list(vector), scope_id, family, artifact_id, revision),
            )
            return cur.rowcount == 1

        return await self._db.write(run)
