"""Text a stream carries outside its folded deltas — a finished item, the final response
object, a message start with content, a chunk's logprobs or a member no one has named yet —
is read exactly as the same text in a non-stream answer: decoded (base64, hex...),
normalised, and joined across strings. (Such events were once only scanned raw, so a value
split across two parts of `response.completed`, or the base64 of one in an MCP call's
output, reached the client.) And a stream that leaves the order a client reads it in — blocks
started in reverse, deltas that go back to an earlier field — is not released."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json, windowed_profiles

SECRET = "wg-stream-event-Qv7319zK"
A, B = SECRET[:10], SECRET[10:]
B64 = base64.b64encode(SECRET.encode()).decode()


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("stream-event-text", secrets_=[SECRET]) as started:
        yield started


@pytest.fixture(scope="module")
def windowed(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("stream-event-text-w", secrets_=[SECRET], profiles=windowed_profiles(mock.url)) as started:
        yield started


def _event(name: str | None, data: dict[str, Any]) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _response(output: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-5",
        "output": output,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }


def _message(*texts: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": content}


def _responses_stream(*middle: dict[str, Any], final: list[dict[str, Any]]) -> list[str]:
    events = [_event("response.created", {"type": "response.created", "response": _response([], "in_progress")})]
    events += [_event(str(e["type"]), e) for e in middle]
    events.append(_event("response.completed", {"type": "response.completed", "response": _response(final)}))
    return events


def _chat_chunk(**extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": "fine"}, "finish_reason": None, "logprobs": None}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1"}
    chunk["choices"] = [{**choice, **extra.pop("choice", {})}]
    return {**chunk, **extra}


def _chat_stream(chunk: dict[str, Any]) -> list[str]:
    end = _chat_chunk(choice={"delta": {}, "finish_reason": "stop"})
    return [_event(None, chunk), _event(None, end), "data: [DONE]\n\n"]


def _anthropic_stream(start_content: list[dict[str, Any]]) -> list[str]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test-model",
        "content": start_content,
        "stop_reason": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    return [
        _event("message_start", {"type": "message_start", "message": message}),
        _event(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        ),
        _event("message_stop", {"type": "message_stop"}),
    ]


STREAMS: dict[str, tuple[str, list[str]]] = {
    "responses: a value split over two parts of the final response": (
        "/v1/responses",
        _responses_stream(final=[_message(A, B)]),
    ),
    "responses: base64 of a value in a finished MCP call's output": (
        "/v1/responses",
        _responses_stream(
            {
                "type": "response.output_item.done",
                "output_index": 0,
                "item": {"type": "mcp_call", "id": "mcp_1", "name": "lookup", "output": f"stored: {B64}"},
            },
            final=[],
        ),
    ),
    "responses: hex of a value in a finished text": (
        "/v1/responses",
        _responses_stream(
            {
                "type": "response.output_text.done",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "text": SECRET.encode().hex(),
            },
            final=[],
        ),
    ),
    "chat: base64 of a value in a chunk's logprobs": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(choice={"logprobs": {"content": [{"token": B64, "logprob": -0.1, "bytes": None}]}})),
    ),
    "chat: base64 of a value in a member no one has named yet": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(annotations={"note": B64})),
    ),
    "anthropic: a value split over two blocks of message_start": (
        "/v1/messages",
        _anthropic_stream([{"type": "text", "text": A}, {"type": "text", "text": B}]),
    ),
}


def _body(route: str, sid: str) -> dict[str, Any]:
    prompt = f"mock-scenario:{sid}"
    if route == "/v1/responses":
        return {"model": "gpt-5", "stream": True, "input": prompt}
    if route == "/v1/messages":
        return {
            "model": "claude-test-model",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": prompt}],
        }
    return {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": prompt}]}


def _leaked(text: str) -> bool:
    return any(form in text for form in (SECRET, A, B, B64, SECRET.encode().hex()))


def _through(
    gateways: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]],
    mock: MockProviderServer,
    release: str,
    route: str,
    events: list[str],
) -> Any:
    """`events` as the provider's stream, sent through the buffered or the windowed gateway."""
    env, gateway = gateways[0] if release == "buffered" else gateways[1]
    sid = "se" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"raw_events": events}])
    answer = post_json(gateway, env, route, _body(route, sid))
    assert [x for x in mock.state.records() if x.scenario == sid]  # the provider answered: what it sent was judged
    return answer


@pytest.mark.parametrize("case", sorted(STREAMS))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_text_outside_the_deltas_is_read_like_a_non_stream_answer(
    gw: tuple[Env, GatewayThread],
    windowed: tuple[Env, GatewayThread],
    mock: MockProviderServer,
    case: str,
    release: str,
) -> None:
    r = _through((gw, windowed), mock, release, *STREAMS[case])
    if r.status_code == 200:  # windowed: the refusal comes as the stream's error event
        assert "response_blocked" in r.text and "secret_value" in r.text, r.text
    else:
        assert r.status_code == 403, r.text
        assert r.json()["error"]["reason_codes"] == ["secret_value"] or "secret_value" in r.text
    assert not _leaked(r.text)


