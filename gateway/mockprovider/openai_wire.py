"""OpenAI wire formats: Chat Completions, Responses, Embeddings, Models and errors.

Pure functions from (request JSON, `Generation`, prompt-cache outcome) to a `Reply`;
no I/O.  Shapes and event sequences follow /work/shared/WIRE-FORMATS.md sections 1
and 2; cached tokens ride in ``usage`` (the final chat chunk with ``include_usage``,
``response.completed`` when streaming Responses).
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .cache import NO_CACHE, CacheUsage
from .content import FIXED_CREATED, Generation, canonical_json, derive_id, request_model
from .reply import SSE_DONE, Reply, WireError, json_reply, sse_data, sse_named, sse_reply
from .usage import compute_usage

SYSTEM_FINGERPRINT = "fp_mock"
DEFAULT_EMBEDDING_DIMENSIONS = 16
MAX_EMBEDDING_DIMENSIONS = 8192
# The models `GET /v1/models` lists (any model name is answered; these are what a gateway
# in front of the mock discovers, including those `wiregate init`'s mock profiles serve).
MODEL_IDS = (
    "gpt-4.1-mini",
    "gpt-5-mini",
    "text-embedding-3-small",
    "claude-sonnet-4-6",
    "mock-gpt-1",
    "mock-gpt-2",
    "mock-embed-1",
    "mock-claude-1",
    "mock-claude-2",
)

# status -> (error.type, error.code)
_ERROR_KINDS: Mapping[int, tuple[str, str | None]] = MappingProxyType(
    {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        403: ("permission_error", None),
        404: ("invalid_request_error", "not_found"),
        409: ("conflict_error", None),
        422: ("invalid_request_error", None),
        429: ("requests", "rate_limit_exceeded"),
    }
)


# -- errors -------------------------------------------------------------------


def error_payload(status: int, message: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param": null, "code"}}`` for `status`."""
    default_kind = ("server_error", None) if status >= 500 else ("invalid_request_error", None)
    error_type, code = _ERROR_KINDS.get(status, default_kind)
    return {
        "error": {
            "message": message if message is not None else f"Mock error: HTTP {status}.",
            "type": error_type,
            "param": None,
            "code": code,
        }
    }


# -- chat completions ---------------------------------------------------------


def _chat_call_ids(gen: Generation) -> list[str]:
    return [derive_id("call_", gen.digest, f"chat-call-{i}") for i in range(len(gen.tool_calls))]


def _chat_content(gen: Generation) -> str | None:
    return None if gen.tool_calls and not gen.text else gen.text


def _chat_finish_reason(gen: Generation) -> str:
    return "tool_calls" if gen.tool_calls else "stop"


def _chat_base(gen: Generation, obj: str) -> dict[str, Any]:
    return {
        "id": derive_id("chatcmpl-", gen.digest, "chat-completion"),
        "object": obj,
        "created": FIXED_CREATED,
        "model": gen.model,
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def chat_completion(request: Mapping[str, Any], gen: Generation, cache: CacheUsage = NO_CACHE) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": _chat_content(gen),
        "refusal": None,
        "annotations": [],
    }
    if gen.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call_id, call in zip(_chat_call_ids(gen), gen.tool_calls, strict=True)
        ]
    body = _chat_base(gen, "chat.completion")
    body["choices"] = [
        {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": _chat_finish_reason(gen),
        }
    ]
    if not gen.omit_usage:
        body["usage"] = compute_usage("openai_chat", request, gen.emitted_text, cache)
    return body


def _chat_deltas(gen: Generation) -> list[dict[str, Any]]:
    """The ``delta`` objects of a chat stream, in order (without the finish chunk)."""
    role_content = "" if _chat_content(gen) is not None else None
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": role_content, "refusal": None}]
    deltas.extend(_text_delta(gen.text_field or "content", piece) for piece in gen.text_pieces)
    for index, (call_id, call) in enumerate(zip(_chat_call_ids(gen), gen.tool_calls, strict=True)):
        head = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        deltas.extend({"tool_calls": [{"index": index, "function": {"arguments": piece}}]} for piece in call.pieces)
    return deltas


def _text_delta(field: str, piece: str) -> dict[str, Any]:
    """A delta carrying `piece` in `field` (`audio.transcript` nests one level)."""
    outer, _, inner = field.partition(".")
    return {outer: {inner: piece}} if inner else {outer: piece}


