"""Helpers both store backends share: row ↔ record conversion, vector packing, lifecycle rules.

Owns: how a stored revision row becomes an ArtifactRevision, the float32 packing of unit vectors,
the per-(scope, family) FTS key, and which lifecycle transitions are allowed.
Must not: open connections or run SQL.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from array import array
from collections.abc import Sequence
from typing import Any

from gateway.context.model import ArtifactRef, MemoryState
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


def transition(current: MemoryState, target: MemoryState) -> str:
    """'noop' (already there), 'ok', or 'invalid'."""
    if current is target:
        return "noop"
    return "ok" if (current, target) in ALLOWED_TRANSITIONS else "invalid"


def fts_key(scope_id: str, family: str) -> str:
    """The 25-character key of a scope and family; SQLite prefixes it to every indexed token and query term
    (one length for every key, so no key followed by a term can spell another key and term)."""
    return "k" + hashlib.sha256(f"{scope_id}\x00{family}".encode()).hexdigest()[:24]


def pack_vector(vector: Sequence[float] | None) -> bytes | None:
    return array("f", vector).tobytes() if vector is not None else None


def unpack_vector(blob: bytes | None) -> array[float] | None:
    if blob is None:
        return None
    out = array("f")
    out.frombytes(blob)
    return out


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
