"""Helpers both store backends share: row ↔ record conversion, vector packing, lifecycle rules.

Owns: how a stored revision row becomes an ArtifactRevision, the float32 packing of unit vectors
and their exact scoring against a query (`admitted`), the per-(scope, family) FTS key, the memo
of query terms known to be indexed, which lifecycle transitions are allowed, and what a lifecycle
target or merge input that does not match its stored row answers (1.4.1's codes, the same on both
backends).
Must not: open connections or run SQL.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gateway.context.errors import (
    AtomicMemoryChanged,
    InvalidMemoryState,
    MemoryRevisionStale,
    ValueNotFound,
)
from gateway.context.model import ArtifactRef, AtomicMemoryInput, MemoryState
from gateway.context.store.base import ArtifactRevision

# (from, to) → allowed. 1.4.1 only exposes active → forgotten; wiregate also retires (see service).
ALLOWED_TRANSITIONS = frozenset(
    {
        (MemoryState.ACTIVE, MemoryState.FORGOTTEN),
        (MemoryState.ACTIVE, MemoryState.RETIRED),
        (MemoryState.FORGOTTEN, MemoryState.RETIRED),
    }
)
MAX_QUERY_TERMS = 128  # terms sent to a backend index; admission still counts every term
MAX_FLOOR_COMBINATIONS = 64  # "≥ k of these terms" is sent as an OR of k-term ANDs only up to this many


def floor_groups(present: Sequence[str], min_match: int) -> list[tuple[str, ...]] | None:
    """The k-term AND groups whose OR is "holds at least `min_match` of `present`" (the lexical floor pushed
    into the index, so ranking never scores a document admission would reject). None: too many groups —
    the caller sends a plain OR and admission filters afterwards. []: no document can be admitted."""
    if min_match <= 1:
        return None
    if len(present) < min_match:
        return []
    if math.comb(len(present), min_match) > MAX_FLOOR_COMBINATIONS:
        return None
    return list(itertools.combinations(present, min_match))


def floor_cut(limit: int, enough: int | None, groups: list[tuple[str, ...]] | None, min_match: int) -> int:
    """How many rows a text search returns: `enough` when the caller needs no more and the match
    enforces the lexical floor itself (`min_match` <= 1, or the floor pushed into it as groups),
    so that admission, which counts the same tokens, drops none of them; `limit` otherwise (a
    plain OR under a floor above one returns rows admission will drop)."""
    if enough is not None and (min_match <= 1 or groups is not None):
        return max(1, min(limit, enough))
    return limit


def at_least(terms: Sequence[str], k: int, phrase: Callable[[str], str], *, exclusive: bool = True) -> str:
    """An FTS5 MATCH expression for "holds at least `k` of `terms`" (1 <= k <= len(terms)).
    Exclusive (for bm25()): each term a matching row holds is a phrase of exactly one matching
    branch, (t AND at least k-1 of the rest) OR (at least k of the rest NOT t). FTS5 scores only the
    phrases of the branches that match a row, so BM25 over it counts every held term once — the score
    of the plain OR of the terms, bit for bit (PowerContext's ranking) — while the index visits only
    rows that reach the floor. (An OR of the k-term groups counts a term once per matching group: a
    row holding m terms would score C(m-1, k-1) times over.) Not exclusive (for `wg_bm25`, which
    counts each term once whichever phrases report it): the same without `NOT t`, the same rows,
    matched with less work. Used where `floor_groups` allows groups; never more phrases than they have."""
    if k == 1:
        return "(" + " OR ".join(phrase(t) for t in terms) + ")"
    if len(terms) == k:
        return "(" + " AND ".join(phrase(t) for t in terms) + ")"
    head, rest = phrase(terms[0]), terms[1:]
    held = f"({head} AND {at_least(rest, k - 1, phrase, exclusive=exclusive)})"
    if not exclusive:
        return f"({held} OR {at_least(rest, k, phrase, exclusive=False)})"
    return f"({held} OR ({at_least(rest, k, phrase)} NOT {head}))"


def at_least_terms(terms: Sequence[str], k: int, *, exclusive: bool = True) -> list[str]:
    """The term of each phrase of `at_least(terms, k, …)`, in the order the expression names them
    (the order FTS5 numbers its phrases in)."""
    if k == 1 or len(terms) == k:
        return list(terms)
    head, rest = terms[0], terms[1:]
    named = [head, *at_least_terms(rest, k - 1, exclusive=exclusive), *at_least_terms(rest, k, exclusive=exclusive)]
    return [*named, head] if exclusive else named


def phrase_map(terms: Sequence[str], k: int, *, exclusive: bool = True) -> str:
    """`at_least_terms` as the SQLite store's native ranking takes it: one letter per phrase, 'A' +
    the index of its term in `terms` (at most 64 terms)."""
    index = {t: i for i, t in enumerate(terms)}
    return "".join(chr(65 + index[t]) for t in at_least_terms(terms, k, exclusive=exclusive))


def transition(current: MemoryState, target: MemoryState) -> str:
    """'noop' (already there), 'ok', or 'invalid'."""
    if current is target:
        return "noop"
    return "ok" if (current, target) in ALLOWED_TRANSITIONS else "invalid"


def lifecycle_step(row: Sequence[Any] | None, target: AtomicMemoryInput, wanted: MemoryState) -> str:
    """'noop' or 'ok' for moving the atomic memory whose row is `(head_revision, state,
    state_version)` (None: no such memory) to `wanted`, guarded by `target`; else the 1.4.1
    error, checked in 1.4.1's order: missing (404 not_found), another head revision (409
    revision_conflict), another state version (409 atomic_memory_changed), a state it may not
    leave that way — merged, or retired — (409 invalid_memory_state)."""
    if row is None:
        raise ValueNotFound()
    head, state, version = row[0], MemoryState(row[1]), row[2]
    if head != target.artifact.revision:
        raise MemoryRevisionStale()
    if version != target.state_version:
        raise AtomicMemoryChanged()
    step = transition(state, wanted)
    if step == "invalid":
        raise InvalidMemoryState(InvalidMemoryState.NOT_FORGETTABLE if wanted is MemoryState.FORGOTTEN else None)
    return step


def check_merge_input(row: Sequence[Any] | None, target: AtomicMemoryInput) -> None:
    """A merge input must be exactly what the caller saw, and active: its row `(head_revision,
    state, state_version)` (None: no such memory) equal to `target` in an active state. 1.4.1
    compares the whole read, so a forgotten, merged or retired input is a changed input (409
    atomic_memory_changed), like a stale one; a missing one is 404 not_found."""
    if row is None:
        raise ValueNotFound()
    head, state, version = row[0], MemoryState(row[1]), row[2]
    if head != target.artifact.revision or version != target.state_version or state is not MemoryState.ACTIVE:
        raise AtomicMemoryChanged(AtomicMemoryChanged.MERGE_INPUTS)


class PresentTerms:
    """Which query terms a scope and family's index is known to hold, so that a search probes the index
    only for the others. Before ranking, a search drops the terms no searchable row holds (a document can
    only reach the lexical floor with terms it holds, so the result is the same and the floor expands
    into fewer groups); a probe for a term many rows hold is the costly kind (PostgreSQL builds the whole
    GIN bitmap). Only "present" is remembered: a remembered term that has since left the index merely
    stays in the query (same result, one more group), while an absent term is probed every time, so a
    term that a later write adds is never dropped. Bounded (least recently used out); a replica's memo is
    its own, and needs no coherence for the same reason."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._known: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._lock = threading.Lock()  # SQLite searches run on several reader threads

    def unknown(self, scope_id: str, family: str, terms: Sequence[str]) -> list[str]:
        """The terms not known to be present: the ones to probe."""
        out: list[str] = []
        with self._lock:
            for term in terms:
                key = (scope_id, family, term)
                if key in self._known:
                    self._known.move_to_end(key)
                else:
                    out.append(term)
        return out

    def remember(self, scope_id: str, family: str, present: Iterable[str]) -> None:
        with self._lock:
            for term in present:
                self._known[(scope_id, family, term)] = None
                self._known.move_to_end((scope_id, family, term))
            while len(self._known) > self._capacity:
                self._known.popitem(last=False)

    def settle(
        self, scope_id: str, family: str, terms: Sequence[str], probed: Iterable[str], found: set[str]
    ) -> list[str]:
        """Remember `found` (the `probed` terms the index holds); return `terms`, in order, without the
        probed ones it lacks."""
        self.remember(scope_id, family, found)
        missing = set(probed) - found
        return [t for t in terms if t not in missing]