def chat_chunks(request: Mapping[str, Any], gen: Generation, cache: CacheUsage = NO_CACHE) -> list[bytes]:
    stream_options = request.get("stream_options")
    include_usage = isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    base = _chat_base(gen, "chat.completion.chunk")

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        payload = {**base, "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return sse_data(payload)

    def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    events = [chunk([choice(delta)]) for delta in _chat_deltas(gen)]
    events.append(chunk([choice({}, _chat_finish_reason(gen))]))
    if include_usage and not gen.omit_usage:
        events.append(chunk([], compute_usage("openai_chat", request, gen.emitted_text, cache)))
    events.append(SSE_DONE)
    return events


def chat_reply(request: Mapping[str, Any], gen: Generation, *, stream: bool, cache: CacheUsage = NO_CACHE) -> Reply:
    if stream:
        return sse_reply(chat_chunks(request, gen, cache))
    return json_reply(chat_completion(request, gen, cache))


# -- responses ----------------------------------------------------------------


class _ResponseIds:
    def __init__(self, gen: Generation) -> None:
        self.response = derive_id("resp_", gen.digest, "response", 32)
        self.message = derive_id("msg_", gen.digest, "response-message", 32)
        self.function_items = [
            derive_id("fc_", gen.digest, f"response-function-{i}", 32) for i in range(len(gen.tool_calls))
        ]
        self.call_ids = [derive_id("call_", gen.digest, f"response-call-{i}") for i in range(len(gen.tool_calls))]


def _has_message_item(gen: Generation) -> bool:
    return bool(gen.text) or not gen.tool_calls


def _output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(ids: _ResponseIds, text: str | None) -> dict[str, Any]:
    """The message output item; `text` None means the in-progress (empty) form."""
    return {
        "id": ids.message,
        "type": "message",
        "status": "in_progress" if text is None else "completed",
        "role": "assistant",
        "content": [] if text is None else [_output_text_part(text)],
    }


def _function_item(ids: _ResponseIds, index: int, gen: Generation, *, done: bool) -> dict[str, Any]:
    call = gen.tool_calls[index]
    return {
        "id": ids.function_items[index],
        "type": "function_call",
        "status": "completed" if done else "in_progress",
        "call_id": ids.call_ids[index],
        "name": call.name,
        "arguments": call.arguments if done else "",
    }


def _final_output(ids: _ResponseIds, gen: Generation) -> list[dict[str, Any]]:
    output = [_message_item(ids, gen.text)] if _has_message_item(gen) else []
    output.extend(_function_item(ids, i, gen, done=True) for i in range(len(gen.tool_calls)))
    return output


def _response_object(
    request: Mapping[str, Any],
    gen: Generation,
    ids: _ResponseIds,
    *,
    completed: bool,
    cache: CacheUsage = NO_CACHE,
) -> dict[str, Any]:
    response: dict[str, Any] = {
        "id": ids.response,
        "object": "response",
        "created_at": FIXED_CREATED,
        "status": "completed" if completed else "in_progress",
        "completed_at": FIXED_CREATED if completed else None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "metadata": request.get("metadata") or {},
        "model": gen.model,
        "output": _final_output(ids, gen) if completed else [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "store": request.get("store", True),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "truncation": request.get("truncation", "disabled"),
    }
    if not completed:
        response["usage"] = None
    elif not gen.omit_usage:
        response["usage"] = compute_usage("openai_responses", request, gen.emitted_text, cache)
    return response


class _ResponsesEventLog:
    """Collects named Responses events, numbering them with `sequence_number`."""

    def __init__(self) -> None:
        self.events: list[bytes] = []

    def emit(self, event_type: str, **fields: Any) -> None:
        payload = {"type": event_type, "sequence_number": len(self.events), **fields}
        self.events.append(sse_named(event_type, payload))


def _emit_message_item(log: _ResponsesEventLog, ids: _ResponseIds, gen: Generation) -> None:
    position = {"item_id": ids.message, "output_index": 0, "content_index": 0}
    log.emit("response.output_item.added", output_index=0, item=_message_item(ids, None))
    log.emit("response.content_part.added", **position, part=_output_text_part(""))
    family = gen.text_field or "output_text"
    for piece in gen.text_pieces:
        if family == "output_text":
            log.emit("response.output_text.delta", **position, delta=piece, logprobs=[])
        else:
            log.emit(f"response.{family}.delta", **position, delta=piece)
    log.emit("response.output_text.done", **position, text=gen.text, logprobs=[])
    log.emit("response.content_part.done", **position, part=_output_text_part(gen.text))
    log.emit("response.output_item.done", output_index=0, item=_message_item(ids, gen.text))


def _emit_function_item(
    log: _ResponsesEventLog, ids: _ResponseIds, gen: Generation, index: int, output_index: int
) -> None:
    call = gen.tool_calls[index]
    position = {"item_id": ids.function_items[index], "output_index": output_index}
    log.emit(
        "response.output_item.added",
        output_index=output_index,
        item=_function_item(ids, index, gen, done=False),
    )
    for piece in call.pieces:
        log.emit("response.function_call_arguments.delta", **position, delta=piece)
    log.emit(
        "response.function_call_arguments.done",
        **position,
        name=call.name,
        arguments=call.arguments,
    )
    log.emit(
        "response.output_item.done",
        output_index=output_index,
        item=_function_item(ids, index, gen, done=True),
    )


def responses_events(request: Mapping[str, Any], gen: Generation, cache: CacheUsage = NO_CACHE) -> list[bytes]:
    ids = _ResponseIds(gen)
    log = _ResponsesEventLog()
    in_progress = _response_object(request, gen, ids, completed=False)
    log.emit("response.created", response=in_progress)
    log.emit("response.in_progress", response=in_progress)
    first_function_index = 0
    if _has_message_item(gen):
        _emit_message_item(log, ids, gen)
        first_function_index = 1
    for index in range(len(gen.tool_calls)):
        _emit_function_item(log, ids, gen, index, first_function_index + index)
    completed = _response_object(request, gen, ids, completed=True, cache=cache)
    log.emit("response.completed", response=completed)
    return log.events


def responses_reply(
    request: Mapping[str, Any], gen: Generation, *, stream: bool, cache: CacheUsage = NO_CACHE
) -> Reply:
    if stream:
        return sse_reply(responses_events(request, gen, cache))
    return json_reply(_response_object(request, gen, _ResponseIds(gen), completed=True, cache=cache))


# -- embeddings ---------------------------------------------------------------

EmbeddingInput = str | list[int]


def _is_token_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, int) and not isinstance(item, bool) for item in value)


