"""Content schemas of the stored families: validation, normalisation, canonical form and digest.

Owns: turning a client's write content into the stored 1.4.1 content object for each family
(atomic-memory, topic-memory, experience, profile), the canonical JSON (RFC 8785) and
`content_digest` (`sha256:<hex>` of it), the compact JSON the context layer writes
(`compact_json`), the text a family indexes for search, and the list of
strings a write check must see.
Must not: do I/O or read a clock (timestamps are passed in), or decide lifecycle or search policy.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

import pydantic_core
import rfc8785

from gateway.context.errors import InvalidRequest
from gateway.context.model import Family

ATOMIC_SCHEMA = "powercontext.atomic-memory.v1"
PROFILE_SCHEMA = "powercontext.profile.v1"
ATOMIC_TEXT_MAX_BYTES = 8192  # 1.4.1: NFC-normalised, trimmed atomic text is at most 8192 UTF-8 bytes
KIND_MAX_CHARS = 128
MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer RFC 8785 (the content digest) writes

# field → max characters (1.4.1 write schemas; every field must hold a non-whitespace character)
_TOPIC_FIELDS = {"title": 512, "summary": 8000, "detail": 125000}
_EXPERIENCE_FIELDS = {"situation": 8000, "action": 8000, "outcome": 8000, "lesson": 8000}


def normalize_text(text: str) -> str:
    """Atomic memory text and queries: NFC, then trimmed (Python `str.strip` whitespace)."""
    return unicodedata.normalize("NFC", text).strip()


def utf8_ok(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable(value: str) -> bool:
    """Text the context layer may store or look up by: UTF-8 (no lone surrogate) and no NUL.

    PostgreSQL text cannot hold U+0000 (psycopg refuses it before the statement runs); SQLite
    could, and 1.4.1 on SQLite would keep it. wiregate refuses it on both backends alike, so a
    write or filter is answered the same whichever store is configured (a 422, never a 500 on
    one and a 201 on the other), and no stored text ever holds one."""
    return "\x00" not in value and utf8_ok(value)


def nodes(*roots: Any) -> Iterator[Any]:
    """Every object in `roots` and inside them (mappings' keys and values, lists' and
    tuples' items), depth first, without recursion: a document is walked whatever its depth."""
    stack: list[Any] = list(roots)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)


def _storable_tree(value: Any) -> bool:
    """Every string in a JSON document (keys too) is `storable`."""
    return all(storable(node) for node in nodes(value) if isinstance(node, str))


def _reject(family: Family) -> InvalidRequest:
    return InvalidRequest("content", f"does not match the {family.value} model")


def _require_str(raw: Mapping[str, Any], key: str, family: Family, max_chars: int) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > max_chars or not storable(value):
        raise _reject(family)
    return value


def _closed(raw: Any, family: Family, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping) or not set(raw) <= allowed or not required <= set(raw):
        raise _reject(family)
    return raw


def normalize_atomic(raw: Any) -> tuple[str, str]:
    """Validate atomic write content `{kind, text, schema?}` → (kind, normalised text)."""
    fam = Family.ATOMIC_MEMORY
    doc = _closed(raw, fam, {"kind", "text", "schema"}, {"kind", "text"})
    if "schema" in doc and doc["schema"] != ATOMIC_SCHEMA:
        raise _reject(fam)
    kind = _require_str(doc, "kind", fam, KIND_MAX_CHARS)
    text = doc["text"]
    if not isinstance(text, str) or not storable(text):
        raise _reject(fam)
    text = normalize_text(text)
    if not text or len(text.encode("utf-8")) > ATOMIC_TEXT_MAX_BYTES:
        raise _reject(fam)
    return kind, text


def atomic_content(kind: str, text: str) -> dict[str, Any]:
    """The stored atomic content exactly as 1.4.1 reads it back."""
    return {"schema": ATOMIC_SCHEMA, "kind": kind, "text": text, "creation": None}


