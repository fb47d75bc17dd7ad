"""The context store interface: records it returns, inputs it takes, and the async operations.

Owns: the frozen records (ScopeRecord, ArtifactRevision, AtomicMemoryState, AtomicMemoryRecord,
SearchRow), the write inputs (NewScope, NewRevision), and the `ContextStore` protocol every backend
implements, with each operation's atomicity promise written on it.
Must not: import a database driver, generate ids, read clocks, or decide policy (validation,
write checks and authorisation happen in the service before a store is called).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.context.model import ArtifactRef, AtomicMemoryInput, MemoryState, etag_for, state_etag_for


@dataclass(frozen=True, slots=True)
class ScopeRecord:
    scope_id: str
    title: str
    summary: str
    parent_scope_id: str | None
    context_references: tuple[str, ...]
    external_references: tuple[Mapping[str, Any], ...]
    version: int
    created_by: str | None  # the creating principal, so the API layer can authorise a creator
    created_at: str

    def to_wire(self) -> dict[str, Any]:
        """1.4.1 `ScopeDescriptor`."""
        return {
            "scope_id": self.scope_id,
            "title": self.title,
            "summary": self.summary,
            "parent_scope_id": self.parent_scope_id,
            "context_references": list(self.context_references),
            "external_references": [dict(r) for r in self.external_references],
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class NewScope:
    scope_id: str
    title: str
    summary: str
    parent_scope_id: str | None
    context_references: tuple[str, ...]
    external_references: tuple[Mapping[str, Any], ...]
    idempotency_key: str | None
    fingerprint: str  # digest of the creation parameters: same key + same fingerprint = same scope
    created_by: str | None
    created_at: str


@dataclass(frozen=True, slots=True)
class ArtifactRevision:
    """One immutable revision of one artifact."""

    scope_id: str
    family: str
    artifact_id: str
    revision: int
    content: Mapping[str, Any]
    content_digest: str
    created_at: str
    created_by: str | None
    source_id: str
    previous: ArtifactRef | None
    reason: str | None = None
    restored_from_revision: int | None = None

    @property
    def ref(self) -> ArtifactRef:
        return ArtifactRef(self.family, self.artifact_id, self.revision)

    @property
    def etag(self) -> str:
        return etag_for(self.revision)

    def _common(self) -> dict[str, Any]:
        return {
            "scope_id": self.scope_id,
            "family": self.family,
            "artifact_id": self.artifact_id,
            "revision": self.revision,
        }

    def to_created(self) -> dict[str, Any]:
        """1.4.1 `ArtifactCreated` (201 body)."""
        return {
            **self._common(),
            "sources": [{"source_type": "content", "source_id": self.source_id}],
            "artifacts": [],
        }

    def to_wire(self) -> dict[str, Any]:
        """1.4.1 `ArtifactRevision`."""
        return {
            **self._common(),
            "content": dict(self.content),
            "sources": [{"source_type": "content", "source_id": self.source_id}],
            "artifacts": [self.previous.to_wire()] if self.previous else [],
            "content_digest": self.content_digest,
            "created_at": self.created_at,
            "created_by": None,  # 1.4.1: an AccessPrincipal only on rollbacks; ordinary revisions omit it
            "restored_from_revision": self.restored_from_revision,
            "reason": self.reason,
        }

    def to_collection_item(self) -> dict[str, Any]:
        """1.4.1 `ArtifactCollectionItem` (list heads / list revisions): no content."""
        return {
            **self._common(),
            "sources": [{"source_type": "content", "source_id": self.source_id}],
            "artifacts": [self.previous.to_wire()] if self.previous else [],
            "content_digest": self.content_digest,
            "title": None,
            "summary": None,
            "published_at": None,
            "source_count": None,
            "created_at": self.created_at,
            "created_by": None,  # 1.4.1: an AccessPrincipal only on rollbacks; ordinary revisions omit it
            "restored_from_revision": self.restored_from_revision,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class AtomicMemoryState:
    artifact: ArtifactRef  # the current head
    state: MemoryState
    state_version: int
    merged_into_id: str | None

    @property
    def etag(self) -> str:
        return state_etag_for(self.artifact.revision, self.state_version)

    def to_wire(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact.to_wire(),
            "state": self.state.value,
            "state_version": self.state_version,
            "merged_into_id": self.merged_into_id,
        }


@dataclass(frozen=True, slots=True)
class AtomicMemoryRecord:
    artifact: ArtifactRef
    kind: str
    text: str
    state: MemoryState
    state_version: int
    merged_into_id: str | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact.to_wire(),
            "kind": self.kind,
            "text": self.text,
            "state": self.state.value,
            "state_version": self.state_version,
            "merged_into_id": self.merged_into_id,
        }


@dataclass(frozen=True, slots=True)
class NewRevision:
    """Everything a create/replace stores, computed by the service before the store is called."""

    content: Mapping[str, Any]
    content_digest: str
    content_json: str  # `content` as JSON in its own key order (the digest is over the RFC 8785 form)
    kind: str | None  # atomic memory kind
    search_text: str | None  # None: not indexed
    search_tokens: tuple[str, ...]  # analyzer v1 tokens of search_text
    vector: tuple[float, ...] | None  # unit vector, None when embedding is off or failed
    created_at: str
    created_by: str | None
    source_id: str
    reason: str | None = None
    restored_from_revision: int | None = None


@dataclass(frozen=True, slots=True)
class SearchRow:
    """A searchable head returned by a backend search, with the backend's raw score."""

    head: ArtifactRevision
    # Text search: the rank key, lower first (SQLite's bm25(); PostgreSQL's −ts_rank).
    # Vector search: the cosine similarity, higher first.
    score: float
    state_version: int  # the artifact's state version, read with the head


