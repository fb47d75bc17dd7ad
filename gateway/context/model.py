"""Identity values of the context store: families, artifact references and addresses, lifecycle states.

Owns: the small frozen value types every other context module speaks (ArtifactRef, ArtifactAddress,
AtomicMemoryInput), the closed vocabularies (families, lifecycle states, search modes) and their
wire forms as PowerContext 1.4.1 spells them.
Must not: do I/O, read clocks or randomness, or know how values are stored or rendered.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Family(StrEnum):
    """Artifact families wiregate stores (1.4.1 `BaseArtifactFamily` minus skill/handoff/prompt/memory)."""

    ATOMIC_MEMORY = "atomic-memory"
    TOPIC_MEMORY = "topic-memory"
    EXPERIENCE = "experience"
    PROFILE = "profile"


# Families whose heads are searchable (1.4.1: profile is "not searchable", `{field: "family"}`).
SEARCHABLE_FAMILIES: frozenset[Family] = frozenset({Family.ATOMIC_MEMORY, Family.TOPIC_MEMORY, Family.EXPERIENCE})

PROFILE_ARTIFACT_ID = "profile"  # 1.4.1: the profile family's artifact id is always `profile`


class MemoryState(StrEnum):
    ACTIVE = "active"
    FORGOTTEN = "forgotten"
    MERGED = "merged"
    RETIRED = "retired"


class SearchMode(StrEnum):
    """Requested search modes. `auto` never appears as a used mode."""

    AUTO = "auto"
    FTS = "fts"
    VECTOR = "vector"
    HYBRID = "hybrid"


_VISIBLE_ASCII = re.compile(r"[\x21-\x7e]{1,128}")


def _visible_ascii(value: str) -> bool:
    return _VISIBLE_ASCII.fullmatch(value) is not None


def valid_artifact_id(value: str) -> bool:
    """An artifact id: 1–128 visible ASCII characters (what `ArtifactRef` accepts, and 1.4.1's
    path pattern). Anything else — a NUL, which PostgreSQL text cannot hold, a space, a
    non-ASCII letter — names no artifact: a lookup answers "not found" without asking a store,
    as `valid_scope_id` does for scopes."""
    return _visible_ascii(value)


# No control character (PostgreSQL text holds no NUL) and no lone surrogate (a header whose
# bytes are not UTF-8 arrives with them): such an id names no scope, and never reaches a store.
_SCOPE_ID_REFUSED = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def valid_scope_id(value: str) -> bool:
    """A scope id: already trimmed, non-blank, ≤256 characters, no control character or
    lone surrogate. Addresses carry one; a lookup of anything else answers "no scope"."""
    return 0 < len(value) <= 256 and value == value.strip() and _SCOPE_ID_REFUSED.search(value) is None


@dataclass(frozen=True, slots=True, order=True)
class ArtifactRef:
    """`{family, artifact_id, revision}`; revisions are immutable and exact reads never follow the head."""

    family: str
    artifact_id: str
    revision: int

    def __post_init__(self) -> None:
        if not (_visible_ascii(self.family) and _visible_ascii(self.artifact_id)):
            raise ValueError("invalid artifact reference")
        if type(self.revision) is not int or self.revision < 1:
            raise ValueError("invalid artifact revision")

    def to_wire(self) -> dict[str, Any]:
        return {"family": self.family, "artifact_id": self.artifact_id, "revision": self.revision}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ArtifactRef:
        if not isinstance(raw, Mapping) or set(raw) != {"family", "artifact_id", "revision"}:
            raise ValueError("invalid artifact reference")
        family, artifact_id, revision = raw["family"], raw["artifact_id"], raw["revision"]
        if not isinstance(family, str) or not isinstance(artifact_id, str) or type(revision) is not int:
            raise ValueError("invalid artifact reference")
        return cls(family, artifact_id, revision)


@dataclass(frozen=True, slots=True, order=True)
class ArtifactAddress:
    """`{scope_id, artifact: ArtifactRef}` — one exact revision of one artifact in one scope."""

    scope_id: str
    artifact: ArtifactRef

    def __post_init__(self) -> None:
        if not valid_scope_id(self.scope_id):
            raise ValueError("invalid scope id")

    def to_wire(self) -> dict[str, Any]:
        return {"scope_id": self.scope_id, "artifact": self.artifact.to_wire()}

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ArtifactAddress:
        if not isinstance(raw, Mapping) or set(raw) != {"scope_id", "artifact"}:
            raise ValueError("invalid artifact address")
        scope_id = raw["scope_id"]
        if not isinstance(scope_id, str):
            raise ValueError("invalid artifact address")
        return cls(scope_id, ArtifactRef.from_wire(raw["artifact"]))

    def identity_bytes(self) -> bytes:
        """The byte string ties are broken on (RRF, dedupe order): scope, family, id, revision."""
        a = self.artifact
        return f"{self.scope_id}\x00{a.family}\x00{a.artifact_id}\x00{a.revision:020d}".encode()


@dataclass(frozen=True, slots=True)
class AtomicMemoryInput:
    """A lifecycle/merge precondition: the exact current head revision and state version."""

    artifact: ArtifactRef
    state_version: int


def etag_for(revision: int) -> str:
    """The artifact head ETag, compared as an exact string (quotes included)."""
    return f'"revision:{revision}"'


def state_etag_for(revision: int, state_version: int) -> str:
    return f'"revision:{revision}:state:{state_version}"'
