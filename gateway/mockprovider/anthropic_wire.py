"""Anthropic Messages wire format: non-stream message, SSE event sequence, errors.

Pure functions from (request JSON, `Generation`, prompt-cache outcome) to a `Reply`;
no I/O.  Shapes and event order follow /work/shared/WIRE-FORMATS.md section 3: the
cache counts ride in ``usage`` and, when streaming, in ``message_start``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .cache import NO_CACHE, CacheUsage
from .content import Generation, derive_id, split_text
from .reply import Reply, WireError, json_reply, sse_named, sse_reply
from .usage import compute_usage

_ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "invalid_request_error",
        401: "authentication_error",
        402: "billing_error",
        403: "permission_error",
        404: "not_found_error",
        409: "conflict_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        504: "timeout_error",
        529: "overloaded_error",
    }
)

_REQUIRED_USAGE_FIELDS = ("input_tokens", "output_tokens")
_DELTA_USAGE_FIELDS = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)


def error_type_for(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_payload(status: int, message: str | None, request_id: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}`` for `status`."""
    return {
        "type": "error",
        "error": {
            "type": error_type_for(status),
            "message": message if message is not None else f"Mock error: HTTP {status}.",
        },
        "request_id": request_id,
    }


def _message_id(gen: Generation) -> str:
    return derive_id("msg_", gen.digest, "anthropic-message")


def _tool_use_id(gen: Generation, index: int) -> str:
    return derive_id("toolu_", gen.digest, f"anthropic-tool-{index}")


def _has_text_block(gen: Generation) -> bool:
    return bool(gen.text) or not gen.tool_calls


def _stop_reason(gen: Generation) -> str:
    return "tool_use" if gen.tool_calls else "end_turn"


def _usage(request: Mapping[str, Any], gen: Generation, cache: CacheUsage) -> dict[str, Any]:
    usage = compute_usage("anthropic", request, gen.emitted_text, cache)
    if gen.omit_usage:
        # The SDK requires input_tokens and output_tokens; everything else is optional.
        return {name: usage[name] for name in _REQUIRED_USAGE_FIELDS}
    return usage


def _tool_input(arguments: str, name: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise WireError(
            500,
            f"mock scenario error: arguments of tool call {name!r} are not a JSON object, "
            "which a non-streaming Anthropic tool_use block cannot carry",
        )
    return value


def message(request: Mapping[str, Any], gen: Generation, cache: CacheUsage = NO_CACHE) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if _has_text_block(gen):
        content.append({"type": "text", "text": gen.text})
    content.extend(
        {
            "type": "tool_use",
            "id": _tool_use_id(gen, index),
            "name": call.name,
            "input": _tool_input(call.arguments, call.name),
        }
        for index, call in enumerate(gen.tool_calls)
    )
    return {
        "id": _message_id(gen),
        "type": "message",
        "role": "assistant",
        "model": gen.model,
        "content": content,
        "stop_reason": _stop_reason(gen),
        "stop_sequence": None,
        "usage": _usage(request, gen, cache),
    }


class _EventLog:
    """Collects named Anthropic events; sends one ``ping`` after the first block start."""

    def __init__(self) -> None:
        self.events: list[bytes] = []
        self._pinged = False
        self._next_index = 0

    def emit(self, event_type: str, **fields: Any) -> None:
        self.events.append(sse_named(event_type, {"type": event_type, **fields}))

    def block(self, start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        index = self._next_index
        self._next_index += 1
        self.emit("content_block_start", index=index, content_block=start)
        if not self._pinged:
            self.emit("ping")
            self._pinged = True
        for delta in deltas:
            self.emit("content_block_delta", index=index, delta=delta)
        self.emit("content_block_stop", index=index)


def _delta_usage(usage: Mapping[str, Any], gen: Generation) -> dict[str, Any]:
    """Cumulative ``message_delta`` usage: only the required output count if omitted."""
    fields = ("output_tokens",) if gen.omit_usage else _DELTA_USAGE_FIELDS
    return {name: usage[name] for name in fields}


def stream_events(request: Mapping[str, Any], gen: Generation, cache: CacheUsage = NO_CACHE) -> list[bytes]:
    usage = _usage(request, gen, cache)
    log = _EventLog()
    log.emit(
        "message_start",
        message={
            "id": _message_id(gen),
            "type": "message",
            "role": "assistant",
            "model": gen.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1},
        },
    )
    if _has_text_block(gen):
        field = gen.text_field or "text"
        head = gen.text[: gen.start_text_chars]
        pieces = gen.text_pieces
        if head:  # the rest in pieces of the same size as the step asked for
            size = max(len(p) for p in gen.text_pieces)
            pieces = split_text(gen.text[len(head) :], size)
        start: dict[str, Any] = {"type": field, field: head}
        if field == "thinking":
            start["signature"] = ""
        log.block(start, [{"type": f"{field}_delta", field: piece} for piece in pieces])
    for index, call in enumerate(gen.tool_calls):
        log.block(
            {"type": "tool_use", "id": _tool_use_id(gen, index), "name": call.name, "input": {}},
            [{"type": "input_json_delta", "partial_json": piece} for piece in call.pieces],
        )
    log.emit(
        "message_delta",
        delta={"stop_reason": _stop_reason(gen), "stop_sequence": None},
        usage=_delta_usage(usage, gen),
    )
    log.emit("message_stop")
    return log.events


def messages_reply(request: Mapping[str, Any], gen: Generation, *, stream: bool, cache: CacheUsage = NO_CACHE) -> Reply:
    if stream:
        return sse_reply(stream_events(request, gen, cache))
    return json_reply(message(request, gen, cache))


def models_reply(model_ids: tuple[str, ...]) -> Reply:
    """Anthropic's model list (one page holding every model)."""
    data = [
        {"type": "model", "id": mid, "display_name": mid, "created_at": "2025-01-01T00:00:00Z"} for mid in model_ids
    ]
    return json_reply(
        {
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )
