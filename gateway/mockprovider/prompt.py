"""How a request's prompt splits into cacheable units, and what each unit costs.

Input token counts and prompt caching share one decomposition, so that reported
usage always adds up: a request's input tokens are the sum of its units' tokens, and
cache reads and writes are prefix sums of the same units.

* **Anthropic** -- *blocks* in the order tools -> system -> messages: each tool object,
  each ``system`` element (a string is one text block), each message's content element
  (a string is one text block).  A block's text is: ``text`` for text blocks; the
  canonical JSON of the tool for tools; the canonical JSON of ``input`` plus ``name``
  for ``tool_use``; the text of ``tool_result`` content (a string, or its text blocks);
  the canonical JSON of the block for anything else.
* **OpenAI** -- *segments*: all tools as one segment (canonical JSON), then (Responses)
  ``instructions``, then each chat message / Responses input item (a string input is
  one user message), counted by the text they hold (`content.text_chars`).

A unit costs ``max(1, ceil(characters / 4))`` tokens.  Its canonical bytes (what the
prefix hash covers) have every cache marker removed and string shorthands expanded,
so ``cache_control`` / ``prompt_cache_breakpoint`` never change a hash.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .cache import (
    AnthropicCacheQuery,
    Breakpoint,
    BreakpointError,
    PromptPrefixes,
    Ttl,
    prefix_hashes,
    prefix_totals,
    resolve_breakpoints,
)
from .content import (
    Api,
    canonical_content,
    canonical_json,
    canonical_text,
    request_model,
    strip_cache_markers,
    text_chars,
)

OpenAIApi = Literal["openai_chat", "openai_responses"]


def estimate_tokens(chars: int) -> int:
    """The mock's tokenizer: ``max(1, ceil(chars / 4))``."""
    return max(1, math.ceil(chars / 4))


@dataclass(frozen=True)
class PromptUnit:
    """One cacheable unit: its canonical bytes (hashed) and its token count."""

    canonical: bytes
    tokens: int


def _prefixes(namespace: Any, units: tuple[PromptUnit, ...]) -> PromptPrefixes:
    return PromptPrefixes(
        hashes=prefix_hashes(canonical_json(namespace), (unit.canonical for unit in units)),
        tokens=prefix_totals(unit.tokens for unit in units),
    )


# -- Anthropic ------------------------------------------------------------------------

_Section = Literal["tools", "system", "messages"]


@dataclass(frozen=True)
class _Block:
    section: _Section
    role: str | None
    path: str
    raw: Any