def stored_content(family: Family, raw: Any, *, now_iso: str, replacing: bool = False) -> dict[str, Any]:
    """Validate a write's `content` for `family` and return the content object to store."""
    if family is Family.ATOMIC_MEMORY:
        return atomic_content(*normalize_atomic(raw))
    if family is Family.TOPIC_MEMORY:
        doc = _closed(raw, family, set(_TOPIC_FIELDS), set(_TOPIC_FIELDS))
        return {k: _require_str(doc, k, family, n) for k, n in _TOPIC_FIELDS.items()}
    if family is Family.EXPERIENCE:
        doc = _closed(raw, family, {*_EXPERIENCE_FIELDS, "failure"}, set(_EXPERIENCE_FIELDS))
        out: dict[str, Any] = {k: _require_str(doc, k, family, n) for k, n in _EXPERIENCE_FIELDS.items()}
        failure = doc.get("failure")
        if failure is not None and not (isinstance(failure, Mapping) and _storable_tree(failure)):
            raise _reject(family)
        if failure is not None:
            try:  # what the content digest will canonicalise: an integer past 2^53 or an
                rfc8785.dumps(dict(failure))  # infinite float has no RFC 8785 form
            except (rfc8785.CanonicalizationError, ValueError, TypeError):
                raise _reject(family) from None
        out["failure"] = dict(failure) if failure is not None else None
        return out
    if family is Family.PROFILE:
        doc = _closed(raw, family, {"content", "restored_from_revision"}, {"content"})
        body = doc["content"]
        if not isinstance(body, str) or not body or not storable(body):
            raise _reject(family)
        restored = doc.get("restored_from_revision")
        # a revision the content digest can canonicalise (RFC 8785: at most 2^53 - 1)
        if restored is not None and (type(restored) is not int or not 1 <= restored <= MAX_SAFE_INTEGER):
            raise _reject(family)
        return {
            "schema": PROFILE_SCHEMA,
            "media_type": "text/markdown",
            "content": body if body.endswith("\n") else body + "\n",
            "generation": {
                "mode": "manual_replace" if replacing else "manual_create",
                "created_at": now_iso,
                "generator_id": None,
                "generator_version": None,
                "source_window": None,
                "restored_from_revision": restored,
            },
        }
    raise _reject(family)


def canonical_json(content: Mapping[str, Any]) -> bytes:
    """RFC 8785 canonical JSON (sorted keys, compact, UTF-8): what 1.4.1 digests."""
    return rfc8785.dumps(dict(content))


def compact_json(value: Any) -> bytes:
    """`json.dumps(value, ensure_ascii=False, separators=(",", ":"))` as UTF-8: what the
    context layer renders, sizes and answers with. Written by pydantic-core's serializer,
    five to eight times as fast here (a 3 KB receipt: 11 against 56-90 µs) and byte for byte
    the same for what these documents hold (str, int, bool, None, lists, tuples, str-keyed
    dicts, str enums). A float below 1e-4 may be spelled otherwise (`0.00001`, `1e-7` where
    Python writes `1e-05`, `1e-07`): the same number, and only a client's own JSON holds one
    (an experience's `failure` object, echoed in responses), never a rendered context, a
    receipt or a digest's input. A value it refuses (a lone surrogate) goes the reference way,
    which raises what it always raised."""
    try:
        return pydantic_core.to_json(value)
    except pydantic_core.PydanticSerializationError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def content_digest(content: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(content)).hexdigest()


def search_text(family: Family, content: Mapping[str, Any]) -> str | None:
    """The text a family's head is indexed and embedded by (None: not searchable)."""
    if family is Family.ATOMIC_MEMORY:
        return str(content["text"])
    if family is Family.TOPIC_MEMORY:
        return "\n".join(str(content[k]) for k in _TOPIC_FIELDS)
    if family is Family.EXPERIENCE:
        return "\n".join(str(content[k]) for k in _EXPERIENCE_FIELDS)
    return None


def write_texts(value: Any) -> list[str]:
    """Every string (keys excluded) inside a write's content, in document order, for the write check."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list | tuple):
            stack.extend(reversed(node))
    return out
