"""Windowed release when a stream's fields do not behave as the window's shortcuts assume:
a tool name split over events is read whole before any of it leaves; one OpenAI choice's
text says nothing about whether another choice has ended (choices stream side by side, so
each is its own lane); and a field released whole as ended (a label, a quiet field) that
grows again ends the stream at once — the rest never leaves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client, windowed_profiles

SECRET = "wg-windowed-literal-7Hq2"
HEAD, TAIL = SECRET[:12], SECRET[12:]
FILL = " ".join(f"word{i:03d}" for i in range(60))


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = windowed_profiles(mock.url)
    with gateways(
        "windowed-fields", secrets_=[SECRET], profiles=profiles, policy_extra="stream_window_cap = 128\n"
    ) as started:
        yield started


def _chunk(*choices: dict[str, Any]) -> str:
    return "data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "choices": list(choices)}) + "\n\n"


def _choice(delta: dict[str, Any], index: int = 0, finish: str | None = None) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": finish}


def _event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **body}) + "\n\n"


CHAT_END = [_chunk(_choice({}, 0, "stop")), "data: [DONE]\n\n"]
MESSAGE_START = _event(
    "message_start",
    {
        "message": {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
    },
)
MESSAGE_END = [
    _event("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
    _event("message_stop", {}),
]


def _tool_name_split() -> list[str]:
    call = {"index": 0, "id": "call1", "type": "function", "function": {"name": HEAD, "arguments": ""}}
    return [
        _chunk(_choice({"role": "assistant", "content": None, "tool_calls": [call]})),
        _chunk(_choice({"tool_calls": [{"index": 0, "function": {"name": TAIL}}]})),
        _chunk(_choice({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps({"a": FILL})}}]})),
        *CHAT_END,
    ]


def _choice_resumes() -> list[str]:
    return [
        _chunk(
            _choice({"role": "assistant", "content": "start " + FILL[:50]}, 0),
            _choice({"role": "assistant", "content": "other " + HEAD}, 1),
        ),
        *[_chunk(_choice({"content": " " + FILL[i : i + 10]}, 0)) for i in range(0, 300, 10)],
        _chunk(_choice({"content": TAIL + " tail " + FILL[:200]}, 1)),
        _chunk(_choice({}, 0, "stop"), _choice({}, 1, "stop")),
        "data: [DONE]\n\n",
    ]


def _role_split() -> list[str]:
    return [_chunk(_choice({"role": HEAD})), _chunk(_choice({"role": TAIL, "content": FILL})), *CHAT_END]


def _anthropic_name_split() -> list[str]:
    start = {"index": 0, "content_block": {"type": "tool_use", "id": "t1", "name": HEAD, "input": {}}}
    return [
        MESSAGE_START,
        _event("content_block_start", start),
        _event("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "name": TAIL}}),
        _event(
            "content_block_delta",
            {"index": 0, "delta": {"type": "input_json_delta", "partial_json": json.dumps({"a": FILL})}},
        ),
        _event("content_block_stop", {"index": 0}),
        *MESSAGE_END,
    ]


def _send(gw: tuple[Env, GatewayThread], mock: MockProviderServer, events: list[str], anthropic: bool) -> Any:
    env, gateway = gw
    sid = "wf" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 60}])
    prompt = [{"role": "user", "content": f"mock-scenario:{sid}"}]
    if anthropic:
        path, body = "/v1/messages", {"model": "claude-x", "max_tokens": 99, "stream": True, "messages": prompt}
    else:
        path, body = "/v1/chat/completions", {"model": "gpt-4.1", "stream": True, "messages": prompt}
    return raw_client(gateway, env, uds=True).post(
        path, json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )


def _released_text(raw: bytes) -> str:
    """Every string the client could read, joined as the SDKs join deltas."""
    events, _ = sse.parse_all(raw)
    return "".join(event.data for event in events)


@pytest.mark.parametrize(
    ("shape", "anthropic"), [(_tool_name_split, False), (_choice_resumes, False), (_anthropic_name_split, True)]
)
def test_no_piece_of_a_split_value_leaves(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, shape: Any, anthropic: bool
) -> None:
    answer = _send(gw, mock, shape(), anthropic)
    assert HEAD not in answer.text and TAIL not in answer.text, answer.text[:400]
    if answer.status_code == 200:  # refused mid-stream: the protocol's error event ends it
        assert "secret_value" in answer.text or "response_blocked" in answer.text
    else:
        assert answer.status_code == 403


def test_a_label_that_grows_again_ends_the_stream(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """A provider sent `role` as two pieces: the first went out as a whole label; the second
    never does, nor anything after it."""
    answer = _send(gw, mock, _role_split(), False)
    released = _released_text(answer.content)
    assert TAIL not in released and FILL[:40] not in released
    assert "upstream_invalid_response" in released


def test_a_clean_stream_with_tool_calls_still_arrives_whole(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    call = {"index": 0, "id": "call1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    events = [
        _chunk(_choice({"role": "assistant", "content": "Let me look. " + FILL[:200]})),
        _chunk(_choice({"tool_calls": [call]})),
        _chunk(_choice({"tool_calls": [{"index": 0, "function": {"arguments": json.dumps({"city": FILL[:300]})}}]})),
        _chunk(_choice({}, 0, "tool_calls")),
        "data: [DONE]\n\n",
    ]
    answer = _send(gw, mock, events, False)
    assert answer.status_code == 200
    released = _released_text(answer.content)
    assert "get_weather" in released and released.endswith("[DONE]") and "error" not in released
