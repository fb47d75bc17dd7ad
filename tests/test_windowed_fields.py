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

import anthropic
import openai
import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import (
    Env,
    GatewayThread,
    anthropic_client,
    direct_anthropic,
    direct_openai,
    openai_client,
    raw_client,
    windowed_profiles,
)

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


def _interleaved_calls(first: str, resumed: str) -> list[str]:
    """Two parallel tool calls whose argument fragments interleave (OpenAI allows it): call
    0 pauses while call 1 streams more than a window, then goes on."""
    calls = [
        {"index": i, "id": f"call{i}", "type": "function", "function": {"name": "write_file", "arguments": ""}}
        for i in (0, 1)
    ]
    return [
        _chunk(_choice({"role": "assistant", "content": None, "tool_calls": calls[:1]})),
        _chunk(_choice({"tool_calls": calls[1:]})),
        _chunk(_choice({"tool_calls": [{"index": 0, "function": {"arguments": '{"text": "' + first}}]})),
        *[
            _chunk(_choice({"tool_calls": [{"index": 1, "function": {"arguments": piece}}]}))
            for piece in ('{"text": "', FILL[:150], FILL[150:300], '"}')
        ],
        _chunk(_choice({"tool_calls": [{"index": 0, "function": {"arguments": resumed + " " + FILL[:200] + '"}'}}]})),
        _chunk(_choice({}, 0, "tool_calls")),
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


def _responses_label_family() -> list[str]:
    """A delta family no one has named, under a structural field's name: its text is held
    like any delta's, never sent whole as a label."""
    created = {"response": {"id": "r1", "object": "response", "status": "in_progress", "output": []}}
    done = {
        "response": {
            "id": "r1",
            "object": "response",
            "status": "completed",
            "output": [],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        }
    }

    def delta(kind: str, n: int, text: str) -> str:  # no content index: the family's name ends the path
        return _event(kind, {"sequence_number": n, "item_id": "m", "output_index": 0, "delta": text})

    return [
        _event("response.created", created),
        delta("response.status.delta", 1, FILL[:100] + " " + HEAD),
        delta("response.status.delta", 2, TAIL + " " + FILL[:300]),
        _event("response.completed", done),
    ]


def _send(gw: tuple[Env, GatewayThread], mock: MockProviderServer, events: list[str], anthropic: bool | str) -> Any:
    """`anthropic`: True for Messages, "responses" for the Responses API, else chat."""
    env, gateway = gw
    sid = "wf" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 60}])
    prompt = [{"role": "user", "content": f"mock-scenario:{sid}"}]
    if anthropic == "responses":
        path, body = "/v1/responses", {"model": "gpt-4.1", "stream": True, "input": f"mock-scenario:{sid}"}
    elif anthropic:
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
    ("shape", "anthropic"),
    [
        (_tool_name_split, False),
        (_choice_resumes, False),
        (_anthropic_name_split, True),
        (_responses_label_family, "responses"),
    ],
)
def test_no_piece_of_a_split_value_leaves(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, shape: Any, anthropic: bool | str
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


def test_interleaved_parallel_tool_calls_arrive_whole(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """A paused call is not an ended one: another call's fragments never make it quiet, so
    the stream is delivered whole, exactly as sent direct (the official SDK reads both)."""
    env, gateway = gw
    events = _interleaved_calls("first half " + FILL[:60], "second half")
    sid = "wf" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 30}, {"raw_events": events}])
    prompt = [{"role": "user", "content": f"mock-scenario:{sid}"}]

    def calls(client: openai.OpenAI) -> list[tuple[int, str]]:
        out: dict[int, str] = {}
        for chunk in client.chat.completions.create(model="gpt-4.1", stream=True, messages=prompt):  # type: ignore[arg-type]
            for call in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
                out[call.index] = out.get(call.index, "") + ((call.function and call.function.arguments) or "")
        return sorted(out.items())

    through = calls(openai_client(gateway, env, uds=True))
    direct = calls(direct_openai(mock.url))
    assert through == direct and len(through) == 2
    assert json.loads(through[0][1])["text"].startswith("first half") and "second half" in through[0][1]


def test_a_value_split_across_a_calls_pause_never_leaves(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """The first half of a configured value, then another call's fragments, then the rest:
    the first half is held with its call (never released as quiet), and the stream is
    refused before either half leaves."""
    answer = _send(gw, mock, _interleaved_calls(HEAD, TAIL), False)
    released = _released_text(answer.content)
    assert HEAD not in released and TAIL not in released, released[:400]
    assert "secret_value" in released or answer.status_code == 403


def test_two_citations_in_one_text_block_arrive_whole(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """Each citation is a whole object of its own (content[i].citations[n]): a second one
    after a window of text is a new field, not an ended one growing again."""
    env, gateway = gw

    def citation(n: int) -> dict[str, Any]:
        cited = {"type": "char_location", "cited_text": f"quoted passage {n}", "document_index": 0}
        return {"index": 0, "delta": {"type": "citations_delta", "citation": {**cited, "document_title": "Report"}}}

    def text(words: str) -> dict[str, Any]:
        return {"index": 0, "delta": {"type": "text_delta", "text": words}}

    start = {"index": 0, "content_block": {"type": "text", "text": "", "citations": []}}
    events = [
        MESSAGE_START,
        _event("content_block_start", start),
        _event("content_block_delta", citation(1)),
        _event("content_block_delta", text(FILL[:300])),
        _event("content_block_delta", citation(2)),
        _event("content_block_delta", text(" the end.")),
        _event("content_block_stop", {"index": 0}),
        *MESSAGE_END,
    ]
    sid = "wf" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 30}, {"raw_events": events}])
    prompt = [{"role": "user", "content": f"mock-scenario:{sid}"}]

    def final(client: anthropic.Anthropic) -> Any:
        with client.messages.stream(model="claude-x", max_tokens=99, messages=prompt) as stream:  # type: ignore[list-item]
            return stream.get_final_message().model_dump()["content"]

    through = final(anthropic_client(gateway, env, uds=True))
    assert through == final(direct_anthropic(mock.url))
    assert [c["cited_text"] for c in through[0]["citations"]] == ["quoted passage 1", "quoted passage 2"]