def fts_key(scope_id: str, family: str) -> str:
    """The 25-character key of a scope and family; SQLite prefixes it to every indexed token and query term
    (one length for every key, so no key followed by a term can spell another key and term)."""
    return "k" + hashlib.sha256(f"{scope_id}\x00{family}".encode()).hexdigest()[:24]


def pack_vector(vector: Sequence[float] | None) -> bytes | None:
    return array("f", vector).tobytes() if vector is not None else None


def admitted_reference(
    query: bytes, rows: Sequence[tuple[str, bytes | None]], min_cosine: float
) -> list[tuple[float, str]]:
    """(cosine, artifact id) of each row whose stored vector reaches `min_cosine` against
    the query, in the rows' order. `query`: the query's unit vector as native float64s; a
    row's vector: native float32s, or None. A missing vector or one of another dimension is
    skipped. The cosine (both vectors are unit) is the dot product added up in order, one
    rounded product at a time — written out, not `sum()`, whose float summation Python 3.12
    made compensated. The reference of the native `_vector_native.admitted`, which the
    store uses when it is built (`admitted`)."""
    q = array("d")
    q.frombytes(query)
    out: list[tuple[float, str]] = []
    for artifact_id, blob in rows:
        if blob is None or len(blob) != 4 * len(q):
            continue
        vec = array("f")
        vec.frombytes(blob)
        acc = 0.0
        for x, y in zip(vec, q, strict=True):
            acc += x * y
        if acc >= min_cosine:
            out.append((acc, artifact_id))
    return out


