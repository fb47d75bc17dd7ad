"""Deterministic derivations from a request's content fields.

This module owns the rules that make the mock reproducible:

* which request fields count as *content* per API, and how they are canonicalised
  (cache markers stripped, string shorthands expanded, ``json.dumps`` sorted and
  compact) before hashing -- so a gateway that only adds ``prompt_cache_key``,
  ``cache_control`` or ``prompt_cache_breakpoint`` does not change ids or text;
* ids derived from that digest;
* counting the characters of text inside a content value (see `text_chars`);
* splitting emitted text into stream pieces;
* `plan_generation`: turning a request plus a `Step` into the `Generation` that the
  wire modules render.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .state import Step

Api = Literal["openai_chat", "openai_responses", "openai_embeddings", "anthropic"]

FIXED_CREATED = 1767225600
"""`created` / `created_at` of every generated object (2026-01-01T00:00:00Z)."""

DEFAULT_MODEL = "mock-model"

CONTENT_FIELDS: Mapping[Api, tuple[str, ...]] = MappingProxyType(
    {
        "openai_chat": ("messages", "tools"),
        "openai_responses": ("input", "instructions", "tools"),
        "openai_embeddings": ("input",),
        "anthropic": ("system", "messages", "tools"),
    }
)

CACHE_MARKER_KEYS = frozenset({"cache_control", "prompt_cache_breakpoint"})
"""Keys a caching gateway may add anywhere inside content; ignored for hashing."""

TEXT_KEYS = frozenset(
    {
        "text",
        "content",
        "input",
        "output",
        "arguments",
        "instructions",
        "system",
        "description",
        "thinking",
    }
)
"""A string counts as request text when the key holding it is one of these."""


def strip_cache_markers(value: Any) -> Any:
    """`value` with every `CACHE_MARKER_KEYS` member removed, at any depth."""
    if isinstance(value, dict):
        return {key: strip_cache_markers(item) for key, item in value.items() if key not in CACHE_MARKER_KEYS}
    if isinstance(value, list):
        return [strip_cache_markers(item) for item in value]
    return value


def _text_part(text: str, part_type: str = "text") -> dict[str, str]:
    return {"type": part_type, "text": text}


def _expand_message_content(messages: Any, part_type_for_role: Mapping[str, str]) -> Any:
    """Rewrite ``"content": "s"`` as the equivalent one-part list, per message."""
    if not isinstance(messages, list):
        return messages
    expanded = []
    for message in messages:
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            role = message.get("role")
            part_type = part_type_for_role.get(role if isinstance(role, str) else "", "text")
            message = {**message, "content": [_text_part(message["content"], part_type)]}
        expanded.append(message)
    return expanded


_TEXT_FOR_ALL_ROLES: Mapping[str, str] = MappingProxyType({})
_RESPONSES_PART_TYPES: Mapping[str, str] = MappingProxyType(
    {
        "user": "input_text",
        "system": "input_text",
        "developer": "input_text",
        "assistant": "output_text",
    }
)


def _expand_shorthands(api: Api, content: dict[str, Any]) -> dict[str, Any]:
    if api in ("openai_chat", "anthropic") and "messages" in content:
        content["messages"] = _expand_message_content(content["messages"], _TEXT_FOR_ALL_ROLES)
    if api == "anthropic" and isinstance(content.get("system"), str):
        content["system"] = [_text_part(content["system"])]
    if api == "openai_responses" and "input" in content:
        items = content["input"]
        if isinstance(items, str):
            items = [{"role": "user", "content": items}]
        content["input"] = _expand_message_content(items, _RESPONSES_PART_TYPES)
    return content


def canonical_content(api: Api, request: Mapping[str, Any]) -> dict[str, Any]:
    """The content fields of `request`, cache markers stripped and shorthands expanded."""
    content = {
        name: strip_cache_markers(request[name]) for name in CONTENT_FIELDS[api] if request.get(name) is not None
    }
    return _expand_shorthands(api, content)


def canonical_text(value: Any) -> str:
    """Sorted, compact JSON text with non-ASCII characters left unescaped."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    """`canonical_text` as UTF-8 (lone surrogates from ``\\ud800`` escapes kept)."""
    return canonical_text(value).encode("utf-8", "surrogatepass")


def content_digest(api: Api, request: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of the canonical content fields."""
    return hashlib.sha256(canonical_json(canonical_content(api, request))).hexdigest()


def derive_id(prefix: str, digest: str, label: str, length: int = 24) -> str:
    """A stable id such as ``call_<hex>`` for the object named `label` of one request."""
    return prefix + hashlib.sha256(f"{digest}/{label}".encode()).hexdigest()[:length]


def default_reply(digest: str) -> str:
    return f"Mock reply: {digest[:8]}."


def text_chars(value: Any, holding_key: str | None = None) -> int:
    """Unicode characters of the strings inside `value` held by a `TEXT_KEYS` key
    (`holding_key` names the key holding `value` itself, if any)."""
    if isinstance(value, str):
        return len(value) if holding_key in TEXT_KEYS else 0
    if isinstance(value, dict):
        return sum(text_chars(item, key) for key, item in value.items())
    if isinstance(value, list):
        return sum(text_chars(item, holding_key) for item in value)
    return 0


def split_text(text: str, size: int) -> tuple[str, ...]:
    """Split into pieces of `size` Unicode characters (no pieces for "")."""
    return tuple(text[start : start + size] for start in range(0, len(text), size))


@dataclass(frozen=True)
class PlannedToolCall:
    name: str
    arguments: str
    pieces: tuple[str, ...]


@dataclass(frozen=True)
class Generation:
    """Everything a wire module needs to render one successful answer."""

    digest: str
    model: str
    text: str
    text_pieces: tuple[str, ...]
    tool_calls: tuple[PlannedToolCall, ...]
    omit_usage: bool
    text_field: str | None = None  # where a stream carries the text (Step.text_field)
    start_text_chars: int = 0  # Anthropic: leading text sent in content_block_start

    @property
    def emitted_text(self) -> str:
        """Text plus all tool-call arguments: what output tokens are counted from."""
        return self.text + "".join(call.arguments for call in self.tool_calls)


def request_model(request: Mapping[str, Any]) -> str:
    model = request.get("model")
    return model if isinstance(model, str) and model else DEFAULT_MODEL


def plan_generation(api: Api, request: Mapping[str, Any], step: Step) -> Generation:
    digest = content_digest(api, request)
    if step.text is not None:
        text = step.text
    elif step.chunks is not None:
        text = "".join(step.chunks)
    else:
        text = "" if step.tool_calls else default_reply(digest)
    calls = tuple(
        PlannedToolCall(
            name=call.name,
            arguments=call.arguments,
            pieces=call.chunks if call.chunks is not None else split_text(call.arguments, step.chunk_size),
        )
        for call in step.tool_calls
    )
    return Generation(
        digest=digest,
        model=request_model(request),
        text=text,
        text_pieces=step.chunks if step.chunks is not None else split_text(text, step.chunk_size),
        tool_calls=calls,
        omit_usage=step.omit_usage,
        text_field=step.text_field,
        start_text_chars=step.start_text_chars,
    )
