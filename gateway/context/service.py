"""The context service: every operation the HTTP layer calls for scopes, artifacts, atomic memory,
search and prepare.

Owns: the order of each operation — validate, run the injected write check, embed, store; authorise
every scope a prepare reads before reading it, search each scope group and family (fts / vector /
hybrid / auto with fallback), rerank the pools when a reranker is configured, build, and make
the receipt — plus cursors, limits, id generation
and dependency eligibility for replay verification.
Must not: render HTTP, parse headers, seal bindings, touch a database directly (only through the
ContextStore), log content, or turn a backend or search failure into an `empty` prepare.
Clocks, randomness, the embedder and the write check are injected.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import inspect
import json
import math
import os
import sys
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import rfc8785

from gateway.context import builder, excerpt, receipt, search
from gateway.context.builder import BuildResult, Candidate, ScopeGroup
from gateway.context.content import (
    compact_json,
    content_digest,
    nodes,
    normalize_text,
    search_text,
    stored_content,
    utf8_ok,
    write_texts,
)
from gateway.context.errors import (
    ArtifactNotFound,
    ArtifactSearchNotSupported,
    CapabilityNotSupported,
    ContextInferenceTimeout,
    ContextInferenceUnavailable,
    InferenceTimeout,
    InferenceUnavailable,
    InvalidCursor,
    InvalidMemoryRelation,
    InvalidRequest,
    MemoryWriteRejected,
    PreconditionRequired,
    ScopeAccessDenied,
    ScopeNotFound,
)
from gateway.context.model import (
    PROFILE_ARTIFACT_ID,
    SEARCHABLE_FAMILIES,
    ArtifactAddress,
    AtomicMemoryInput,
    Family,
    MemoryState,
    SearchMode,
    valid_scope_id,
)
from gateway.context.rerank import RerankSettings
from gateway.context.rerank import rerank as rerank_pool
from gateway.context.store.base import (
    ArtifactRevision,
    AtomicMemoryRecord,
    AtomicMemoryState,
    ContextStore,
    NewRevision,
    NewScope,
    ScopeRecord,
    SearchRow,
    TextQuery,
    TextResult,
)
from gateway.context.store.common import check_merge_input

T = TypeVar("T")
Embed = Callable[[list[str]], Awaitable[list[list[float]]]]
CheckWrite = Callable[[list[str]], tuple[str, ...]]
MayRead = Callable[[str], "bool | Awaitable[bool]"]

DEFAULT_SCOPE_ID = "default"
KNOWN_SCOPES = 4096  # scope records remembered per process (least recently used out)
KNOWN_SCOPE_BYTES = 16 * 1024 * 1024  # what the remembered scope records hold at most (estimated)
SCOPE_RECORD_BYTES = 1024 * 1024  # a scope record holding more (estimated) is never remembered
SCOPE_SCAN_BATCH = 256  # scopes read at a time when a listing filters what its caller may see
SCOPE_SCAN_ROWS = 4096  # scopes read at most for one such page
_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"
_FAMILY_STAGE = {
    Family.ATOMIC_MEMORY: "memory.search",
    Family.TOPIC_MEMORY: "topic-memory.search",
    Family.EXPERIENCE: "experience.search",
}
_PREPARE_FAMILIES = (Family.ATOMIC_MEMORY, Family.TOPIC_MEMORY, Family.EXPERIENCE)


# The most hits one search returns (1.4.1's search request takes `limit` up to 200; a
# family's own request may take fewer, which the route checks).
MAX_SEARCH_RESULTS = 200


@dataclass(frozen=True, slots=True)
class ContextSettings:
    max_page: int = 100  # list/search page ceiling (1.4.1: limit 1..100)
    default_page: int = 50  # list page when the caller gives none
    expansion_rounds: int = 0  # recall expansion rounds after round 0 (0..2); off like 1.4.1's default
    embed_timeout_s: float = 10.0  # one embedding call; past it the call counts as inference_timeout
    min_cosine: float = search.MIN_COSINE  # vector admission floor


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: tuple[T, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class MutationResult:
    """1.4.1 `AtomicMemoryMutationResponse {changed, records}`."""

    changed: bool
    records: tuple[AtomicMemoryRecord, ...]

    def to_wire(self) -> dict[str, Any]:
        return {"changed": self.changed, "records": [r.to_wire() for r in self.records]}


@dataclass(frozen=True, slots=True)
class SearchHit:
    head: ArtifactRevision
    score: float  # RRF score (1/(60+rank) summed over channels)
    # The channels that held it, 1.4.1's names: "text", "vector"; topic memory "topic_fts",
    # "detail_fts", "topic_vector".
    matched_by: tuple[str, ...]
    state_version: int  # read with the hit (a searchable atomic memory is active)
    # Per channel that held it: (raw backend score, metric name, higher is better).
    channel_scores: Mapping[str, tuple[float, str, bool]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SearchResult:
    mode: SearchMode  # the used mode: fts | vector | hybrid
    hits: tuple[SearchHit, ...]
    fallback_reason: str = "none"  # none | inference_unavailable | inference_timeout | reused_fts_fallback

    @property
    def wire_mode(self) -> str:
        """1.4.1 response `mode`: text | vector | hybrid."""
        return "text" if self.mode is SearchMode.FTS else self.mode.value


@dataclass(frozen=True, slots=True)
class PrepareResult:
    context: dict[str, Any]  # exactly {schema, status, content, content_bytes}
    receipt: dict[str, Any] | None  # None when not requested or omitted
    receipt_diagnostic: str | None  # content-free code when a requested receipt was omitted
    dependencies: tuple[ArtifactAddress, ...]  # exact revisions of every selected item, in order
    # Why round 0 lost its vector channel (the query embedding failed, so auto fell back to
    # fts): inference_unavailable | inference_timeout, or None. 1.4.1 reports it as `reason`
    # when the request asked with `explain`; later rounds reuse round 0's outcome, so only
    # round 0 counts.
    degradation: str | None = None
    # The stored content object of every selected item, in order (what its text was cut
    # from): what the read check inspects, as a read of those items would be.
    sources: tuple[Mapping[str, Any], ...] = ()


@dataclass(slots=True)
class _QueryVector:
    """The query embedding, computed at most once per request."""

    done: bool = False
    vector: tuple[float, ...] | None = None
    failure: str | None = None  # inference_unavailable | inference_timeout
    used_failure: bool = False


@dataclass(slots=True)
class _Trace:
    searches: dict[tuple[int, str, str, str, str], int] = field(default_factory=dict)
    stages: dict[str, list[float]] = field(default_factory=dict)

    def search(self, rnd: int, family: str, mode: str, outcome: str, fallback: str) -> None:
        key = (rnd, family, mode, outcome, fallback)
        self.searches[key] = self.searches.get(key, 0) + 1

    def stage(self, name: str, ms: float) -> None:
        entry = self.stages.setdefault(name, [0.0, 0])
        entry[0] += ms
        entry[1] += 1


@dataclass(frozen=True, slots=True)
class _Reranks:
    """What a prepare's rerank did: the config it ran under, its outcome groups, and how many
    candidates it removed per family."""

    configs: tuple[receipt.RerankConfig, ...]  # () when no reranker ran
    groups: tuple[receipt.RerankGroup, ...]
    removed: dict[str, int]


_NOT_RERANKED = _Reranks((), (), {})


def _now_iso(clock: Callable[[], float]) -> str:
    return datetime.fromtimestamp(clock(), tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _family(value: str) -> Family:
    try:
        return Family(value)
    except ValueError:
        raise InvalidRequest("family", "is not a supported family") from None


MAX_CURSOR_INT = 2**62  # a position the store can bind (SQLite integers are 64-bit)
MAX_CURSOR_TEXT = 512  # longer than any id or sort key this store writes


def _cursor_position(after: object) -> bool:
    """A position a cursor may carry: a whole number the store can bind, or text the store
    can bind (UTF-8, no lone surrogate) of bounded length. Cursors are plain base64 JSON a
    client can write: an integer past 64 bits or a lone surrogate was a 500."""
    if type(after) is int:
        return -MAX_CURSOR_INT <= after <= MAX_CURSOR_INT
    return isinstance(after, str) and len(after) <= MAX_CURSOR_TEXT and utf8_ok(after)


class ContextService:
    def __init__(
        self,
        store: ContextStore,
        *,
        check_write: CheckWrite,
        embed: Embed | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.perf_counter,
        random_bytes: Callable[[int], bytes] = os.urandom,
        settings: ContextSettings | None = None,
    ) -> None:
        self._store = store
        self._check_write = check_write
        self._embed = embed
        self._clock = clock
        self._mono = monotonic
        self._random = random_bytes
        self._settings = settings or ContextSettings()
        # Scopes are never updated or deleted, so a scope once read is remembered (bounded in
        # count and in estimated bytes, least recently used out; a record too large for its share
        # of the budget is read every time); an absent one is read again every time (another
        # replica may create it).
        self._scopes: OrderedDict[str, tuple[ScopeRecord, int]] = OrderedDict()  # record, its bytes
        self._scope_bytes = 0  # the remembered records' estimated bytes, together

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Ensure the `default` scope exists (the store must be open)."""
        await self._store.ensure_scope(
            self._new_scope(DEFAULT_SCOPE_ID, "Default", "Default context", None, None, (), (), None)
        )

    # ---- ids, cursors, limits -----------------------------------------------------------------

    def new_scope_id(self) -> str:
        n = int.from_bytes(self._random(16), "big")
        return "scp_" + "".join(_CROCKFORD[(n >> (5 * i)) & 31] for i in reversed(range(26)))

    def _new_artifact_id(self) -> str:
        return "art_" + self._random(16).hex()

    def _new_source_id(self) -> str:
        return "src_" + self._random(16).hex()

    def new_receipt_id(self) -> str:
        return str(uuid.UUID(bytes=self._random(16), version=4))

    def _limit(self, limit: int | None) -> int:
        value = self._settings.default_page if limit is None else limit
        if type(value) is not int or not 1 <= value <= self._settings.max_page:
            raise InvalidRequest("limit", "is out of range")
        return value

    @staticmethod
    def _cursor(kind: str, bind: str, after: str | int) -> str:
        raw = json.dumps([kind, bind, after], separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def _uncursor(cursor: str | None, kind: str, bind: str) -> Any:
        if cursor is None:
            return None
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            k, b, after = json.loads(raw)
        except (ValueError, binascii.Error, TypeError, RecursionError):
            raise InvalidCursor() from None
        if k != kind or b != bind or not _cursor_position(after):
            raise InvalidCursor()
        return after

    def _page(self, rows: Sequence[T], limit: int, kind: str, bind: str, key: Callable[[T], str | int]) -> Page[T]:
        if len(rows) > limit:
            return Page(tuple(rows[:limit]), self._cursor(kind, bind, key(rows[limit - 1])))
        return Page(tuple(rows), None)

    # ---- write check and revision preparation -------------------------------------------------

    def _checked(self, texts: list[str]) -> None:
        reasons = tuple(self._check_write(texts))
        if reasons:
            raise MemoryWriteRejected(reasons)

    async def _vector(self, text: str | None) -> tuple[float, ...] | None:
        """Embed at write time; any failure records the vector as missing instead of failing the write."""
        if self._embed is None or text is None:
            return None
        try:
            out = await self._embed_once([text])
        except Exception:  # noqa: BLE001 - a write must not fail because embedding failed
            return None
        return search.unit(out[0]) if out else None

    async def _embed_once(self, texts: list[str]) -> list[list[float]]:
        assert self._embed is not None
        try:
            async with asyncio.timeout(self._settings.embed_timeout_s):
                return await self._embed(texts)
        except TimeoutError:
            raise InferenceTimeout() from None

    async def _revision(
        self, family: Family, raw: Any, principal: str | None, *, replacing: bool = False, reason: str | None = None
    ) -> NewRevision:
        now = _now_iso(self._clock)
        content = stored_content(family, raw, now_iso=now, replacing=replacing)
        self._checked(write_texts(content) + ([reason] if reason else []))
        text = search_text(family, content)
        return NewRevision(
            content=content,
            content_digest=content_digest(content),
            content_json=compact_json(content).decode("utf-8"),
            kind=str(content["kind"]) if family is Family.ATOMIC_MEMORY else None,
            search_text=text,
            search_tokens=tuple(search.tokens(text)) if text is not None else (),
            vector=await self._vector(text),
            created_at=now,
            created_by=principal,
            source_id=self._new_source_id(),
            reason=reason,
        )

    # ---- scopes -------------------------------------------------------------------------------

    def _new_scope(
        self,
        scope_id: str,
        title: str,
        summary: str,
        idempotency_key: str | None,
        parent: str | None,
        refs: Sequence[str],
        external: Sequence[Mapping[str, Any]],
        principal: str | None,
    ) -> NewScope:
        body = {
            "title": title,
            "summary": summary,
            "parent_scope_id": parent,
            "context_references": list(refs),
            "external_references": [dict(e) for e in external],
        }
        fingerprint = "sha256:" + hashlib.sha256(rfc8785.dumps(body)).hexdigest()
        return NewScope(
            scope_id,
            title,
            summary,
            parent,
            tuple(refs),
            tuple(dict(e) for e in external),
            idempotency_key,
            fingerprint,
            principal,
            _now_iso(self._clock),
        )

    async def create_scope(
        self,
        *,
        title: str,
        summary: str,
        idempotency_key: str,
        principal: str | None,
        parent_scope_id: str | None = None,
        context_references: Sequence[str] = (),
        external_references: Sequence[Mapping[str, Any]] = (),
    ) -> tuple[ScopeRecord, bool]:
        """Create a scope; the same (principal, key, body) replays the same scope (created=False)."""
        for name, value, top in (
            ("title", title, 256),
            ("summary", summary, 2000),
            ("idempotency_key", idempotency_key, 256),
        ):
            if not isinstance(value, str) or not 1 <= len(value) <= top:
                raise InvalidRequest(name, "is out of range")
        if len(set(context_references)) != len(context_references):
            raise InvalidRequest("context_references", "must be unique")
        for ref in [*context_references, *([parent_scope_id] if parent_scope_id else [])]:
            if not valid_scope_id(ref) or await self.find_scope(ref) is None:
                raise InvalidRequest("context_references", "names an unknown scope")
        self._checked([title, summary])
        new = self._new_scope(
            self.new_scope_id(),
            title,
            summary,
            idempotency_key,
            parent_scope_id,
            context_references,
            external_references,
            principal,
        )
        return await self._store.create_scope(new)

    async def find_scope(self, scope_id: str) -> ScopeRecord | None:
        """The scope, or None (authorisation looks before it decides what to say); an id no
        scope can have is None without asking the store."""
        if not valid_scope_id(scope_id):
            return None
        known = self._scopes.get(scope_id)
        if known is not None:
            self._scopes.move_to_end(scope_id)
            return known[0]
        record = await self._store.get_scope(scope_id)
        if record is not None:
            self._remember_scope(record)
        return record

    def _remember_scope(self, record: ScopeRecord) -> None:
        """Remember a scope record read, unless it alone holds more than `SCOPE_RECORD_BYTES`;
        then forget the least recently used ones until at most `KNOWN_SCOPES` records holding
        at most `KNOWN_SCOPE_BYTES` are left."""
        size = _scope_record_bytes(record, SCOPE_RECORD_BYTES)
        if size > SCOPE_RECORD_BYTES:
            return
        previous = self._scopes.pop(record.scope_id, None)  # two finds of one scope read it at once
        if previous is not None:
            self._scope_bytes -= previous[1]
        self._scopes[record.scope_id] = (record, size)
        self._scope_bytes += size
        while len(self._scopes) > KNOWN_SCOPES or self._scope_bytes > KNOWN_SCOPE_BYTES:
            _gone, (_, freed) = self._scopes.popitem(last=False)
            self._scope_bytes -= freed

    async def scope_creator(self, scope_id: str) -> str | None:
        record = await self.find_scope(scope_id)
        return record.created_by if record is not None else None

    async def get_scope(self, scope_id: str) -> ScopeRecord:
        scope = await self.find_scope(scope_id)
        if scope is None:
            raise ScopeNotFound()
        return scope

    async def list_scopes(
        self,
        *,
        limit: int | None = None,
        cursor: str | None = None,
        visible: Callable[[ScopeRecord], bool] | None = None,
    ) -> Page[ScopeRecord]:
        """A page of scopes in id order; with `visible`, only those it accepts: the store is
        read in batches until the page is full, the scopes end, or `SCOPE_SCAN_ROWS` were read
        (then the page may hold fewer than `limit` and its cursor points past what was read).
        The cursor names a scope id: the caller seals it when `visible` hides some."""
        n = self._limit(limit)
        after = self._uncursor(cursor, "scopes", "")
        if after is not None and not isinstance(after, str):
            raise InvalidCursor()
        if visible is None:
            rows = await self._store.list_scopes(after, n + 1)
            return self._page(rows, n, "scopes", "", lambda s: s.scope_id)
        items: list[ScopeRecord] = []
        scanned = 0
        while scanned < SCOPE_SCAN_ROWS:
            batch = await self._store.list_scopes(after, SCOPE_SCAN_BATCH)
            for row in batch:
                if visible(row):
                    if len(items) == n:  # one more exists: the page ends at its last item
                        return Page(tuple(items), self._cursor("scopes", "", items[-1].scope_id))
                    items.append(row)
                after = row.scope_id
            scanned += len(batch)
            if len(batch) < SCOPE_SCAN_BATCH:
                return Page(tuple(items), None)
        return Page(tuple(items), self._cursor("scopes", "", after) if after is not None else None)

    # ---- artifacts ----------------------------------------------------------------------------

    async def create_artifact(
        self, scope_id: str, family: str, content: Any, *, principal: str | None = None
    ) -> ArtifactRevision:
        fam = _family(family)
        rev = await self._revision(fam, content, principal)
        artifact_id = PROFILE_ARTIFACT_ID if fam is Family.PROFILE else self._new_artifact_id()
        return await self._store.create_artifact(scope_id, fam.value, artifact_id, rev)

    async def replace_artifact(
        self,
        scope_id: str,
        family: str,
        artifact_id: str,
        content: Any,
        *,
        if_match: str | None,
        principal: str | None = None,
        reason: str | None = None,
    ) -> ArtifactRevision:
        """Compare-and-set on the exact ETag string `"revision:N"`; no If-Match → precondition_required."""
        fam = _family(family)
        if if_match is None:
            raise PreconditionRequired()
        await self.get_scope(scope_id)
        rev = await self._revision(fam, content, principal, replacing=True, reason=reason)
        return await self._store.replace_artifact(scope_id, fam.value, artifact_id, if_match, rev)

    async def get_artifact(self, scope_id: str, family: str, artifact_id: str) -> ArtifactRevision:
        fam = _family(family)
        await self.get_scope(scope_id)
        head = await self._store.get_head(scope_id, fam.value, artifact_id)
        if head is None:
            raise ArtifactNotFound()
        return head

    async def get_artifact_revision(
        self, scope_id: str, family: str, artifact_id: str, revision: int
    ) -> ArtifactRevision:
        fam = _family(family)
        if type(revision) is not int or revision < 1:
            raise InvalidRequest("revision", "is out of range")
        await self.get_scope(scope_id)
        rev = await self._store.get_revision(scope_id, fam.value, artifact_id, revision)
        if rev is None:
            raise ArtifactNotFound()
        return rev

    async def list_artifacts(
        self, scope_id: str, family: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[ArtifactRevision]:
        fam = _family(family)
        n = self._limit(limit)
        bind = f"{scope_id}\x00{fam.value}"
        after = self._uncursor(cursor, "heads", bind)
        if after is not None and not isinstance(after, str):
            raise InvalidCursor()
        await self.get_scope(scope_id)
        rows = await self._store.list_heads(scope_id, fam.value, after, n + 1)
        return self._page(rows, n, "heads", bind, lambda r: r.artifact_id)

    async def list_artifact_revisions(
        self, scope_id: str, family: str, artifact_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[ArtifactRevision]:
        fam = _family(family)
        n = self._limit(limit)
        bind = f"{scope_id}\x00{fam.value}\x00{artifact_id}"
        before = self._uncursor(cursor, "revisions", bind)
        if before is not None and not isinstance(before, int):
            raise InvalidCursor()
        await self.get_scope(scope_id)
        rows = await self._store.list_revisions(scope_id, fam.value, artifact_id, before, n + 1)
        if not rows and before is None:
            raise ArtifactNotFound()
        return self._page(rows, n, "revisions", bind, lambda r: r.revision)

    # ---- atomic memory ------------------------------------------------------------------------

    async def remember(self, scope_id: str, kind: str, text: str, *, principal: str | None = None) -> MutationResult:
        """1.4.1 `POST /v1/memory/remember`: create one atomic memory, return its record."""
        rev = await self.create_artifact(
            scope_id, Family.ATOMIC_MEMORY.value, {"kind": kind, "text": text}, principal=principal
        )
        state = await self.get_atomic_state(scope_id, rev.artifact_id)
        record = AtomicMemoryRecord(
            rev.ref,
            str(rev.content["kind"]),
            str(rev.content["text"]),
            state.state,
            state.state_version,
            state.merged_into_id,
        )
        return MutationResult(True, (record,))

    async def get_atomic_state(self, scope_id: str, artifact_id: str) -> AtomicMemoryState:
        return (await self.get_atomic_states(scope_id, [artifact_id]))[0]

    async def get_atomic_states(self, scope_id: str, artifact_ids: Sequence[str]) -> list[AtomicMemoryState]:
        """The states of these atomic memories, in order, read at once (search hits carry them)."""
        await self.get_scope(scope_id)
        found = await self._store.get_states(scope_id, artifact_ids)
        if any(aid not in found for aid in artifact_ids):
            raise ArtifactNotFound()
        return [found[aid] for aid in artifact_ids]

    async def atomic_heads(self, scope_id: str, artifact_ids: Sequence[str]) -> dict[str, AtomicMemoryState]:
        """The states of those of these atomic memories of the scope that exist (one read)."""
        return await self._store.get_states(scope_id, artifact_ids)

    async def list_atomic_memories(
        self,
        scope_id: str,
        *,
        states: Sequence[str] | None = None,
        kind: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[AtomicMemoryRecord]:
        """Default (`states` None): active only (1.4.1); given, `states` must be distinct and not empty."""
        if states is not None and (not states or len(set(states)) != len(states)):
            raise InvalidRequest("states", "must contain distinct lifecycle values")
        try:
            wanted = frozenset(MemoryState(s) for s in (states if states is not None else ["active"]))
        except ValueError:
            raise InvalidRequest("states", "names an unknown state") from None
        n = self._limit(limit)
        bind = json.dumps([scope_id, sorted(s.value for s in wanted), kind])
        after = self._uncursor(cursor, "atomic", bind)
        if after is not None and not isinstance(after, str):
            raise InvalidCursor()
        await self.get_scope(scope_id)
        rows = await self._store.list_atomic(scope_id, wanted, kind, after, n + 1)
        return self._page(rows, n, "atomic", bind, lambda r: r.artifact.artifact_id)

    async def change_lifecycle(self, scope_id: str, target: AtomicMemoryInput, state: str) -> MutationResult:
        """`forgotten` (1.4.1) or `retired` (wiregate; 1.4.1 only retires through undo-merge).

        The target must be an atomic memory (422), exist (404 not_found), and name the exact head
        revision (409 revision_conflict) and current state_version (409 atomic_memory_changed);
        a merged memory, or a retired one, cannot be forgotten (409 invalid_memory_state).
        Already in that state → changed=false.
        """
        if state not in (MemoryState.FORGOTTEN.value, MemoryState.RETIRED.value):
            raise InvalidRequest("state", "must be forgotten or retired")
        await self.get_scope(scope_id)
        if target.artifact.family != Family.ATOMIC_MEMORY.value:
            raise InvalidRequest("target.artifact.family", "must be atomic-memory")
        record, changed = await self._store.change_state(scope_id, target, MemoryState(state))
        return MutationResult(changed, (record,))

    async def merge_atomic_memories(
        self, scope_id: str, inputs: Sequence[AtomicMemoryInput], content: Any, *, principal: str | None = None
    ) -> MutationResult:
        """Merge two or more active memories into a new one, in 1.4.1's order of checks: the
        scope; every input an atomic memory (422); distinct inputs (409 invalid_memory_relation);
        each input, in order, existing (404 not_found) and exactly as given and active (409
        atomic_memory_changed); then the new content (422, write check). The store checks the
        inputs again in the merge's own transaction."""
        await self.get_scope(scope_id)
        if any(i.artifact.family != Family.ATOMIC_MEMORY.value for i in inputs):
            raise InvalidRequest("inputs", "must be atomic memories")
        ids = [i.artifact.artifact_id for i in inputs]
        if len(ids) < 2 or len(set(ids)) != len(ids):
            raise InvalidMemoryRelation()
        states = await self._store.get_states(scope_id, ids)  # fail before embedding the new content
        for target in inputs:
            found = states.get(target.artifact.artifact_id)
            row = (found.artifact.revision, found.state.value, found.state_version) if found is not None else None
            check_merge_input(row, target)
        rev = await self._revision(Family.ATOMIC_MEMORY, content, principal)
        records = await self._store.merge(scope_id, inputs, self._new_artifact_id(), rev)
        return MutationResult(True, tuple(records))

    async def backfill_vectors(self, limit: int = 100) -> int:
        """Embed heads whose vector is missing (a failed write-time embedding). Returns how many were stored."""
        if self._embed is None:
            return 0
        done = 0
        for miss in await self._store.missing_vectors(limit):
            vector = await self._vector(miss.text)
            if vector is not None and await self._store.set_vector(
                miss.scope_id, miss.family, miss.artifact_id, miss.revision, vector
            ):
                done += 1
        return done

    # ---- search -------------------------------------------------------------------------------

    async def search(
        self,
        scope_id: str,
        family: str,
        query: str,
        *,
        mode: str = "auto",
        limit: int | None = None,
        kind: str | None = None,
    ) -> SearchResult:
        """Search one family's searchable heads (atomic: active only) in one scope."""
        fam = _family(family)
        if fam not in SEARCHABLE_FAMILIES:
            raise ArtifactSearchNotSupported("family")
        try:
            wanted = SearchMode(mode)
        except ValueError:
            raise InvalidRequest("mode", "is not a search mode") from None
        if limit is not None and not (type(limit) is int and 1 <= limit <= MAX_SEARCH_RESULTS):
            raise InvalidRequest("limit", "is out of range")
        n = 20 if limit is None else limit
        text = normalize_text(query)
        if not text:
            raise InvalidRequest("query", "is blank")
        await self.get_scope(scope_id)
        terms = search.terms(text)
        rows, used, fallback = await self._search(
            scope_id, fam, terms, text, wanted, n, kind, _QueryVector(), None, scans=_Scans(terms)
        )
        return SearchResult(used, tuple(rows), fallback)

    async def _query_vector(self, text: str, holder: _QueryVector, explicit: bool) -> tuple[float, ...] | None:
        if not holder.done:
            holder.done = True
            try:
                out = await self._embed_once([text])
                holder.vector = search.unit(out[0]) if out else None
                if holder.vector is None:
                    holder.failure = "inference_unavailable"
            except InferenceTimeout:
                holder.failure = "inference_timeout"
            except InferenceUnavailable:
                holder.failure = "inference_unavailable"
        if holder.failure is not None and explicit:
            raise ContextInferenceTimeout() if holder.failure == "inference_timeout" else ContextInferenceUnavailable()
        return holder.vector

    async def _search(
        self,
        scope_id: str,
        fam: Family,
        terms: Sequence[str],
        text: str,
        wanted: SearchMode,
        coarse: int,
        kind: str | None,
        holder: _QueryVector,
        floor: int | None,
        min_cosine: float | None = None,
        read: list[SearchRow] | None = None,
        *,
        scans: _Scans,
    ) -> tuple[list[SearchHit], SearchMode, str]:
        """One search. `read`: the rows of `_text_query(...)` for this call, already read
        (a prepare without inference reads every family's in one trip); only an FTS search
        may be given them. `scans`: the request's reading of its rows against `terms` (each
        row tokenised and chunked at most once per request); the rows are admitted and their
        channels found off the event loop (`_rank_text`)."""
        if wanted in (SearchMode.VECTOR, SearchMode.HYBRID) and self._embed is None:
            raise CapabilityNotSupported("search_mode")
        used = wanted
        fallback = "none"
        vector: tuple[float, ...] | None = None
        if wanted is SearchMode.AUTO:
            used = SearchMode.FTS
            if self._embed is not None and await self._store.vectors_complete(scope_id, fam.value):
                vector = await self._query_vector(text, holder, explicit=False)
                if vector is not None:
                    used = SearchMode.HYBRID
                else:
                    assert holder.failure is not None
                    fallback = "reused_fts_fallback" if holder.used_failure else holder.failure
                    holder.used_failure = True
        elif wanted is not SearchMode.FTS:
            vector = await self._query_vector(text, holder, explicit=True)
        pool = search.pool_size(coarse)
        ranked: list[tuple[str, list[bytes]]] = []
        found: dict[bytes, SearchRow] = {}  # identity -> the row that holds its head
        raw: dict[bytes, dict[str, tuple[float, str, bool]]] = {}
        assert read is None or used is SearchMode.FTS
        if used in (SearchMode.FTS, SearchMode.HYBRID):
            q = _text_query(scope_id, fam, terms, coarse, kind, floor, used)
            if read is not None:
                rows = read
            else:
                rows = await self._store.search_text(
                    q.scope_id, q.family, q.terms, q.limit, kind, q.min_match, q.enough
                )
            admitted, lexical = await asyncio.to_thread(_rank_text, fam, rows, scans, q.min_match, q.enough)
            keys = self._keys(admitted, found)
            metric, higher = self._store.text_metric
            for name, admits in lexical.items():
                chosen: list[bytes] = []
                for key, row, yes in zip(keys, admitted, admits, strict=True):
                    if yes:  # a text row's score ranks lower first: the raw value is the metric's own
                        chosen.append(key)
                        raw.setdefault(key, {})[name] = (-row.score if higher else row.score, metric, higher)
                ranked.append((name, chosen))
        if used in (SearchMode.VECTOR, SearchMode.HYBRID) and vector is not None:
            cos = self._settings.min_cosine if min_cosine is None else min_cosine
            rows = await self._store.search_vector(scope_id, fam.value, vector, pool, cos, kind)
            keys = self._keys(rows, found)
            channel = "topic_vector" if fam is Family.TOPIC_MEMORY else "vector"
            for key, row in zip(keys, rows, strict=True):
                raw.setdefault(key, {})[channel] = (_l2_distance(row.score), "l2_distance", False)
            ranked.append((channel, keys))
        fused = search.rrf(ranked)[:coarse]
        hits = [
            SearchHit(
                found[f.key].head,
                f.score,
                f.channels,
                found[f.key].state_version,
                {name: raw[f.key][name] for name in _CHANNEL_ORDER if name in raw.get(f.key, {})},
            )
            for f in fused
        ]
        return hits, used, fallback

    @staticmethod
    def _keys(rows: Sequence[SearchRow], found: dict[bytes, SearchRow]) -> list[bytes]:
        keys: list[bytes] = []
        for row in rows:
            key = ArtifactAddress(row.head.scope_id, row.head.ref).identity_bytes()
            found[key] = row
            keys.append(key)
        return keys

    # ---- prepare ------------------------------------------------------------------------------

    async def prepare(
        self,
        scope_id: str,
        query: str,
        max_bytes: int = 8000,
        include_receipt: bool = False,
        *,
        principal_may_read: MayRead,
        receipt_id: str | None = None,
        rerank: RerankSettings | None = None,
    ) -> PrepareResult:
        """Prepare context for `query` in `scope_id` and its context references, the pools
        reranked by `rerank` when given (context/rerank.py).

        As 1.4.1 recalls: atomic memory and experience are searched in every scope read (each
        for as many as its pool holds), then the scope groups share the pool round-robin
        (`builder.fair_shares`), so a busy current scope cannot starve its references; topic
        memory is searched in the current scope only, and a topic found through its detail
        carries a snippet of it.

        Every scope read is authorised through `principal_may_read` before it is read, and again
        before assembly; any denial raises ScopeAccessDenied with nothing partial. The result
        names the degradation, if any: why round 0 searched without its vector channel.
        """
        trace = _Trace()
        text = normalize_text(query) if isinstance(query, str) else ""
        if not text or len(query) > 8192:
            raise InvalidRequest("query", "is out of range")
        if type(max_bytes) is not int or not 512 <= max_bytes <= 32768:
            raise InvalidRequest("max_bytes", "is out of range")

        t = self._mono()
        await self._authorise([scope_id], principal_may_read)
        scope = await self.get_scope(scope_id)
        refs = [r for r in dict.fromkeys(scope.context_references) if r != scope_id]
        await self._authorise(refs, principal_may_read)
        order = [scope_id] + [r for r in refs if await self.find_scope(r) is not None]
        trace.stage("scope.authorize", (self._mono() - t) * 1000)

        terms = search.terms(text)
        scans = _Scans(terms)  # every row read in this prepare is tokenised and chunked once
        holder = _QueryVector()
        degradation: str | None = None
        pools: dict[tuple[str, Family], list[Candidate]] = {}
        rounds: list[receipt.RecallRound] = []
        for rnd in range(1 + max(0, min(2, self._settings.expansion_rounds))):
            if rnd > 0 and (any(pools.values()) or len(terms) <= 2):
                break
            floor = None if rnd == 0 else 1
            need = search.lexical_floor(len(terms)) if floor is None else floor
            min_cos = None if rnd < 2 else self._settings.min_cosine / 2
            searches = [(sid, fam) for sid in order for fam in _PREPARE_FAMILIES if _recalled_in(fam, sid, scope_id)]
            # Without inference every search is FTS: read them all in one trip to the store.
            reads: list[TextResult] = []
            if self._embed is None and terms:
                queries = [
                    _text_query(sid, fam, terms, builder.POOL_CEILINGS[fam.value], None, floor, SearchMode.FTS)
                    for sid, fam in searches
                ]
                reads = await self._store.search_text_many(queries)
            for n, (sid, fam) in enumerate(searches):
                t = self._mono()
                read = reads[n] if reads else None
                ceiling = builder.POOL_CEILINGS[fam.value]
                hits, used, fallback = await self._search(
                    sid, fam, terms, text, SearchMode.AUTO, ceiling, None, holder, floor, min_cos,
                    read.rows if read is not None else None, scans=scans,
                )  # fmt: skip
                spent = self._mono() - t + (read.seconds if read is not None else 0.0)
                trace.stage(_FAMILY_STAGE[fam], spent * 1000)
                trace.search(rnd, fam.value, used.value, "completed", fallback)
                pool = pools.setdefault((sid, fam), [])
                known = {c.address for c in pool}
                joining: list[SearchHit] = []
                for hit in hits:
                    address = ArtifactAddress(sid, hit.head.ref)
                    if address not in known and len(pool) + len(joining) < ceiling:
                        joining.append(hit)
                snippets: list[str | None] = [None] * len(joining)
                if fam is Family.TOPIC_MEMORY and joining:
                    heads = [hit.head for hit in joining]
                    snippets = await asyncio.to_thread(_snippets, heads, scans, need)
                for hit, snippet in zip(joining, snippets, strict=True):
                    pool.append(Candidate(ArtifactAddress(sid, hit.head.ref), hit.head.content, snippet))
            for fam in _PREPARE_FAMILIES:  # the scope groups share each family's pool, in turns
                shared = [pools.get((sid, fam), []) for sid in order]
                shares = builder.fair_shares([len(g) for g in shared], builder.POOL_CEILINGS[fam.value])
                for group, share in zip(shared, shares, strict=True):
                    del group[share:]
            rounds.append(receipt.RecallRound(rnd, "completed", sum(len(p) for p in pools.values())))
            if rnd == 0:  # the round that embeds (the query is embedded at most once per prepare)
                degradation = holder.failure

        reranks = self._rerank(scope_id, terms, pools, len(rounds) - 1, trace, rerank)
        await self._authorise(order, principal_may_read)  # a read revoked meanwhile fails the whole call
        t = self._mono()
        groups = [
            ScopeGroup(
                sid,
                memory=tuple(pools.get((sid, Family.ATOMIC_MEMORY), ())),
                topic=tuple(pools.get((sid, Family.TOPIC_MEMORY), ())),
                experience=tuple(pools.get((sid, Family.EXPERIENCE), ())),
            )
            for sid in order
        ]
        built = builder.build(scope_id, groups, max_bytes, reranks.removed)
        trace.stage("context.build", (self._mono() - t) * 1000)
        deps = tuple(item.address for item in built.items)

        made: dict[str, Any] | None = None
        diagnostic: str | None = None
        if include_receipt:
            made, diagnostic = self._receipt(
                receipt_id or self.new_receipt_id(), text, max_bytes, built, deps, rounds, trace, reranks
            )
        stored = {c.address: c.content for g in groups for c in (*g.memory, *g.topic, *g.experience)}
        sources = tuple(stored[a] for a in deps if a in stored)
        return PrepareResult(built.to_context(), made, diagnostic, deps, degradation, sources)

    def _rerank(
        self,
        scope_id: str,
        terms: Sequence[str],
        pools: dict[tuple[str, Family], list[Candidate]],
        rnd: int,
        trace: _Trace,
        settings: RerankSettings | None,
    ) -> _Reranks:
        """Rerank every non-empty pool in place (when a reranker is given): what it removed
        per family, and its config and outcomes for the receipt."""
        if settings is None:
            return _NOT_RERANKED
        t = self._mono()
        config = settings.config(scope_id)
        config_id = str(config.record()["config_id"])
        removed: dict[str, int] = {}
        outcomes: dict[tuple[str, str], int] = {}
        for (_sid, fam), pool in pools.items():
            if not pool:
                continue
            texts = [search_text(fam, c.content) or "" for c in pool]
            done = rerank_pool(terms, pool, texts, settings)
            pool[:] = done.kept
            removed[fam.value] = removed.get(fam.value, 0) + done.removed
            key = (done.outcome, done.fallback_reason)
            outcomes[key] = outcomes.get(key, 0) + 1
        trace.stage("rerank", (self._mono() - t) * 1000)
        groups = tuple(receipt.RerankGroup(rnd, config_id, o, f, n) for (o, f), n in outcomes.items())
        return _Reranks((config,), groups, removed)

    @staticmethod
    def _receipt(
        receipt_id: str,
        query: str,
        max_bytes: int,
        built: BuildResult,
        deps: tuple[ArtifactAddress, ...],
        rounds: list[receipt.RecallRound],
        trace: _Trace,
        reranks: _Reranks,
    ) -> tuple[dict[str, Any] | None, str | None]:
        searches = [receipt.SearchGroup(*key, count) for key, count in trace.searches.items()]
        stages = [receipt.StageTiming(name, ms, int(n)) for name, (ms, n) in trace.stages.items()]
        outcome = receipt.build_receipt(
            receipt.ReceiptInput(
                receipt_id=receipt_id,
                query=query,
                requested_max_bytes=max_bytes,
                built=built,
                origins=deps,
                rounds=rounds,
                searches=searches,
                stages=stages,
                rerank_configs=reranks.configs,
                reranks=reranks.groups,
            )
        )
        return outcome.receipt, outcome.diagnostic

    @staticmethod
    async def _authorise(scope_ids: Sequence[str], may_read: MayRead) -> None:
        for sid in scope_ids:
            verdict = may_read(sid)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if verdict is not True:
                raise ScopeAccessDenied()

    # ---- replay verification ------------------------------------------------------------------

    async def dependencies_eligible(self, deps: Sequence[ArtifactAddress | Mapping[str, Any]]) -> Literal[True] | str:
        """True when every dependency is still the live head it was bound at; else a content-free reason:
        dependency_malformed | dependency_missing | dependency_forgotten | dependency_merged |
        dependency_retired | dependency_revised."""
        addresses: list[ArtifactAddress] = []
        for dep in deps:  # in order: a malformed one answers only once every earlier one is eligible
            try:
                addresses.append(dep if isinstance(dep, ArtifactAddress) else ArtifactAddress.from_wire(dep))
            except (ValueError, TypeError, KeyError):
                break
        # the atomic memories' states in one read per scope, not one per dependency
        atomic: dict[str, list[str]] = {}
        for address in addresses:
            if address.artifact.family == Family.ATOMIC_MEMORY.value:
                atomic.setdefault(address.scope_id, []).append(address.artifact.artifact_id)
        states = {scope_id: await self._store.get_states(scope_id, ids) for scope_id, ids in atomic.items()}
        for address in addresses:
            ref = address.artifact
            if ref.family == Family.ATOMIC_MEMORY.value:
                state = states[address.scope_id].get(ref.artifact_id)
                if state is None:
                    return "dependency_missing"
                if state.state is not MemoryState.ACTIVE:
                    return f"dependency_{state.state.value}"
                head_revision = state.artifact.revision
            else:
                head = await self._store.get_head(address.scope_id, ref.family, ref.artifact_id)
                if head is None:
                    return "dependency_missing"
                head_revision = head.revision
            if head_revision != ref.revision:
                return "dependency_revised"
        if len(addresses) < len(deps):
            return "dependency_malformed"
        return True


def _scope_record_bytes(record: ScopeRecord, cap: int) -> int:
    """An estimate of the memory a scope record holds: `sys.getsizeof` of it and of every
    object inside it (its references' lists, mappings, keys and values; a shared object is
    counted each time it is met), counted only until the sum passes `cap`."""
    total = sys.getsizeof(record)
    fields = (record.scope_id, record.title, record.summary, record.parent_scope_id, record.context_references)
    for node in nodes(*fields, record.external_references, record.version, record.created_by, record.created_at):
        if total > cap:
            break
        total += sys.getsizeof(node)
    return total


def _recalled_in(fam: Family, scope_id: str, current_scope_id: str) -> bool:
    """1.4.1 recalls topic memory from the current scope only; the other families from every scope read."""
    return fam is not Family.TOPIC_MEMORY or scope_id == current_scope_id


def _text_query(
    scope_id: str, fam: Family, terms: Sequence[str], coarse: int, kind: str | None, floor: int | None, used: SearchMode
) -> TextQuery:
    """The text search behind `_search`: a pool of rows at the lexical floor (the query's own,
    or `floor`). One channel keeps the text ranking as it is: past the first `coarse` admitted
    rows none can reach the result, so a store whose match enforces the floor returns only those."""
    need = search.lexical_floor(len(terms)) if floor is None else floor
    # With one ranked channel the first `coarse` admitted rows are the result; topic memory's two
    # channels can lift a later row above them.
    enough = coarse if used is SearchMode.FTS and fam is not Family.TOPIC_MEMORY else None
    return TextQuery(scope_id, fam.value, tuple(terms), search.pool_size(coarse), kind, need, enough)


_RowKey = tuple[str, str, str, int]  # scope, family, artifact, revision: an immutable revision


@dataclass(slots=True)
class _Scan:
    """What one row's text tells the request's query; each part computed when first needed."""

    text: int | None = None  # how many query terms the row's search text holds
    topic: int | None = None  # how many a topic's title and summary hold
    detail: excerpt.DetailMatch | None = None  # how a topic's detail meets the query


class _Scans:
    """One request's reading of the rows it searches against its query terms: a row's text is
    tokenised, and a topic's detail chunked, at most once per request however often the request
    admits, ranks and snips it (a prepare searches a scope's family once per round). Keyed by
    the row's revision, which never changes. Pure CPU work, done off the event loop
    (`_rank_text`, `_snippets`), by one call at a time (a request awaits each in turn)."""

    def __init__(self, terms: Sequence[str]) -> None:
        self.terms = tuple(terms)
        self._rows: dict[_RowKey, _Scan] = {}

    def _scan(self, head: ArtifactRevision) -> _Scan:
        key = (head.scope_id, head.family, head.artifact_id, head.revision)
        scan = self._rows.get(key)
        if scan is None:
            scan = self._rows[key] = _Scan()
        return scan

    def admits(self, fam: Family, head: ArtifactRevision, need: int) -> bool:
        """The lexical floor over the row's whole search text (`search.admits_lexically`)."""
        scan = self._scan(head)
        if scan.text is None:
            scan.text = excerpt.matched_terms(self.terms, search_text(fam, head.content) or "")
        return bool(self.terms) and scan.text >= need

    def detail(self, head: ArtifactRevision) -> excerpt.DetailMatch:
        scan = self._scan(head)
        if scan.detail is None:
            scan.detail = excerpt.detail_match(self.terms, excerpt.detail_text(head.content))
        return scan.detail

    def channels(self, head: ArtifactRevision, need: int, *, first: bool = False) -> tuple[str, ...]:
        """`excerpt.topic_channels` of the topic at this revision."""
        scan = self._scan(head)
        if scan.topic is None:
            scan.topic = excerpt.matched_terms(self.terms, excerpt.topic_text(head.content))
        out: list[str] = []
        if self.terms and scan.topic >= need:
            out.append(excerpt.TOPIC_CHANNEL)
            if first:
                return tuple(out)
        if self.detail(head).admits(need):
            out.append(excerpt.DETAIL_CHANNEL)
        return tuple(out)

    def snippet(self, head: ArtifactRevision, need: int) -> str | None:
        """`excerpt.detail_snippet` of the topic at this revision."""
        if need < 1:
            return None
        return excerpt.match_snippet(self.terms, self.detail(head), need)


def _rank_text(
    fam: Family, rows: Sequence[SearchRow], scans: _Scans, need: int, enough: int | None
) -> tuple[list[SearchRow], dict[str, list[bool]]]:
    """The rows a text search admits, in rank order, and which of them each text channel holds:
    pure CPU work over rows already read (run in a worker thread, not on the event loop)."""
    admitted = _admitted(fam, rows, scans, need, enough)
    return admitted, _lexical_channels(fam, admitted, scans, need)


def _snippets(heads: Sequence[ArtifactRevision], scans: _Scans, need: int) -> list[str | None]:
    """The snippets of these topics found by a search (run in a worker thread)."""
    return [scans.snippet(head, need) for head in heads]


def _admitted(fam: Family, rows: Sequence[SearchRow], scans: _Scans, need: int, enough: int | None) -> list[SearchRow]:
    """The rows that pass the lexical floor, in rank order. With one channel (`enough` set)
    fusion keeps the text ranking as it is, so rows past the first `enough` admitted ones
    cannot reach the result and are not re-tokenised (a store's rows are distinct heads).
    A topic passes as 1.4.1 admits it: through its title and summary, or through one chunk of
    its detail, each on its own (the store matched all three together)."""
    out: list[SearchRow] = []
    for row in rows:
        if scans.admits(fam, row.head, need) and (
            fam is not Family.TOPIC_MEMORY or scans.channels(row.head, need, first=True)
        ):
            out.append(row)
            if len(out) == enough:
                break
    return out


# Search channels under 1.4.1's names, in its order (a hit's channel scores are listed so).
_CHANNEL_ORDER = ("text", "vector", excerpt.TOPIC_CHANNEL, "topic_vector", excerpt.DETAIL_CHANNEL)


def _lexical_channels(fam: Family, rows: Sequence[SearchRow], scans: _Scans, need: int) -> dict[str, list[bool]]:
    """The ranked text channels and which admitted rows each holds, in rank order. One channel,
    `text`, except topic memory, which 1.4.1 ranks as two fused by RRF: `topic_fts` (title and
    summary) and `detail_fts` (a chunk of the detail). Here both keep the order of the one text
    index that holds all three fields (so of its score, which each reports), each channel
    holding the rows its own admission passes."""
    if fam is not Family.TOPIC_MEMORY:
        return {"text": [True] * len(rows)}
    held = [scans.channels(row.head, need) for row in rows]
    return {name: [name in h for h in held] for name in (excerpt.TOPIC_CHANNEL, excerpt.DETAIL_CHANNEL)}


def _l2_distance(cosine: float) -> float:
    """The L2 distance between unit vectors whose cosine is `cosine` (1.4.1 reports vector scores so)."""
    return math.sqrt(max(0.0, 2.0 - 2.0 * cosine))
