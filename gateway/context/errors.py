"""Typed errors of the context layer, carrying PowerContext 1.4.1's public error codes.

Owns: one exception class per public error code the context service can raise, each with its HTTP
status, its 1.4.1 code, a fixed content-free message and optional content-free details; and the two
inference errors an injected `embed` callable raises.
Must not: put content, queries, ids of other principals or backend error text into a message or
details (the HTTP layer renders them as-is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class InferenceUnavailable(Exception):
    """Raised by an `embed` callable when the embedding provider cannot be reached or refused."""


class InferenceTimeout(Exception):
    """Raised by an `embed` callable when the embedding provider did not answer in time."""


class ContextError(Exception):
    """Base of every error the context service raises on purpose."""

    status: int = 500
    code: str = "internal_error"
    message: str = "The Server failed."

    def __init__(self, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(self.code)
        self.details: dict[str, Any] | None = dict(details) if details is not None else None

    def to_wire(self) -> dict[str, Any]:
        """The 1.4.1 error body `{"error": {code, message, details}}`."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class InvalidRequest(ContextError):
    status, code, message = 422, "invalid_request", "The request is invalid."

    def __init__(self, field: str, reason: str) -> None:
        super().__init__({"field": field, "reason": reason})


class InvalidCursor(ContextError):
    status, code = 400, "invalid_cursor"
    message = "The pagination cursor is invalid or does not match this request."

    def __init__(self) -> None:
        super().__init__({"field": "cursor", "reason": "is invalid"})


class ScopeNotFound(ContextError):
    status, code, message = 404, "scope_not_found", "The requested Scope was not found."


class ArtifactNotFound(ContextError):
    status, code, message = 404, "artifact_not_found", "The requested Artifact was not found."


class ArtifactFamilyNotFound(ContextError):
    status, code, message = 404, "artifact_family_not_found", "The Artifact Family was not found."


class ScopeIdempotencyConflict(ContextError):
    status, code, message = 409, "scope_idempotency_conflict", "The Scope creation key identifies different parameters."


class _Explained(ContextError):
    """An error whose message names which of 1.4.1's fixed explanations applies (details null)."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(None)
        if message is not None:
            self.message = message


class AtomicMemoryChanged(_Explained):
    """The exact head or state an atomic memory write expected is no longer there."""

    status, code, message = 409, "atomic_memory_changed", "the expected Artifact state version is stale"
    MERGE_INPUTS = "merge inputs changed before preparation"


class MemoryRevisionStale(ContextError):
    """A lifecycle target names a revision that is not the head (1.4.1: 409 `revision_conflict`,
    details null — unlike the 412 of a stale `If-Match`)."""

    status, code, message = 409, "revision_conflict", "The Memory Revision is stale."


class InvalidMemoryState(_Explained):
    """The memory's lifecycle state does not allow this change (merged or retired)."""

    status, code, message = 409, "invalid_memory_state", "merged and retired Artifacts cannot be edited"
    NOT_FORGETTABLE = "only active or deprecated Artifacts can be deprecated"


class InvalidMemoryRelation(ContextError):
    status, code = 409, "invalid_memory_relation"
    message = "merge needs at least two distinct inputs and a new result identity"


class ValueNotFound(ContextError):
    """A lifecycle or merge target that does not exist (1.4.1's generic `not_found`)."""

    status, code, message = 404, "not_found", "The requested value was not found."


class PreconditionRequired(ContextError):
    status, code, message = 428, "precondition_required", "Artifact mutation requires the current ETag in If-Match."


class RevisionConflict(ContextError):
    status, code, message = 412, "revision_conflict", "Artifact ETag does not match the current head."

    def __init__(self, provided_etag: str, current_etag: str) -> None:
        super().__init__({"provided_etag": provided_etag, "current_etag": current_etag})
        self.provided_etag = provided_etag
        self.current_etag = current_etag


class CapabilityNotSupported(ContextError):
    status, code, message = 422, "capability_not_supported", "The requested capability is not supported."

    def __init__(self, capability: str) -> None:
        super().__init__({"capability": capability})


class ArtifactSearchNotSupported(ContextError):
    status, code, message = 422, "artifact_search_not_supported", "The Artifact search capability is unavailable."

    def __init__(self, field: str) -> None:
        super().__init__({"field": field})


class MemoryWriteRejected(ContextError):
    """A write refused by the injected write check; nothing was stored. Details are reason codes only."""

    status, code, message = 422, "memory_write_rejected", "The write was rejected by policy."

    def __init__(self, reason_codes: Sequence[str]) -> None:
        super().__init__({"reason_codes": list(reason_codes)})
        self.reason_codes = tuple(reason_codes)


class MemoryReadWithheld(ContextError):
    """What a read (or a prepare) would return holds what the current policy stops (a value
    configured after it was stored, say): none of it is returned. Details are reason codes only."""

    status, code, message = 403, "memory_read_withheld", "The read was withheld by policy."

    def __init__(self, reason_codes: Sequence[str]) -> None:
        super().__init__({"reason_codes": list(reason_codes)})
        self.reason_codes = tuple(reason_codes)


class ScopeAccessDenied(ContextError):
    status, code, message = 403, "forbidden", "The principal may not read a Scope this request needs."


class ContextInferenceUnavailable(ContextError):
    status, code, message = 503, "inference_unavailable", "The inference provider is unavailable."


class ContextInferenceTimeout(ContextError):
    status, code, message = 503, "inference_timeout", "The inference provider timed out."


class BuilderInvariantError(ContextError):
    """A builder or pool invariant broke; prepare returns 500 with no partial content."""

    status, code, message = 500, "internal_error", "The Server failed."

    def __init__(self, diagnostic: str) -> None:
        super().__init__(None)
        self.diagnostic = diagnostic  # content-free, for logs only


class ArtifactAlreadyExists(ContextError):
    status, code, message = 409, "artifact_already_exists", "The Artifact already exists."
