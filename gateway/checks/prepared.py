"""Replayed prepared context: verifying `prepared_contexts` entries of a before_send check.

For each `{binding, location}`: open the reuse binding (kind, audience, principal,
delegation, scope, expiry), resolve `location.pointer` in the payload to a string, take the
half-open UTF-8 byte range (which must fall on character boundaries), and require its
SHA-256 to equal the bound content digest — so the block, its trust wrapper and its
position are exactly what was prepared. Every dependency the binding names must still be
eligible: the caller looked each one up in the context store beforehand (`eligibility`,
async) and passes the answers in; a dependency nobody answered for is stale (fail closed).
Under a policy that requires bindings, text carrying the prepared-context markers that no
verified replay covers is withheld too.
Must not: reveal the content it compares, or accept anything it cannot verify.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.carriers import jsonraw
from gateway.carriers.jsonraw import JsonError
from gateway.checks.bindings import BindingError, open_binding
from gateway.checks.claims import ReuseClaims, decode, open_claims
from gateway.keyring import KeyRing
from gateway.vocab import ReasonCode

BEGIN_MARKER = "BEGIN_POWERCONTEXT_PREPARED_CONTEXT_V1"
END_MARKER = "END_POWERCONTEXT_PREPARED_CONTEXT_V1"
# Every marker a model reads as the edge of a prepared block (COMPAT §1: the JSON render's and
# the text render's): with bindings required, each must lie inside a verified block. A forged
# END after a genuine block would otherwise pass what precedes it off as part of that block.
MARKERS = (
    BEGIN_MARKER,
    END_MARKER,
    "BEGIN_POWERCONTEXT_PREPARED_TEXT_V1",
    "END_POWERCONTEXT_PREPARED_TEXT_V1",
)
MARKER_CORE = "_POWERCONTEXT_PREPARED_"  # in every marker: a text without it holds none of them


def dependency_key(dep: Mapping[str, Any]) -> str:
    """A dependency as the key its eligibility answer is filed under."""
    return json.dumps(dep, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def dependencies(ring: KeyRing, token: str, *, audience: str, now: float) -> tuple[str, tuple[dict[str, Any], ...]]:
    """The scope and dependencies a reuse binding names, for the store lookups done before
    verification (an unreadable binding names none: verification refuses it anyway)."""
    try:
        data = open_binding(ring, token)
        claims = decode(ReuseClaims, data)
    except BindingError:
        return "", ()
    if data.get("aud") != audience or now >= claims.expires_at:
        return "", ()
    return claims.scope, claims.dependencies


@dataclass(frozen=True, slots=True)
class Replay:
    binding: str
    pointer: str
    start_byte: int
    end_byte: int


_ARRAY_INDEX = re.compile(r"0|[1-9][0-9]{0,11}")


def follow_wrapping(replays: Sequence[Replay], sent: Any, planned: Any) -> tuple[Replay, ...]:
    """The replays as they read the planned body. A replay names a string of the body the
    client sent; where cache planning wrapped that bare string into one text block (an
    Anthropic `cache_control` marker on a string `system` or message content), it names
    that block's text, which holds the very same string."""
    out: list[Replay] = []
    for replay in replays:
        try:
            was = resolve_pointer(sent, replay.pointer)
            now = resolve_pointer(planned, replay.pointer)
        except (KeyError, IndexError):
            out.append(replay)
            continue
        if (
            jsonraw.is_str(was)
            and isinstance(now, list)
            and len(now) == 1
            and isinstance(now[0], dict)
            and now[0].get("text") == was
        ):
            replay = Replay(replay.binding, replay.pointer + "/0/text", replay.start_byte, replay.end_byte)
        out.append(replay)
    return tuple(out)


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
            if _ARRAY_INDEX.fullmatch(token) is None:  # RFC 6901: ASCII digits, no leading zero
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
    eligible: Mapping[str, bool] | None = None,
    marked: Sequence[tuple[str, bytes]] = (),
    require_binding: bool = False,
) -> list[str]:
    """Reason codes for every replay that fails (empty: all verified). `eligible`: the
    store's answer per `dependency_key`; `marked`: (pointer, UTF-8 text) of every request
    string carrying a marker (`MARKERS`), each of whose markers must lie inside a verified
    range when bindings are required."""
    reasons: list[str] = []
    spans: dict[str, list[tuple[int, int]]] = {}
    if replays:
        try:
            doc = jsonraw.loads(body, max_depth=max_depth)
        except JsonError:
            return [ReasonCode.PREPARED_CONTEXT_MISMATCH]
        for replay in replays:
            reason = _verify_one(replay, doc, ring, audience, principal, delegate, scope, now, eligible or {})
            if reason is None:
                taken = spans.setdefault(replay.pointer, [])
                if any(not (replay.end_byte <= s or replay.start_byte >= e) for s, e in taken):
                    reason = ReasonCode.PREPARED_CONTEXT_MISMATCH  # two blocks claiming the same bytes
                taken.append((replay.start_byte, replay.end_byte))
            if reason is not None and reason not in reasons:
                reasons.append(reason)
    if require_binding and not reasons:
        for pointer, data in marked:
            covered = spans.get(pointer, [])
            for marker in (m.encode() for m in MARKERS):
                at = data.find(marker)
                while at != -1:
                    if not any(s <= at and at + len(marker) <= e for s, e in covered):
                        return [ReasonCode.PREPARED_CONTEXT_UNBOUND]
                    at = data.find(marker, at + 1)
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
    eligible: Mapping[str, bool],
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
        if eligible.get(dependency_key(dep)) is not True:
            return ReasonCode.PREPARED_CONTEXT_STALE
    return None