# gateway/context/store/_vector_native.c, built by the package's install (setup.py; optional:
# without a C compiler the reference above runs). tests/test_vector_native.py checks the two.
Scorer = Callable[[bytes, list[tuple[str, bytes | None]], float], list[tuple[float, str]]]
_scorer: Scorer = admitted_reference
try:
    from gateway.context.store import _vector_native
except ImportError:  # pragma: no cover - a machine without a C compiler
    VECTOR_NATIVE_AVAILABLE = False
else:
    VECTOR_NATIVE_AVAILABLE = True
    _scorer = _vector_native.admitted


def use_native_vectors(enabled: bool) -> None:
    """Score with the native module (when it is built) or the reference (tests compare them)."""
    global _scorer
    _scorer = _vector_native.admitted if enabled and VECTOR_NATIVE_AVAILABLE else admitted_reference


def admitted(query: bytes, rows: list[tuple[str, bytes | None]], min_cosine: float) -> list[tuple[float, str]]:
    """`admitted_reference`, natively where the module is built (50–80 times as fast here)."""
    return _scorer(query, rows, min_cosine)


def revision_from_row(scope_id: str, family: str, artifact_id: str, row: Sequence[Any]) -> ArtifactRevision:
    """row = (revision, content, content_digest, created_at, created_by, source_id, previous_revision,
    reason, restored_from_revision)."""
    revision, content, digest, created_at, created_by, source_id, previous, reason, restored = row
    return ArtifactRevision(
        scope_id=scope_id,
        family=family,
        artifact_id=artifact_id,
        revision=int(revision),
        content=json.loads(content),
        content_digest=digest,
        created_at=created_at,
        created_by=created_by,
        source_id=source_id,
        previous=ArtifactRef(family, artifact_id, int(previous)) if previous is not None else None,
        reason=reason,
        restored_from_revision=restored,
    )


REVISION_COLUMNS = (
    "revision, content, content_digest, created_at, created_by, source_id, previous_revision, reason, "
    "restored_from_revision"
)
