"""Deterministic token usage for mock answers.

`compute_usage` is the single pure function every wire module calls, so prompt-cache
emulation (cached / written token counts) can later be added in exactly one place.

Counting rule: ``tokens = max(1, ceil(characters / 4))`` where input characters are
the Unicode characters of all text in the request's content fields (see
`content.content_text_chars`) and output characters are those of the emitted text
plus every tool call's arguments string.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .content import Api, content_text_chars


def estimate_tokens(chars: int) -> int:
    return max(1, math.ceil(chars / 4))


def _embedding_input_tokens(request: Mapping[str, Any]) -> int:
    """Strings count ceil(chars / 4); pre-tokenised inputs count one per token id."""
    value = request.get("input")
    items = value if isinstance(value, list) else [value]
    chars = sum(len(item) for item in items if isinstance(item, str))
    token_ids = sum(1 for item in items if isinstance(item, int))
    token_ids += sum(len(item) for item in items if isinstance(item, list))
    return max(1, math.ceil(chars / 4) + token_ids)


def _chat_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _responses_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def _anthropic_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": output_tokens,
        "service_tier": "standard",
    }


def compute_usage(api: Api, request: Mapping[str, Any], output_text: str = "") -> dict[str, Any]:
    """The provider-shaped ``usage`` object for answering `request` with `output_text`."""
    if api == "openai_embeddings":
        tokens = _embedding_input_tokens(request)
        return {"prompt_tokens": tokens, "total_tokens": tokens}
    input_tokens = estimate_tokens(content_text_chars(api, request))
    output_tokens = estimate_tokens(len(output_text))
    if api == "openai_chat":
        return _chat_usage(input_tokens, output_tokens)
    if api == "openai_responses":
        return _responses_usage(input_tokens, output_tokens)
    return _anthropic_usage(input_tokens, output_tokens)