def test_plain_delta_streams_still_pass(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """The control: the same streams without the value are released whole."""
    env, gateway = gw
    for route, events in (
        ("/v1/responses", _responses_stream(final=[_message("all", " good")])),
        ("/v1/chat/completions", _chat_stream(_chat_chunk())),
        ("/v1/messages", _anthropic_stream([{"type": "text", "text": "all good"}])),
    ):
        sid = "se" + uuid.uuid4().hex[:12]
        mock.state.add_scenario(sid, [{"raw_events": events}])
        r = post_json(gateway, env, route, _body(route, sid))
        assert r.status_code == 200 and "response_blocked" not in r.text, (route, r.text)


def _block_start(index: int) -> str:
    data = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
    return _event("content_block_start", data)


def _block_delta(index: int, text: str) -> str:
    data = {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}
    return _event("content_block_delta", data)


def _block_stop(index: int) -> str:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


def _anthropic_blocks(*middle: str) -> list[str]:
    start, *end = _anthropic_stream([])
    return [start, *middle, *end]


def _text_delta(content_index: int, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": "msg_1",
        "output_index": 0,
        "content_index": content_index,
        "delta": text,
    }


OUT_OF_ORDER: dict[str, tuple[str, list[str]]] = {
    "anthropic: blocks started in reverse": (
        "/v1/messages",
        _anthropic_blocks(
            _block_start(1), _block_start(0), _block_delta(0, A), _block_delta(1, B), _block_stop(0), _block_stop(1)
        ),
    ),
    "anthropic: a delta that goes back to an earlier block": (
        "/v1/messages",
        _anthropic_blocks(
            _block_start(0),
            _block_delta(0, A),
            _block_stop(0),
            _block_start(1),
            _block_delta(1, "x"),
            _block_delta(0, B),
            _block_stop(1),
        ),
    ),
    "anthropic: a delta to a block never started": ("/v1/messages", _anthropic_blocks(_block_delta(0, SECRET))),
    "responses: deltas that go back to an earlier part": (
        "/v1/responses",
        _responses_stream(_text_delta(0, A), _text_delta(1, "x"), _text_delta(0, B), final=[]),
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_ORDER))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_a_stream_out_of_order_is_not_vouched_for(
    gw: tuple[Env, GatewayThread],
    windowed: tuple[Env, GatewayThread],
    mock: MockProviderServer,
    case: str,
    release: str,
) -> None:
    """The fold joins a stream's fields by index, a client by the order things arrive; a
    stream that leaves that order (blocks started in reverse, deltas that go back) could be
    read differently by the two: it is not released."""
    r = _through((gw, windowed), mock, release, *OUT_OF_ORDER[case])
    assert "upstream_invalid_response" in r.text, r.text
    assert r.status_code != 200 or release == "windowed"
    assert SECRET not in r.text and not (A in r.text and B in r.text)


def _anthropic_text_block(delta: dict[str, Any]) -> list[str]:
    data = {"type": "content_block_delta", "index": 0, "delta": delta}
    return _anthropic_blocks(_block_start(0), _event("content_block_delta", data), _block_stop(0))


def _output_delta(**fields: Any) -> dict[str, Any]:
    return {**_text_delta(0, "hi"), "sequence_number": 1, **fields}


# Strings in delta events that no fold reads: labels (read as units once per stream), and
# members or shapes the short path does not know (read in full).
OUTSIDE_THE_FOLD: dict[str, tuple[str, list[str]]] = {
    "chat: a usage member that is text": ("/v1/chat/completions", _chat_stream(_chat_chunk(usage={"note": B64}))),
    "chat: padding": ("/v1/chat/completions", _chat_stream(_chat_chunk(obfuscation=B64))),
    "chat: the model's name": ("/v1/chat/completions", _chat_stream(_chat_chunk(model=B64))),
    "chat: tool calls as text": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(choice={"delta": {"tool_calls": B64}})),
    ),
    "chat: a tool call indexed by text": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(choice={"delta": {"tool_calls": [{"index": B64, "function": {"arguments": "{}"}}]}})),
    ),
    "chat: a delta member no one has named": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(choice={"delta": {B64: "x"}})),
    ),
    "chat: a finish reason no one has named": (
        "/v1/chat/completions",
        _chat_stream(_chat_chunk(choice={"finish_reason": B64})),
    ),
    "responses: padding": ("/v1/responses", _responses_stream(_output_delta(obfuscation=B64), final=[])),
    "responses: an item id": ("/v1/responses", _responses_stream(_output_delta(item_id=B64), final=[])),
    "responses: a delta type no one has named": (
        "/v1/responses",
        _responses_stream(_output_delta(type=f"response.{B64}.delta"), final=[]),
    ),
    "responses: a delta that is an object": (
        "/v1/responses",
        _responses_stream(_output_delta(delta={B64: 1}), final=[]),
    ),
    "anthropic: a delta type no one has named": ("/v1/messages", _anthropic_text_block({"type": B64, "text": "hi"})),
    "anthropic: a text that is an object": (
        "/v1/messages",
        _anthropic_text_block({"type": "text_delta", "text": {B64: 1}}),
    ),
    "anthropic: a ping indexed by text": (
        "/v1/messages",
        _anthropic_blocks(_event("ping", {"type": "ping", "index": B64})),
    ),
}


@pytest.mark.parametrize("case", sorted(OUTSIDE_THE_FOLD))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_strings_a_delta_event_does_not_fold_are_read_too(
    gw: tuple[Env, GatewayThread],
    windowed: tuple[Env, GatewayThread],
    mock: MockProviderServer,
    case: str,
    release: str,
) -> None:
    """A delta event takes the short path only when its shape is known whole; its labels
    are read as units, and anything else sends it down the full path."""
    r = _through((gw, windowed), mock, release, *OUTSIDE_THE_FOLD[case])
    assert B64 not in r.text, r.text
    assert "secret_value" in r.text or "upstream_invalid_response" in r.text, r.text