def _text_block(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def _anthropic_blocks(request: Mapping[str, Any]) -> Iterator[_Block]:
    tools = request.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            yield _Block("tools", None, f"tools.{index}", tool)
    system = request.get("system")
    if isinstance(system, str):
        yield _Block("system", None, "system", _text_block(system))
    elif isinstance(system, list):
        for index, block in enumerate(system):
            yield _Block("system", None, f"system.{index}", block)
    messages = request.get("messages")
    if not isinstance(messages, list):
        return
    for m_index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role") if isinstance(message.get("role"), str) else None
        content = message.get("content")
        if isinstance(content, str):
            yield _Block("messages", role, f"messages.{m_index}.content", _text_block(content))
        elif isinstance(content, list):
            for c_index, block in enumerate(content):
                yield _Block("messages", role, f"messages.{m_index}.content.{c_index}", block)


def _str_len(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


def _tool_result_chars(content: Any) -> int:
    if isinstance(content, list):
        return sum(
            _str_len(item.get("text")) for item in content if isinstance(item, dict) and item.get("type") == "text"
        )
    return _str_len(content)


def anthropic_block_chars(section: _Section, block: Any) -> int:
    """Characters of a block's text content (`block` already without cache markers)."""
    if section == "tools" or not isinstance(block, dict):
        return len(canonical_text(block))
    kind = block.get("type")
    if kind == "text":
        return _str_len(block.get("text"))
    if kind == "tool_use":
        return len(canonical_text(block.get("input", {}))) + _str_len(block.get("name"))
    if kind == "tool_result":
        return _tool_result_chars(block.get("content"))
    return len(canonical_text(block))


def _anthropic_unit(block: _Block) -> PromptUnit:
    stripped = strip_cache_markers(block.raw)
    return PromptUnit(
        canonical=canonical_json([block.section, block.role, stripped]),
        tokens=estimate_tokens(anthropic_block_chars(block.section, stripped)),
    )


def anthropic_units(request: Mapping[str, Any]) -> tuple[PromptUnit, ...]:
    return tuple(_anthropic_unit(block) for block in _anthropic_blocks(request))


def parse_cache_control(value: Any, where: str) -> Ttl | None:
    """The TTL of a ``cache_control`` value (None when absent); `BreakpointError` if invalid."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise BreakpointError(f"{where}.cache_control: 'type' must be 'ephemeral'")
    ttl = value.get("ttl", "5m")
    if ttl == "5m":
        return "5m"
    if ttl == "1h":
        return "1h"
    raise BreakpointError(f"{where}.cache_control: 'ttl' must be '5m' or '1h'")


def anthropic_breakpoints(request: Mapping[str, Any]) -> tuple[Breakpoint, ...]:
    """The request's breakpoints (explicit and automatic), validated."""
    explicit: list[Breakpoint] = []
    nested: list[tuple[float, Ttl]] = []
    count = 0
    for position, block in enumerate(_anthropic_blocks(request)):
        count = position + 1
        control = block.raw.get("cache_control") if isinstance(block.raw, dict) else None
        ttl = parse_cache_control(control, block.path)
        if ttl is not None:
            if block.section == "tools" and block.raw.get("defer_loading") is True:
                raise BreakpointError(f"{block.path}: a tool cannot have both defer_loading=true and cache_control set")
            explicit.append(Breakpoint(position, ttl))
        if isinstance(block.raw, dict) and block.section != "tools":
            nested += [(position - 0.5, inner) for inner in _inner_breakpoints(block.raw, block.path)]
    automatic = parse_cache_control(request.get("cache_control"), "request")
    return resolve_breakpoints(explicit, automatic, count, nested)


def _inner_breakpoints(block: Mapping[str, Any], where: str) -> list[Ttl]:
    """TTLs of the markers on blocks nested in a block (a tool result's or search result's
    content, a document's `source.content`), in order."""
    out: list[Ttl] = []
    source = block.get("source")
    source_content = source.get("content") if isinstance(source, dict) else None
    for key, inner in (("content", block.get("content")), ("source.content", source_content)):
        if not isinstance(inner, list):
            continue
        for index, item in enumerate(inner):
            if isinstance(item, dict):
                out += _inner_breakpoints(item, f"{where}.{key}.{index}")
                ttl = parse_cache_control(item.get("cache_control"), f"{where}.{key}.{index}")
                if ttl is not None:
                    out.append(ttl)
    return out


def anthropic_cache_query(request: Mapping[str, Any], workspace: str) -> AnthropicCacheQuery:
    """Prefix hashes (isolated per model and API key) and breakpoints of a request."""
    namespace = ["anthropic", request_model(request), workspace]
    return AnthropicCacheQuery(
        prefixes=_prefixes(namespace, anthropic_units(request)),
        breakpoints=anthropic_breakpoints(request),
    )


# -- OpenAI ---------------------------------------------------------------------------

_ITEM_FIELD: Mapping[OpenAIApi, str] = MappingProxyType({"openai_chat": "messages", "openai_responses": "input"})


def _segment(kind: str, value: Any, chars: int) -> PromptUnit:
    return PromptUnit(canonical=canonical_json([kind, value]), tokens=estimate_tokens(chars))


def openai_units(api: OpenAIApi, request: Mapping[str, Any]) -> tuple[PromptUnit, ...]:
    content = canonical_content(api, request)
    units: list[PromptUnit] = []
    tools = content.get("tools")
    if tools:
        units.append(_segment("tools", tools, len(canonical_text(tools))))
    instructions = content.get("instructions")  # a content field of Responses only
    if instructions is not None:
        units.append(_segment("instructions", instructions, text_chars(instructions, "instructions")))
    field = _ITEM_FIELD[api]
    items = content.get(field)
    if isinstance(items, list):
        units.extend(_segment(field, item, text_chars(item, field)) for item in items)
    elif items is not None:
        units.append(_segment(field, items, text_chars(items, field)))
    return tuple(units)


def openai_cache_query(api: OpenAIApi, request: Mapping[str, Any], workspace: str) -> PromptPrefixes:
    """Prefix hashes keyed by (API key, model, ``prompt_cache_key``) and token totals."""
    cache_key = request.get("prompt_cache_key")
    namespace = [
        "openai",
        request_model(request),
        workspace,
        cache_key if isinstance(cache_key, str) else "",
    ]
    return _prefixes(namespace, openai_units(api, request))


# -- totals ---------------------------------------------------------------------------


def prompt_tokens(api: Api, request: Mapping[str, Any]) -> int:
    """Input tokens of a chat / responses / messages request: the sum over its units."""
    if api == "anthropic":
        units = anthropic_units(request)
    elif api == "openai_chat" or api == "openai_responses":
        units = openai_units(api, request)
    else:
        raise ValueError(f"{api} has no prompt units")
    return sum(unit.tokens for unit in units)