def _embedding_inputs(value: object) -> list[EmbeddingInput]:
    """Normalise string | [string] | [int] | [[int]] into a list of single inputs."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(item, str) for item in value):
            return list(value)
        if _is_token_list(value):
            return [list(value)]
        if all(_is_token_list(item) for item in value):
            return [list(item) for item in value]
    raise WireError(
        400,
        "'input' must be a string, a non-empty list of strings, a list of token ids or a list of token-id lists",
    )


def _embedding_dimensions(request: Mapping[str, Any]) -> int:
    value = request.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(400, "'dimensions' must be an integer")
    if not 1 <= value <= MAX_EMBEDDING_DIMENSIONS:
        raise WireError(400, f"'dimensions' must be between 1 and {MAX_EMBEDDING_DIMENSIONS}")
    return value


def _to_float32(value: float) -> float:
    result: float = struct.unpack("<f", struct.pack("<f", value))[0]
    return result


def embedding_vector(item: EmbeddingInput, dimensions: int) -> list[float]:
    """A unit-length vector derived from SHA-256 of the input, exact in float32."""
    seed = hashlib.sha256(canonical_json(item)).digest()
    raw: list[float] = []
    counter = 0
    while len(raw) < dimensions:
        block = hashlib.sha256(seed + counter.to_bytes(4, "big")).digest()
        raw.extend(word / 2**31 - 1.0 for word in struct.unpack(">8I", block))
        counter += 1
    raw = raw[:dimensions]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [_to_float32(x / norm) for x in raw]


def _encode_embedding(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embeddings_reply(request: Mapping[str, Any], *, omit_usage: bool) -> Reply:
    inputs = _embedding_inputs(request.get("input"))
    dimensions = _embedding_dimensions(request)
    encoding_format = request.get("encoding_format") or "float"
    if encoding_format not in ("float", "base64"):
        raise WireError(400, "'encoding_format' must be 'float' or 'base64'")
    body: dict[str, Any] = {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": index,
                "embedding": _encode_embedding(embedding_vector(item, dimensions), encoding_format),
            }
            for index, item in enumerate(inputs)
        ],
        "model": request_model(request),
    }
    if not omit_usage:
        body["usage"] = compute_usage("openai_embeddings", request)
    return json_reply(body)


# -- models -------------------------------------------------------------------


def models_reply() -> Reply:
    return json_reply(
        {
            "object": "list",
            "data": [
                {"id": model_id, "object": "model", "created": FIXED_CREATED, "owned_by": "mock"}
                for model_id in MODEL_IDS
            ],
        }
    )
