"""Deterministic token usage for mock answers.

`compute_usage` is the single pure function every wire module calls; the prompt-cache
outcome of the request (`cache.CacheUsage`, decided by `MockState`) is passed in.

Counting rule: ``tokens = max(1, ceil(characters / 4))`` per prompt unit, and input
tokens are the sum over the request's units (see `prompt`), so cached and written
counts (prefix sums of the same units) always fit inside the total.  Output tokens
count the emitted text plus every tool call's arguments string.

* OpenAI: ``prompt_tokens`` / ``input_tokens`` include the cached tokens, which are
  reported in ``*_tokens_details.cached_tokens`` (``cache_write_tokens`` stays 0:
  implicit caching has no write charge).
* Anthropic: ``input_tokens`` excludes them; ``input_tokens + cache_read_input_tokens
  + cache_creation_input_tokens`` is the total.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .cache import NO_CACHE, CacheUsage
from .content import Api
from .prompt import estimate_tokens, prompt_tokens

__all__ = ["compute_usage", "estimate_tokens"]


def _embedding_input_tokens(request: Mapping[str, Any]) -> int:
    """Strings count ceil(chars / 4); pre-tokenised inputs count one per token id."""
    value = request.get("input")
    items = value if isinstance(value, list) else [value]
    chars = sum(len(item) for item in items if isinstance(item, str))
    token_ids = sum(1 for item in items if isinstance(item, int))
    token_ids += sum(len(item) for item in items if isinstance(item, list))
    return max(1, math.ceil(chars / 4) + token_ids)


def _chat_usage(input_tokens: int, output_tokens: int, cache: CacheUsage) -> dict[str, Any]:
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "prompt_tokens_details": {
            "cached_tokens": cache.read_tokens,
            "cache_write_tokens": cache.write_tokens,
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _responses_usage(input_tokens: int, output_tokens: int, cache: CacheUsage) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": cache.read_tokens,
            "cache_write_tokens": cache.write_tokens,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _anthropic_usage(total_input: int, output_tokens: int, cache: CacheUsage) -> dict[str, Any]:
    return {
        "input_tokens": total_input - cache.read_tokens - cache.write_tokens,
        "cache_creation_input_tokens": cache.write_tokens,
        "cache_read_input_tokens": cache.read_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": cache.write_5m_tokens,
            "ephemeral_1h_input_tokens": cache.write_1h_tokens,
        },
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def compute_usage(
    api: Api,
    request: Mapping[str, Any],
    output_text: str = "",
    cache: CacheUsage = NO_CACHE,
) -> dict[str, Any]:
    """The provider-shaped ``usage`` object for answering `request` with `output_text`,
    given the request's prompt-cache outcome `cache` (ignored for embeddings)."""
    if api == "openai_embeddings":
        tokens = _embedding_input_tokens(request)
        return {"prompt_tokens": tokens, "total_tokens": tokens}
    input_tokens = prompt_tokens(api, request)
    if cache.read_tokens + cache.write_tokens > input_tokens:
        raise ValueError("cached and written tokens exceed the request's input tokens")
    output_tokens = estimate_tokens(len(output_text))
    if api == "openai_chat":
        return _chat_usage(input_tokens, output_tokens, cache)
    if api == "openai_responses":
        return _responses_usage(input_tokens, output_tokens, cache)
    return _anthropic_usage(input_tokens, output_tokens, cache)
