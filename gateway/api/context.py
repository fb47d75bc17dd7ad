"""The context routes (SPEC §10, PowerContext 1.4.1 compatible): scopes, artifacts, atomic
memory, search and prepare, on the context service.

Every route: authenticate the gateway key, read the body (bounded, strict JSON: duplicate
keys are an error), validate it against 1.4.1's request schema (closed objects, strict
types), authorise the principal for the action on every scope the route touches, run the
write check on what would be stored, call the service, and answer with 1.4.1's status
codes, headers (ETag, Location) and `{"error": {code, message, details}}` shape.

Authorisation (SPEC §3, COMPAT §4): a principal acts on a scope it names in `scopes` (or
`*`), or on a scope it created; `scope_actions` narrows or widens the actions per scope.
`context.read` reads; `context.prepare` and `context.write` include reading (what they
return or change is content of that scope anyway); `admin` and `observe` never do.

Owns: request validation, authorisation, the write-check hook, 1.4.1's wire details and
the reuse envelope (the binding is sealed here, by the key ring).
Must not: touch the database (the service does), or put content — texts, queries, keys of
the client's JSON — in logs, metrics or error bodies.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from aiohttp import web
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from gateway import auth
from gateway.checks import claims as claims_
from gateway.checks.bindings import BindingTooLarge
from gateway.checks.store import refusal_reasons, write_verdict
from gateway.config.runtime import Principal, Runtime
from gateway.context import errors as cx
from gateway.context.content import compact_json, storable
from gateway.context.model import ArtifactRef, AtomicMemoryInput, Family, MemoryState, valid_artifact_id
from gateway.context.service import ContextService, ContextSettings, SearchResult
from gateway.context.store.base import ScopeRecord
from gateway.context.store.database import Database
from gateway.errors import ClientError
from gateway.http.body import read_body
from gateway.http.params import ascii_int
from gateway.obs import logging as log
from gateway.proxy import internal
from gateway.state import CALL, CONTEXT, RUNTIME
from gateway.vocab import Outcome

PREPARED_SCHEMA = "powercontext.prepared-context.v1"
WITH_REUSE_SCHEMA = "powercontext.prepared-context-with-reuse.v1"
REUSE_SCHEMA = "powercontext.context-reuse.v1"
REUSE_CONSTRAINTS = {
    "preserve": ["content", "citations", "trust", "order"],
    "refresh_on": ["permission_change", "source_ineligible", "context_boundary"],
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def service(app: web.Application, db: Database) -> ContextService:
    """The context service on `db`; every write is checked under the runtime current then."""
    holder = app[RUNTIME]

    def check_write(texts: list[str]) -> tuple[str, ...]:
        return refusal_reasons(write_verdict(holder.current, texts))

    async def embed(texts: list[str]) -> list[list[float]]:
        return await internal.embed(app, texts)  # through the gateway's own checks

    cfg = holder.current.config.context
    return ContextService(
        db.context,
        check_write=check_write,
        embed=embed if cfg.embeddings_profile is not None else None,
        settings=ContextSettings(embed_timeout_s=cfg.embed_timeout_s),
    )


# --- request schemas (1.4.1, closed and strict) ----------------------------------------------


def _nul_free(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("string_nul", "String contains a NUL character")
    return value


# Text the context layer stores, or looks rows up by, holds no NUL (U+0000): PostgreSQL text
# cannot hold one, so it is refused (422, `string_nul`) on both backends alike, though SQLite
# (and 1.4.1 on it) would keep it — the same request gets the same answer whichever store is
# configured. Ids are not refused here but name nothing: a scope id or path artifact id
# holding a NUL is "not found", as any id no scope or artifact can have. Queries are not
# refused either: they are only tokenised (a NUL is a separator), never bound as text.
NulFree = AfterValidator(_nul_free)

NonBlank = Annotated[StrictStr, Field(min_length=1, pattern=r".*\S.*")]
ScopeId = Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=r".*\S.*")]
Visible = Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7E]+$")]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ExternalReference(_Closed):
    kind: Annotated[StrictStr, Field(min_length=1, max_length=128, pattern=r".*\S.*"), NulFree]
    value: Annotated[StrictStr, Field(min_length=1, max_length=2000, pattern=r".*\S.*"), NulFree]


# A scope record is read (and remembered) on every authorisation of a request naming it, so
# it is bounded. 1.4.1 bounds every string of it but neither list; wiregate takes at most 256
# references of each kind (a host names a handful: a repository, a ticket, a parent's
# siblings) and at most 256 KiB of UTF-8 text in the whole record (title, summary,
# idempotency key, parent and every reference), where the per-item bounds alone would allow
# over 2 MB. Beyond either: 422, like any other request field out of range.
SCOPE_REFERENCES_MAX = 256
SCOPE_TEXT_MAX_BYTES = 256 * 1024


class CreateScope(_Closed):
    title: Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=r".*\S.*"), NulFree]
    summary: Annotated[StrictStr, Field(min_length=1, max_length=2000, pattern=r".*\S.*"), NulFree]
    idempotency_key: Annotated[StrictStr, Field(min_length=1, max_length=256, pattern=r".*\S.*"), NulFree]
    parent_scope_id: ScopeId | None = None
    context_references: list[ScopeId] = Field(default_factory=list, max_length=SCOPE_REFERENCES_MAX)
    external_references: list[ExternalReference] = Field(default_factory=list, max_length=SCOPE_REFERENCES_MAX)

    @model_validator(mode="after")
    def _bounded(self) -> CreateScope:
        if _scope_text_bytes(self) > SCOPE_TEXT_MAX_BYTES:
            raise PydanticCustomError("scope_too_large", "Scope text too large")
        return self


def _scope_text_bytes(dto: CreateScope) -> int:
    """The UTF-8 size of every text a scope record keeps from its creation request."""
    texts = [dto.title, dto.summary, dto.idempotency_key, dto.parent_scope_id or "", *dto.context_references]
    for ref in dto.external_references:
        texts += (ref.kind, ref.value)
    return sum(len(t.encode("utf-8")) for t in texts)


class Ref(_Closed):
    family: Visible
    artifact_id: Visible
    revision: Annotated[StrictInt, Field(ge=1)]

    def ref(self) -> ArtifactRef:
        return ArtifactRef(self.family, self.artifact_id, self.revision)


class MemoryInput(_Closed):
    artifact: Ref
    state_version: Annotated[StrictInt, Field(ge=0)]

    def input(self) -> AtomicMemoryInput:
        return AtomicMemoryInput(self.artifact.ref(), self.state_version)


class AtomicContent(_Closed):
    schema_: Literal["powercontext.atomic-memory.v1"] | None = Field(None, alias="schema")
    kind: Annotated[StrictStr, Field(min_length=1, max_length=128), NulFree]
    text: Annotated[StrictStr, Field(min_length=1), NulFree]

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class CreateArtifact(_Closed):
    family: Literal["atomic-memory", "topic-memory", "experience", "profile"]
    content: dict[str, Any]


class ReplaceArtifact(_Closed):
    """1.4.1's replace of topic memory, experience and profile. Its atomic-memory replace takes
    `content` only: `replace_artifact` refuses the other two keys there, even as null."""

    content: dict[str, Any]
    restored_from_revision: Annotated[StrictInt, Field(ge=1)] | None = None
    # 1.4.1's own constraint (1–1024 characters, one not whitespace), checked by the same engine
    reason: Annotated[StrictStr, Field(min_length=1, max_length=1024, pattern=r".*\S.*"), NulFree] | None = None


# What 1.4.1's `ReplaceAtomicMemoryArtifactRequest` (closed: `content` only) does not take.
_ATOMIC_REPLACE_EXTRA = ("restored_from_revision", "reason")


TagMatch = Literal["all", "any"]
Tags = Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(max_length=16)]


class ListAtomic(_Closed):
    scope_id: ScopeId
    states: list[Literal["active", "forgotten", "merged", "retired"]] | None = None
    kind: Annotated[StrictStr, Field(min_length=1), NulFree] | None = None
    tags: Tags | None = None
    tag_match: TagMatch | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=100)] = 50
    cursor: Annotated[StrictStr, Field(max_length=4096)] | None = None


class SearchAtomic(_Closed):
    scope_id: ScopeId
    query: Annotated[StrictStr, Field(min_length=1, max_length=8192)]
    mode: Literal["text", "vector", "hybrid"] = "text"
    kind: Annotated[StrictStr, Field(min_length=1), NulFree] | None = None
    tags: Tags | None = None
    tag_match: TagMatch | None = None
    limit: Annotated[StrictInt, Field(ge=1, le=100)] = 20


class Lifecycle(_Closed):
    scope_id: ScopeId
    target: MemoryInput
    # 1.4.1 allows only "forgotten" here; wiregate also retires (SPEC §10.2), an extension.
    state: Literal["forgotten", "retired"]


class Merge(_Closed):
    scope_id: ScopeId
    inputs: Annotated[list[MemoryInput], Field(min_length=2)]
    content: AtomicContent
    source_refs: list[dict[str, Any]] = Field(default_factory=list)
    artifact_refs: list[Ref] = Field(default_factory=list)


class SearchArtifacts(_Closed):
    query: Annotated[StrictStr, Field(min_length=1, max_length=8192, pattern=r".*\S.*")]
    limit: Annotated[StrictInt, Field(ge=1, le=200)] = 10
    mode: Annotated[StrictStr, Field(min_length=1, pattern=r".*\S.*")] | None = None
    filters: dict[str, Any] | None = None
    admission: dict[str, Any] | None = None
    fusion: dict[str, Any] | None = None
    min_score: Annotated[float, Field(ge=0, le=1)] | None = None
    include_scores: StrictBool = False
    rerank: dict[str, Any] | None = None


class Remember(_Closed):
    scope_id: ScopeId
    kind: Annotated[StrictStr, Field(min_length=1, max_length=128), NulFree]
    text: Annotated[StrictStr, Field(min_length=1), NulFree]
    reason: Annotated[StrictStr, Field(max_length=512)] | None = None
    expected_revision: Annotated[StrictInt, Field(ge=1)] | None = None


class TagFilter(_Closed):
    tags: Annotated[list[Annotated[StrictStr, Field(min_length=1, max_length=64)]], Field(min_length=1, max_length=16)]
    match: TagMatch = "all"


class SearchMemory(_Closed):
    scope_id: ScopeId
    query: Annotated[StrictStr, Field(min_length=1, max_length=8192)]
    limit: Annotated[StrictInt, Field(ge=1, le=50)] = 10
    mode: Literal["auto", "fts", "vector", "hybrid"] = "auto"
    tag_filter: TagFilter | None = None


class Prepare(_Closed):
    scope_id: ScopeId
    query: Annotated[StrictStr, Field(min_length=1, max_length=8192, pattern=r"(?s).*\S.*")]
    max_bytes: Annotated[StrictInt, Field(ge=512, le=32768)] = 8000
    include_code: StrictBool | None = None
    explain: StrictBool | None = None
    assembly: dict[str, Any] | None = None
    bootstrap_receipt_id: Annotated[StrictStr, Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7E]+$")] | None = (
        None
    )
    # The seeds' opt-ins (omitted, null and false are the same)
    include_receipt: StrictBool | None = None
    include_reuse: StrictBool | None = None


# --- errors in 1.4.1's shape -------------------------------------------------------------------


class Unauthorized(cx.ContextError):
    status, code, message = 401, "unauthorized", "A valid credential is required."


class Forbidden(cx.ContextError):
    status, code, message = 403, "forbidden", "The principal may not perform this operation."


class RequestTooLarge(cx.ContextError):
    status, code, message = 413, "request_too_large", "The HTTP request body exceeds the limit."


class ContractViolation(cx.ContextError):
    status, code, message = 422, "invalid_request", "The request violates the API contract."


class QueryViolation(ContractViolation):
    """A query parameter of a route under `/v1/scopes/{scope_id}/` that does not fit its schema:
    1.4.1 answers those 400 (and the same under `/v1/scopes` itself 422)."""

    status = 400


def _violation(kind: str, loc: Sequence[str | int], msg: str) -> dict[str, Any]:
    """`details` of a ContractViolation naming one error (locations name fields, never values)."""
    return {"errors": [{"type": kind, "loc": list(loc), "msg": msg}]}


class NotModified(Exception):
    def __init__(self, etag: str) -> None:
        super().__init__("not modified")
        self.etag = etag


_ETAG = re.compile(r'^"revision:[0-9]{1,12}"$')


def _error_response(err: cx.ContextError) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else {}
    body = err.to_wire()
    details = body["error"]["details"]
    if (
        isinstance(err, cx.RevisionConflict)
        and isinstance(details, dict)
        and not _ETAG.match(str(details.get("provided_etag")))
    ):
        details["provided_etag"] = None  # only ever echo an ETag of ours, never client text
    return web.json_response(body, status=err.status, headers=headers)


def _validation_details(exc: ValidationError, schema: type[BaseModel]) -> dict[str, Any]:
    """pydantic's errors without input values; a location segment that is not one of the
    schema's own field names (a client's unknown key, say) is written `*`."""
    known = _field_names(schema)
    out = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        loc = ["body", *(p if isinstance(p, int) or p in known else "*" for p in error["loc"])]
        out.append({"type": error["type"], "loc": loc, "msg": _MESSAGES.get(error["type"], "Invalid value")})
    return {"errors": out}


_MESSAGES = {
    "missing": "Field required",
    "extra_forbidden": "Extra inputs are not permitted",
    "string_too_short": "String too short",
    "string_too_long": "String too long",
    "string_pattern_mismatch": "String does not match the pattern",
    "string_type": "Input should be a valid string",
    "int_type": "Input should be a valid integer",
    "bool_type": "Input should be a valid boolean",
    "greater_than_equal": "Input is too small",
    "less_than_equal": "Input is too large",
    "literal_error": "Input is not one of the allowed values",
    "too_short": "List too short",
    "too_long": "List too long",
    "dict_type": "Input should be a valid dictionary",
    "list_type": "Input should be a valid list",
    "model_type": "Input should be an object",
    "json_invalid": "Invalid JSON",
    "string_nul": "String contains a NUL character",
    "scope_too_large": "Scope text too large",
}


def _field_names(schema: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    stack: list[Any] = [schema]
    seen: set[Any] = set()
    while stack:
        model = stack.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            names.add(info.alias or name)
            for arg in _types_in(info.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    stack.append(arg)
    return names


def _types_in(annotation: Any) -> list[Any]:
    out = [annotation]
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_types_in(arg))
    return out


# --- the route wrapper -------------------------------------------------------------------------


class Ctx:
    """What a route handler gets: the runtime, the principal, the service, and helpers to
    authorise scopes."""

    def __init__(self, request: web.Request, runtime: Runtime, identity: auth.Identity) -> None:
        self.request = request
        self.runtime = runtime
        self.identity = identity
        self.principal = identity.principal
        self.service: ContextService = request.app[CONTEXT]

    async def allow(self, scope_id: str, action: str) -> ScopeRecord:
        """The scope, if this principal may `action` on it; else 403 (an unknown scope the
        principal could not see is 404 only when it could act on it: no existence oracle)."""
        record = await self.service.find_scope(scope_id)  # None for an id no scope can have
        if not may(self.principal, scope_id, action, record):
            raise Forbidden()
        if record is None:
            raise cx.ScopeNotFound()
        return record

    async def may_read(self, scope_id: str) -> bool:
        """May this caller read the scope under the configuration now in force? Prepare asks
        again before it assembles (COMPAT §4: a read revoked meanwhile is a 403), so a reload
        since the call began counts: its key is authenticated again against that runtime."""
        principal = self._principal_now()
        return principal is not None and may(
            principal, scope_id, "context.read", await self.service.find_scope(scope_id)
        )

    def _principal_now(self) -> Principal | None:
        runtime = self.request.app[RUNTIME].current
        if runtime is self.runtime:
            return self.principal
        key = auth.presented_key(self.request.headers)
        return runtime.authenticate(key) if key else None


def may(principal: Principal, scope_id: str, action: str, record: ScopeRecord | None) -> bool:
    return auth.may_on_scope(principal, scope_id, action, record.created_by if record is not None else None)


def route(action: str, schema: type[BaseModel] | None = None) -> Callable[..., Handler]:
    """Wrap a handler: authenticate (the route's action in general), read and validate the
    body, and render context errors in 1.4.1's shape."""

    def wrap(fn: Callable[..., Awaitable[web.StreamResponse]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            call = request[CALL]
            runtime = request.app[RUNTIME].current
            try:
                try:
                    identity = auth.identify(runtime, request.headers, action, any_scope=True)
                except ClientError as err:
                    raise (Unauthorized() if err.status == 401 else Forbidden()) from None
                call.identify(identity, runtime)
                ctx = Ctx(request, runtime, identity)
                if schema is None:
                    response = await fn(ctx)
                else:
                    raw, dto = await _read(request, runtime, schema)
                    response = await fn(ctx, dto, raw)
                if action == "context.read" and isinstance(response, web.Response) and response.status == 200:
                    _read_check(ctx, response.body)
                return response
            except NotModified as nm:
                return web.Response(status=304, headers={"ETag": nm.etag})
            except cx.ContextError as err:
                call.outcome = Outcome.REFUSED
                if isinstance(err, cx.MemoryWriteRejected | cx.MemoryReadWithheld):
                    call.reason_codes = err.reason_codes
                    log.info(err.code, request_id=call.request_id, reason_codes=err.reason_codes)
                return _error_response(err)

        handler.__name__ = fn.__name__
        return handler

    return wrap


async def _read(request: web.Request, runtime: Runtime, schema: type[BaseModel]) -> tuple[bytes, Any]:
    limit = runtime.config.context.request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise RequestTooLarge()
    try:
        raw = await read_body(request, runtime.config.limits)
    except ClientError as err:
        if err.status == 413:
            raise RequestTooLarge() from None
        if err.status == 415:
            details = {"errors": [{"type": "media_type", "loc": ["header"], "msg": "JSON expected"}]}
            raise ContractViolation(details) from None
        raise
    if len(raw) > limit:
        raise RequestTooLarge()
    try:
        doc = json.loads(raw, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, a duplicate key
        raise ContractViolation(
            {"errors": [{"type": "json_invalid", "loc": ["body"], "msg": "Invalid JSON"}]}
        ) from None
    try:
        return raw, schema.model_validate(doc)
    except ValidationError as exc:
        raise ContractViolation(_validation_details(exc, schema)) from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")  # ambiguous: never guess which value was meant
    return out


def _read_check(ctx: Ctx, body: Any) -> None:
    """Every read boundary applies the current rules (RFC 2086): what a read returns (its
    JSON `body`) is inspected as a write is, under the runtime of this call, so a value
    configured after it was stored is never echoed: the read is withheld whole."""
    if not isinstance(body, bytes):
        return
    reasons = refusal_reasons(write_verdict(ctx.runtime, (), body))
    if reasons:
        raise cx.MemoryReadWithheld(reasons)


async def _inputs_readable(ctx: Ctx, scope_id: str, inputs: Sequence[MemoryInput]) -> None:
    """A change that answers with the records it changed (lifecycle, merge) reads them:
    each input revision is checked as a read of it would be, before anything changes (an
    input that cannot be read is left to the change itself to refuse, as it does). Repeated
    inputs are refused first (409 invalid_memory_relation, as the change refuses them before
    it reads any), and one read of the heads leaves out the revisions that do not exist, so
    a change costs a read of each input it really names, whatever its body repeats or
    invents (and a revision past any a store can hold is never bound to a query)."""
    ids = [item.artifact.artifact_id for item in inputs]
    if len(set(ids)) != len(ids):
        raise cx.InvalidMemoryRelation()
    heads = await ctx.service.atomic_heads(scope_id, ids)
    for item in inputs:
        ref = item.artifact
        head = heads.get(ref.artifact_id)
        if head is None or ref.revision > head.artifact.revision:
            continue
        try:
            revision = await ctx.service.get_artifact_revision(scope_id, ref.family, ref.artifact_id, ref.revision)
        except cx.ContextError:
            continue
        _read_check(ctx, compact_json(revision.to_wire()))


def _checked(ctx: Ctx, raw: bytes) -> None:
    """The whole write body as received goes through the write check too (the service
    checks the normalised texts it would store)."""
    reasons = refusal_reasons(write_verdict(ctx.runtime, (), raw))
    if reasons:
        raise cx.MemoryWriteRejected(reasons)


def _json(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=compact_json(body),
        status=status,
        headers=dict(headers or {}),
        content_type="application/json",
    )


def _query(request: web.Request, name: str) -> str | None:
    """A query parameter given at most once (a repeated one is refused, never guessed)."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise cx.InvalidRequest("query", "parameters must be provided at most once")
    return values[0] if values else None


_SIGNED_DIGITS = re.compile(r"-?[0-9]{1,64}")


def _query_violation(request: web.Request, details: dict[str, Any]) -> ContractViolation:
    """1.4.1 answers a query parameter that does not fit its schema 400 under a scope
    (`/v1/scopes/{scope_id}/…`) and 422 elsewhere."""
    if request.path.startswith("/v1/scopes/"):
        return QueryViolation(details)
    return ContractViolation(details)


def _int_query(request: web.Request, name: str, default: int | None, low: int, high: int) -> int | None:
    """An integer query parameter in [low, high], spelled as plain ASCII digits (an optional
    minus): anything else is `int_parsing` (1.4.1's pydantic also takes `+5`, ` 5 `, `5.0`,
    `1_0`; wiregate keeps the one spelling a client's serializer writes)."""
    value = _query(request, name)
    if value is None:
        return default
    loc = ["query", name]
    if _SIGNED_DIGITS.fullmatch(value) is None:
        raise _query_violation(request, _violation("int_parsing", loc, "Input should be a valid integer"))
    number = int(value)
    if number < low:
        raise _query_violation(request, _violation("greater_than_equal", loc, _MESSAGES["greater_than_equal"]))
    if number > high:
        raise _query_violation(request, _violation("less_than_equal", loc, _MESSAGES["less_than_equal"]))
    return number


def _cursor(request: web.Request) -> str | None:
    value = _query(request, "cursor")
    if value is not None and not 1 <= len(value) <= 4096:
        kind = "string_too_short" if not value else "string_too_long"
        raise _query_violation(request, _violation(kind, ["query", "cursor"], _MESSAGES[kind]))
    return value


_SCOPE_CURSOR = b"wiregate scope list cursor v1"


@functools.lru_cache(maxsize=4)
def _cursor_cipher(log_key: bytes) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(hmac.digest(log_key, _SCOPE_CURSOR, "sha256"))


def _seal_cursor(runtime: Runtime, inner: str | None) -> str | None:
    """A scope listing's cursor, sealed: it names a scope id the caller may not see (the
    last one read when a page stopped early), so the caller gets it only encrypted."""
    if inner is None:
        return None
    nonce = os.urandom(12)
    sealed = nonce + _cursor_cipher(runtime.log_key).encrypt(nonce, inner.encode(), _SCOPE_CURSOR)
    return base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def _open_cursor(runtime: Runtime, outer: str | None) -> str | None:
    if outer is None:
        return None
    try:
        sealed = base64.urlsafe_b64decode(outer + "=" * (-len(outer) % 4))
        return _cursor_cipher(runtime.log_key).decrypt(sealed[:12], sealed[12:], _SCOPE_CURSOR).decode()
    except (ValueError, binascii.Error, InvalidTag):
        raise cx.InvalidCursor() from None


def _if_none_match(request: web.Request, etag: str, *, star: bool) -> None:
    """304 when a listed tag (weak or strong) is `etag`, or is `*` where `star` (1.4.1: the
    atomic-memory state honours `*`; an artifact head does not, and answers 200)."""
    header = request.headers.get("If-None-Match")
    if header is None:
        return
    for candidate in header.split(","):
        candidate = candidate.strip()
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate == etag or (star and candidate == "*"):
            raise NotModified(etag)


# --- scopes ------------------------------------------------------------------------------------


@route("context.write", CreateScope)
async def create_scope(ctx: Ctx, dto: CreateScope, raw: bytes) -> web.Response:
    """A new scope, made by a principal that may write context (in its actions, or in one
    of its `scope_actions`): one that may only read or prepare may not create scopes."""
    principal = ctx.principal
    if not principal.may("context.write") and not any("context.write" in a for _, a in principal.scope_actions):
        raise Forbidden()
    for ref in [*dto.context_references, *([dto.parent_scope_id] if dto.parent_scope_id else [])]:
        await ctx.allow(ref, "context.read")  # a scope may only reference what its creator may read
    _checked(ctx, raw)
    scope, _created = await ctx.service.create_scope(
        title=dto.title,
        summary=dto.summary,
        idempotency_key=dto.idempotency_key,
        principal=ctx.principal.id,
        parent_scope_id=dto.parent_scope_id,
        context_references=dto.context_references,
        external_references=[e.model_dump() for e in dto.external_references],
    )
    return _json(scope.to_wire(), 201)


# Scope discovery 1.4.1 offers beside its two plain filters (`parent_scope_id`,
# `external_reference_kind`, served): text queries and integration bindings.
_UNSERVED_SCOPE_FILTERS = ("query", "query_field", "binding_integration", "binding_kind")


@route("context.read")
async def list_scopes(ctx: Ctx) -> web.Response:
    """Scopes this principal may read, `limit` to a page (fewer only when the page stopped
    after reading `SCOPE_SCAN_ROWS` scopes); the cursor is sealed and names nothing."""
    request = ctx.request
    limit = _int_query(request, "limit", None, 1, 100)
    for name in _UNSERVED_SCOPE_FILTERS:  # taken by 1.4.1, not served here: refused, never ignored
        if _query(request, name) is not None:
            raise cx.CapabilityNotSupported(name)
    parent = _query(request, "parent_scope_id")
    kind = _query(request, "external_reference_kind")

    def wanted(s: Any) -> bool:
        if parent is not None and s.parent_scope_id != parent:
            return False
        if kind is not None and not any(ref.get("kind") == kind for ref in s.external_references):
            return False
        return may(ctx.principal, s.scope_id, "context.read", s)

    page = await ctx.service.list_scopes(
        limit=limit, cursor=_open_cursor(ctx.runtime, _cursor(request)), visible=wanted
    )
    items = [s.to_wire() for s in page.items]
    return _json({"items": items, "next_cursor": _seal_cursor(ctx.runtime, page.next_cursor)})


@route("context.read")
async def get_scope(ctx: Ctx) -> web.Response:
    scope = await ctx.allow(ctx.request.match_info["scope_id"], "context.read")
    return _json(scope.to_wire())


# --- artifacts ---------------------------------------------------------------------------------


def _family(request: web.Request) -> str:
    return request.match_info["family"]


_FAMILIES = frozenset(f.value for f in Family)


def _artifact_id(request: web.Request) -> str:
    """The path's artifact id. One no artifact can have (not 1–128 visible ASCII: a NUL, which
    PostgreSQL text cannot hold, a space, a non-ASCII letter) is 404 here, before any store
    call, as an impossible scope id is; the store would find nothing under it either. A family
    wiregate does not serve is left to the service, which refuses it first (422) as before."""
    artifact_id = request.match_info["artifact_id"]
    if not valid_artifact_id(artifact_id) and request.match_info.get("family", Family.ATOMIC_MEMORY) in _FAMILIES:
        raise cx.ArtifactNotFound()
    return artifact_id


@route("context.write", CreateArtifact)
async def create_artifact(ctx: Ctx, dto: CreateArtifact, raw: bytes) -> web.Response:
    scope_id = ctx.request.match_info["scope_id"]
    await ctx.allow(scope_id, "context.write")
    _checked(ctx, raw)
    created = await ctx.service.create_artifact(scope_id, dto.family, dto.content, principal=ctx.principal.id)
    location = "/v1/scopes/{}/artifacts/{}/{}".format(
        quote(scope_id, safe=""), quote(created.family, safe=""), quote(created.artifact_id, safe="")
    )
    return _json(created.to_created(), 201, {"ETag": created.etag, "Location": location})


@route("context.read")
async def list_artifacts(ctx: Ctx) -> web.Response:
    request = ctx.request
    scope_id = request.match_info["scope_id"]
    await ctx.allow(scope_id, "context.read")
    limit = _int_query(request, "limit", None, 1, 100)
    tags = request.query.getall("tag", None)
    _no_tags(tags, _query(request, "tag_match"))
    page = await ctx.service.list_artifacts(scope_id, _family(request), limit=limit, cursor=_cursor(request))
    return _json({"items": [r.to_collection_item() for r in page.items], "next_cursor": page.next_cursor})


@route("context.read")
async def get_artifact(ctx: Ctx) -> web.Response:
    info = ctx.request.match_info
    await ctx.allow(info["scope_id"], "context.read")
    head = await ctx.service.get_artifact(info["scope_id"], info["family"], _artifact_id(ctx.request))
    _if_none_match(ctx.request, head.etag, star=False)
    return _json(head.to_wire(), headers={"ETag": head.etag})


@route("context.write", ReplaceArtifact)
async def replace_artifact(ctx: Ctx, dto: ReplaceArtifact, raw: bytes) -> web.Response:
    info = ctx.request.match_info
    if info["family"] == Family.ATOMIC_MEMORY.value:  # a schema error, so before authorisation
        extra = [name for name in _ATOMIC_REPLACE_EXTRA if name in dto.model_fields_set]
        if extra:
            msg = _MESSAGES["extra_forbidden"]
            raise ContractViolation(
                {"errors": [{"type": "extra_forbidden", "loc": ["body", n], "msg": msg} for n in extra]}
            )
    await ctx.allow(info["scope_id"], "context.write")
    _checked(ctx, raw)
    if dto.restored_from_revision is not None:
        raise cx.CapabilityNotSupported("restored_from_revision")
    rev = await ctx.service.replace_artifact(
        info["scope_id"],
        info["family"],
        _artifact_id(ctx.request),
        dto.content,
        if_match=ctx.request.headers.get("If-Match"),
        principal=ctx.principal.id,
        reason=dto.reason,
    )
    return _json(rev.to_wire(), headers={"ETag": rev.etag})


@route("context.read")
async def list_revisions(ctx: Ctx) -> web.Response:
    request = ctx.request
    info = request.match_info
    await ctx.allow(info["scope_id"], "context.read")
    limit = _int_query(request, "limit", None, 1, 100)
    page = await ctx.service.list_artifact_revisions(
        info["scope_id"], info["family"], _artifact_id(request), limit=limit, cursor=_cursor(request)
    )
    return _json({"items": [r.to_collection_item() for r in page.items], "next_cursor": page.next_cursor})


@route("context.read")
async def get_revision(ctx: Ctx) -> web.Response:
    info = ctx.request.match_info
    await ctx.allow(info["scope_id"], "context.read")
    revision = ascii_int(info["revision"], 9)
    if revision is None or revision < 1:
        raise ContractViolation(
            {"errors": [{"type": "int_parsing", "loc": ["path", "revision"], "msg": "Input should be a valid integer"}]}
        )
    rev = await ctx.service.get_artifact_revision(info["scope_id"], info["family"], _artifact_id(ctx.request), revision)
    return _json(rev.to_wire())


@route("context.read")
async def get_state(ctx: Ctx) -> web.Response:
    info = ctx.request.match_info
    await ctx.allow(info["scope_id"], "context.read")
    state = await ctx.service.get_atomic_state(info["scope_id"], _artifact_id(ctx.request))
    _if_none_match(ctx.request, state.etag, star=True)
    return _json(state.to_wire(), headers={"ETag": state.etag})


@route("context.read", SearchArtifacts)
async def search_artifacts(ctx: Ctx, dto: SearchArtifacts, raw: bytes) -> web.Response:
    info = ctx.request.match_info
    scope_id, family = info["scope_id"], info["family"]
    await ctx.allow(scope_id, "context.read")
    if family == "skill":
        return _json(_skill_search(dto))
    if family not in ("atomic-memory", "topic-memory", "experience"):
        if family in ("profile", "handoff", "prompt"):
            raise cx.ArtifactSearchNotSupported("family")
        raise cx.ArtifactFamilyNotFound()
    mode = {None: "fts", "text": "fts", "vector": "vector", "hybrid": "hybrid"}.get(dto.mode)
    if mode is None:  # 1.4.1's schema: one of its three modes
        raise ContractViolation(_violation("literal_error", ["body", "mode"], _MESSAGES["literal_error"]))
    for name, value in (("admission", dto.admission), ("fusion", dto.fusion), ("rerank", dto.rerank)):
        if value is not None:  # taken by 1.4.1, not served here: refused, never ignored
            raise cx.CapabilityNotSupported(name)
    top = _SEARCH_LIMITS.get(family)
    if top is not None and dto.limit > top:
        raise ContractViolation(_violation("less_than_equal", ["body", "limit"], _MESSAGES["less_than_equal"]))
    kind = _filter_kind(dto.filters)
    result = await ctx.service.search(scope_id, family, dto.query, mode=mode, limit=dto.limit, kind=kind)
    items = []
    for hit in result.hits:
        head = hit.head
        item: dict[str, Any] = {
            "family": head.family,
            "artifact_id": head.artifact_id,
            "revision": head.revision,
            "content": dict(head.content),
            "lineage": {
                "sources": [{"source_type": "content", "source_id": head.source_id}],
                "artifacts": [head.previous.to_wire()] if head.previous else [],
                "publication_source": None,
                "publication_digest": None,
            },
        }
        if dto.include_scores:
            item["scores"] = {
                "retrieval": min(1.0, hit.score * 60),
                "channels": {
                    name: {"raw": value, "metric": metric, "higher_is_better": higher}
                    for name, (value, metric, higher) in hit.channel_scores.items()
                    if math.isfinite(value)
                },
            }
        if dto.min_score is None or min(1.0, hit.score * 60) >= dto.min_score:
            items.append(item)
    return _json({"results": items})


# The largest `limit` 1.4.1's search request of a family takes, where it is below the
# generic 200.
_SEARCH_LIMITS = {"atomic-memory": 100, "topic-memory": 20}


def _skill_search(dto: SearchArtifacts) -> dict[str, Any]:
    """1.4.1 searches the skill family, which wiregate does not serve: the request is checked as
    1.4.1's skill search checks it (text mode only, no filter, fusion or rerank), and finds nothing."""
    if dto.mode not in (None, "text"):
        raise ContractViolation(_violation("literal_error", ["body", "mode"], _MESSAGES["literal_error"]))
    for name, value in (("filters", dto.filters or None), ("fusion", dto.fusion), ("rerank", dto.rerank)):
        if value is not None:
            raise ContractViolation(_violation("extra_forbidden", ["body", name], _MESSAGES["extra_forbidden"]))
    return {"results": []}


def _filter_kind(filters: Mapping[str, Any] | None) -> str | None:
    if not filters:
        return None
    if not set(filters) <= {"kind", "tags", "tag_match"}:
        raise cx.InvalidRequest("filters", "names an unknown filter")
    kind = filters.get("kind")
    if kind is not None and (not isinstance(kind, str) or not 0 < len(kind) <= 128 or not storable(kind)):
        raise cx.InvalidRequest("filters", "kind must be a string")
    if filters.get("tags"):
        raise cx.CapabilityNotSupported("tags")
    return kind


# --- atomic memory -----------------------------------------------------------------------------


@route("context.read", ListAtomic)
async def list_atomic(ctx: Ctx, dto: ListAtomic, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.read")
    _no_tags(dto.tags, dto.tag_match)
    page = await ctx.service.list_atomic_memories(
        dto.scope_id, states=dto.states, kind=dto.kind, limit=dto.limit, cursor=dto.cursor
    )
    return _json({"items": [r.to_wire() for r in page.items], "next_cursor": page.next_cursor})


@route("context.read", SearchAtomic)
async def search_atomic(ctx: Ctx, dto: SearchAtomic, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.read")
    _no_tags(dto.tags, dto.tag_match)
    mode = "fts" if dto.mode == "text" else dto.mode
    result = await ctx.service.search(
        dto.scope_id, "atomic-memory", dto.query, mode=mode, limit=dto.limit, kind=dto.kind
    )
    return _json(_search_hits(result))


def _no_tags(tags: Sequence[str] | None, tag_match: str | None) -> None:
    """Tags are not served; what 1.4.1 refuses before it would use them is refused alike:
    `tag_match` without `tags` (422 invalid_request) and an empty `tags` (422, its schema)."""
    if tags is None:
        if tag_match is not None:
            raise cx.InvalidRequest("tag_match", "requires tags")
        return
    if not tags:
        raise ContractViolation(_violation("value_error", ["body", "tags"], "tags has an invalid number of labels"))
    raise cx.CapabilityNotSupported("tags")


def _search_hits(result: SearchResult) -> dict[str, Any]:
    """Search hits as 1.4.1 `AtomicMemorySearchHit`s (the record carries its state version).
    A hit is a searchable head, so an active memory (never merged into another), and the store
    read its state version with it, in the same snapshot."""
    hits = []
    for h in result.hits:
        hits.append(
            {
                "memory": {
                    "artifact": h.head.ref.to_wire(),
                    "kind": str(h.head.content.get("kind", "")),
                    "text": str(h.head.content.get("text", "")),
                    "state": MemoryState.ACTIVE.value,
                    "state_version": h.state_version,
                    "merged_into_id": None,
                },
                "score": h.score,
                "matched_by": list(h.matched_by),
            }
        )
    return {"mode": result.wire_mode, "hits": hits}


@route("context.write", Lifecycle)
async def lifecycle(ctx: Ctx, dto: Lifecycle, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.write")
    await _inputs_readable(ctx, dto.scope_id, [dto.target])
    result = await ctx.service.change_lifecycle(dto.scope_id, dto.target.input(), dto.state)
    return _json(result.to_wire())


@route("context.write", Merge)
async def merge(ctx: Ctx, dto: Merge, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.write")
    if any(i.artifact.family != "atomic-memory" for i in dto.inputs):  # 1.4.1: before the inputs are read
        msg = "Atomic Memory read dependencies require the atomic-memory Family"
        raise ContractViolation(_violation("value_error", ["body", "inputs"], msg))
    if dto.source_refs or dto.artifact_refs:
        raise cx.CapabilityNotSupported("merge_references")
    _checked(ctx, raw)
    await _inputs_readable(ctx, dto.scope_id, dto.inputs)
    result = await ctx.service.merge_atomic_memories(
        dto.scope_id, [i.input() for i in dto.inputs], dto.content.wire(), principal=ctx.principal.id
    )
    return _json(result.to_wire())


@route("context.write", Remember)
async def remember(ctx: Ctx, dto: Remember, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.write")
    if dto.expected_revision is not None:
        raise LegacyUnsupported()
    _checked(ctx, raw)
    result = await ctx.service.remember(dto.scope_id, dto.kind, dto.text, principal=ctx.principal.id)
    return _json(result.to_wire())


class LegacyUnsupported(cx.ContextError):
    status, code, message = 422, "legacy_memory_operation_unsupported", "This legacy memory operation is unsupported."


@route("context.read", SearchMemory)
async def search_memory(ctx: Ctx, dto: SearchMemory, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.read")
    if dto.tag_filter is not None:
        raise cx.CapabilityNotSupported("tags")
    result = await ctx.service.search(dto.scope_id, "atomic-memory", dto.query, mode=dto.mode, limit=dto.limit)
    return _json(_search_hits(result))


# --- prepare -----------------------------------------------------------------------------------


@route("context.prepare", Prepare)
async def prepare(ctx: Ctx, dto: Prepare, raw: bytes) -> web.Response:
    await ctx.allow(dto.scope_id, "context.prepare")  # references are authorised by the service
    if dto.assembly is None and "assembly" in dto.model_fields_set:  # COMPAT §1: omitted, never null
        raise ContractViolation(_violation("value_error", ["body"], "assembly must be omitted or contain an object"))
    if dto.include_code:
        raise cx.CapabilityNotSupported("include_code")
    if dto.assembly is not None:
        raise cx.CapabilityNotSupported("assembly")
    call = ctx.request[CALL]
    started = time.perf_counter()
    result = await ctx.service.prepare(
        dto.scope_id,
        dto.query,
        dto.max_bytes,
        bool(dto.include_receipt),
        principal_may_read=ctx.may_read,
        rerank=ctx.runtime.rerank,
    )
    if result.sources:  # stored text, never echoed past today's rules: read as whole items are
        _read_check(ctx, compact_json(list(result.sources)))
    if dto.include_receipt and result.receipt is None:
        log.warning("receipt_omitted", request_id=call.request_id, diagnostic=result.receipt_diagnostic)
    log.info(
        "prepare",
        request_id=call.request_id,
        status=result.context["status"],
        content_bytes=result.context["content_bytes"],
        items=len(result.dependencies),
        receipt=result.receipt is not None,
        receipt_id=result.receipt["receipt_id"] if result.receipt is not None else None,
        reuse=bool(dto.include_reuse),
        duration_ms=round((time.perf_counter() - started) * 1000, 3),
    )
    # 1.4.1: `reason` only when asked with `explain` and a channel was lost; else the four fields
    context: dict[str, Any] = dict(result.context)
    if dto.explain and result.degradation is not None:
        context["reason"] = result.degradation
    if not dto.include_reuse:
        body: dict[str, Any] = context
        if result.receipt is not None:
            body["receipt"] = result.receipt
        return _json(body)
    envelope: dict[str, Any] = {
        "schema": WITH_REUSE_SCHEMA,
        "context": context,  # 1.4.1's PreparedContext, with its `reason` when explained
        "reuse": reuse_block(ctx, dto.scope_id, result.context, result.dependencies),
    }
    if result.receipt is not None:
        envelope["receipt"] = result.receipt
    return _json(envelope)


def reuse_block(ctx: Ctx, scope_id: str, context: Mapping[str, Any], deps: Sequence[Any]) -> dict[str, Any]:
    """The reuse envelope's `reuse`: a binding sealed by the key ring naming the exact
    content, the party it was prepared for, every dependency revision and the expiry."""
    runtime = ctx.runtime
    now = time.time()
    content = context.get("content") or ""
    made = claims_.new(
        claims_.ReuseClaims,
        runtime.keyring,
        audience=runtime.config.deployment_id,
        now=now,
        ttl_s=runtime.config.context.reuse_ttl_s,
        principal=ctx.principal.id,
        delegate=ctx.identity.on_behalf_of,
        scope=scope_id,
        content_digest="sha256:" + hashlib.sha256(content.encode("utf-8")).hexdigest(),
        dependencies=tuple(d.to_wire() for d in deps),
    )
    try:
        binding = claims_.seal_claims(runtime.keyring, made)
    except BindingTooLarge:  # only ids near their longest (and non-ASCII) get here
        raise cx.InvalidRequest(
            "include_reuse", "the reuse binding for this context would be too long; prepare fewer items"
        ) from None
    return {
        "schema": REUSE_SCHEMA,
        "constraints": REUSE_CONSTRAINTS,
        "expires_at": datetime.fromtimestamp(made.expires_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "binding": binding,
    }


# --- routes ------------------------------------------------------------------------------------


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_post("/v1/scopes", create_scope)
    r.add_get("/v1/scopes", list_scopes)
    r.add_get("/v1/scopes/{scope_id}", get_scope)
    r.add_post("/v1/scopes/{scope_id}/artifacts", create_artifact)
    r.add_get("/v1/scopes/{scope_id}/artifacts/{family}", list_artifacts)
    r.add_post("/v1/scopes/{scope_id}/artifacts/{family}/search", search_artifacts)
    r.add_get("/v1/scopes/{scope_id}/artifacts/atomic-memory/{artifact_id}/state", get_state)
    r.add_get("/v1/scopes/{scope_id}/artifacts/{family}/{artifact_id}", get_artifact)
    r.add_put("/v1/scopes/{scope_id}/artifacts/{family}/{artifact_id}", replace_artifact)
    r.add_get("/v1/scopes/{scope_id}/artifacts/{family}/{artifact_id}/revisions", list_revisions)
    r.add_get("/v1/scopes/{scope_id}/artifacts/{family}/{artifact_id}/revisions/{revision}", get_revision)
    r.add_post("/v1/atomic-memory/list", list_atomic)
    r.add_post("/v1/atomic-memory/search", search_atomic)
    r.add_post("/v1/atomic-memory/lifecycle", lifecycle)
    r.add_post("/v1/atomic-memory/merges", merge)
    r.add_post("/v1/memory/remember", remember)
    r.add_post("/v1/memory/search", search_memory)
    r.add_post("/v1/context/prepare", prepare)
