"""Replayed prepared context: verifying `prepared_contexts` entries of a before_send check.

For each `{binding, location}`: open the reuse binding (kind, audience, principal,
delegation, scope, expiry), resolve `location.pointer` in the payload to a string, take the
half-open UTF-8 byte range (which must fall on character boundaries), and require its
SHA-256 to equal the bound content digest — so the block, its trust wrapper and its
position are exactly what was prepared. Every dependency the binding names must still be
eligible; until the context store lands, nothing can vouch for a dependency, so a binding
that names any is treated as stale (fail closed).
Must not: reveal the content it compares, or accept anything it cannot verify.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.carriers import jsonraw
from gateway.carriers.jsonraw import JsonError
from gateway.checks.bindings import BindingError
from gateway.checks.claims import ReuseClaims, open_claims
from gateway.keyring import KeyRing
from gateway.vocab import ReasonCode

BEGIN_MARKER = "BEGIN_POWERCONTEXT_PREPARED_CONTEXT_V1"
END_MARKER = "END_POWERCONTEXT_PREPARED_CONTEXT_V1"

# dependency → still eligible? (the context store answers; None = nobody can say)
DependencyCheck = Callable[[Mapping[str, Any]], bool | None]


@dataclass(frozen=True, slots=True)
class Replay:
    binding: str
    pointer: str
    start_byte: int
    end_byte: int


def resolve_pointer(doc: Any, pointer: str) -> Any:
    """RFC 6901. Raises KeyError when the pointer does not resolve."""
    if pointer == "":
        return doc
    if not pointer.startswith("/"):
        raise KeyError(pointer)
    node = doc
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node[token]
        elif isinstance(node, list):
            if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
                raise KeyError(pointer)
            node = node[int(token)]
        else:
            raise KeyError(pointer)
    return node


def _on_boundary(data: bytes, at: int) -> bool:
    return at == len(data) or (data[at] & 0xC0) != 0x80


def verify(
    replays: Sequence[Replay],
    *,
    body: bytes,
    ring: KeyRing,
    audience: str,
    principal: str,
    delegate: str | None,
    scope: str,
    now: float,
    max_depth: int,
    dependency_ok: DependencyCheck | None = None,
) -> list[str]:
    """Reason codes for every replay that fails (empty: all verified)."""
    if not replays:
        return []
    try:
        doc = jsonraw.loads(body, max_depth=max_depth)
    except JsonError:
        return [ReasonCode.PREPARED_CONTEXT_MISMATCH]
    reasons: list[str] = []
    spans: dict[str, list[tuple[int, int]]] = {}
    for replay in replays:
        reason = _verify_one(replay, doc, ring, audience, principal, delegate, scope, now, dependency_ok)
        if reason is None:
            taken = spans.setdefault(replay.pointer, [])
            if any(not (replay.end_byte <= s or replay.start_byte >= e) for s, e in taken):
                reason = ReasonCode.PREPARED_CONTEXT_MISMATCH  # two blocks claiming the same bytes
            taken.append((replay.start_byte, replay.end_byte))
        if reason is not None and reason not in reasons:
            reasons.append(reason)
    return reasons


def _verify_one(
    replay: Replay,
    doc: Any,
    ring: KeyRing,
    audience: str,
    principal: str,
    delegate: str | None,
    scope: str,
    now: float,
    dependency_ok: DependencyCheck | None,
) -> str | None:
    try:
        claims = open_claims(
            ReuseClaims,
            ring,
            replay.binding,
            audience=audience,
            now=now,
            principal=principal,
            delegate=delegate,
            scope=scope,
        )
    except BindingError as exc:
        return (
            ReasonCode.PREPARED_CONTEXT_STALE
            if exc.reason == ReasonCode.BINDING_EXPIRED
            else ReasonCode.PREPARED_CONTEXT_MISMATCH
        )
    try:
        value = resolve_pointer(doc, replay.pointer)
    except (KeyError, IndexError):
        return ReasonCode.PREPARED_CONTEXT_MISMATCH
    if not jsonraw.is_str(value):
        return ReasonCode.PREPARED_CONTEXT_MISMATCH
    data = value.encode("utf-8", "surrogatepass")
    start, end = replay.start_byte, replay.end_byte
    if not (0 <= start <= end <= len(data)) or not (_on_boundary(data, start) and _on_boundary(data, end)):
        return ReasonCode.PREPARED_CONTEXT_MISMATCH
    block = data[start:end]
    if "sha256:" + hashlib.sha256(block).hexdigest() != claims.content_digest:
        return ReasonCode.PREPARED_CONTEXT_MISMATCH
    text = block.decode("utf-8", "surrogatepass")
    if BEGIN_MARKER not in text or END_MARKER not in text or text.index(BEGIN_MARKER) > text.index(END_MARKER):
        return ReasonCode.PREPARED_CONTEXT_MISMATCH  # the trust wrapper is part of what was prepared
    for dep in claims.dependencies:
        ok = dependency_ok(dep) if dependency_ok is not None else None
        if ok is not True:
            return ReasonCode.PREPARED_CONTEXT_STALE
    return None