@dataclass(frozen=True, slots=True)
class TextQuery:
    """The arguments of one `ContextStore.search_text` call, for `search_text_many`."""

    scope_id: str
    family: str
    terms: tuple[str, ...]
    limit: int
    kind: str | None = None
    min_match: int = 1
    enough: int | None = None


@dataclass(frozen=True, slots=True)
class TextResult:
    rows: list[SearchRow]
    seconds: float  # what the backend spent on this query (the stage timings of a receipt)


@dataclass(frozen=True, slots=True)
class MissingVector:
    scope_id: str
    family: str
    artifact_id: str
    revision: int
    text: str


class ContextStore(Protocol):
    """Async storage of scopes, artifact revisions, atomic memory state and search indexes.

    Every mutating method is one transaction: it either happens completely or not at all, and an
    acknowledged (returned) write survives a process kill.
    """

    # How the backend's text score reads (reported with search scores): its name and whether a
    # higher raw value ranks first (then a text row's `score` is the raw value negated).
    text_metric: tuple[str, bool]

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    # scopes
    async def create_scope(self, new: NewScope) -> tuple[ScopeRecord, bool]:
        """Insert, or return the scope an equal (key, fingerprint) already made (created=False).
        The same key with another fingerprint raises ScopeIdempotencyConflict."""
        ...

    async def ensure_scope(self, new: NewScope) -> ScopeRecord:
        """Insert `new` unless a scope with its id exists; return the stored scope."""
        ...

    async def get_scope(self, scope_id: str) -> ScopeRecord | None: ...

    async def list_scopes(self, after: str | None, limit: int) -> list[ScopeRecord]:
        """Ordered by scope_id, strictly after `after`."""
        ...

    # artifacts
    async def create_artifact(self, scope_id: str, family: str, artifact_id: str, rev: NewRevision) -> ArtifactRevision:
        """Revision 1. ScopeNotFound / ArtifactAlreadyExists."""
        ...

    async def replace_artifact(
        self, scope_id: str, family: str, artifact_id: str, expected_etag: str, rev: NewRevision
    ) -> ArtifactRevision:
        """Compare-and-set on the head: the new revision is head+1 only if `expected_etag` is exactly the
        current head's ETag, else RevisionConflict(provided, current); then InvalidMemoryState when it is a
        merged or retired atomic memory (a forgotten one is edited and stays forgotten). ArtifactNotFound."""
        ...

    async def get_head(self, scope_id: str, family: str, artifact_id: str) -> ArtifactRevision | None: ...

    async def get_revision(
        self, scope_id: str, family: str, artifact_id: str, revision: int
    ) -> ArtifactRevision | None: ...

    async def list_heads(self, scope_id: str, family: str, after: str | None, limit: int) -> list[ArtifactRevision]:
        """Heads ordered by artifact_id, leaving out merged and retired atomic memories (1.4.1
        lists neither; forgotten ones are listed)."""
        ...

    async def list_revisions(
        self, scope_id: str, family: str, artifact_id: str, before: int | None, limit: int
    ) -> list[ArtifactRevision]:
        """Newest first, strictly below `before`."""
        ...

    # atomic memory
    async def get_states(self, scope_id: str, artifact_ids: Sequence[str]) -> dict[str, AtomicMemoryState]:
        """The states of those atomic memories of the scope that exist, by artifact id (one read)."""
        ...

    async def list_atomic(
        self, scope_id: str, states: frozenset[MemoryState], kind: str | None, after: str | None, limit: int
    ) -> list[AtomicMemoryRecord]: ...

    async def change_state(
        self, scope_id: str, target: AtomicMemoryInput, state: MemoryState
    ) -> tuple[AtomicMemoryRecord, bool]:
        """Lifecycle change guarded by the exact head revision (MemoryRevisionStale) and state_version
        (AtomicMemoryChanged); ValueNotFound for no such memory, InvalidMemoryState for a transition
        that is not allowed (store/common.py `lifecycle_step`); (record, changed)."""
        ...

    async def merge(
        self, scope_id: str, inputs: Sequence[AtomicMemoryInput], artifact_id: str, rev: NewRevision
    ) -> list[AtomicMemoryRecord]:
        """Inputs (each exact and active, else ValueNotFound / AtomicMemoryChanged for the first
        that is not, in the caller's order) become merged into a new active memory; records by
        artifact_id."""
        ...

    # search
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
        """Searchable heads (atomic: active only) holding any term, best first, ties by artifact_id.
        A backend may leave out heads holding fewer than `min_match` distinct terms (never more).
        `enough`: the caller keeps at most that many admitted rows, in this order; a backend whose
        match itself leaves out every head below `min_match` (so admission drops nothing it returns)
        then returns at most `enough` rows instead of `limit`."""
        ...

    async def search_text_many(self, queries: Sequence[TextQuery]) -> list[TextResult]:
        """`search_text` of each query, in order, in one read (one snapshot, one trip to the
        backend's reader: a prepare searches every family of every scope it reads)."""
        ...

    async def search_vector(
        self,
        scope_id: str,
        family: str,
        vector: Sequence[float],
        limit: int,
        min_cosine: float,
        kind: str | None = None,
    ) -> list[SearchRow]:
        """Searchable heads by cosine (score) ≥ min_cosine, best first, ties by artifact_id."""
        ...

    async def vectors_complete(self, scope_id: str, family: str) -> bool:
        """True when every searchable head of the scope and family has a vector."""
        ...

    async def missing_vectors(self, limit: int) -> list[MissingVector]: ...

    async def set_vector(
        self, scope_id: str, family: str, artifact_id: str, revision: int, vector: Sequence[float]
    ) -> bool:
        """Store a backfilled vector if `revision` is still the head; False otherwise."""
        ...
