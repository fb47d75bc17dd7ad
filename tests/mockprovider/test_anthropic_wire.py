"""The mock's Anthropic Messages wire format, checked through the official anthropic SDK."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import pytest

from gateway.mockprovider import MockProviderServer, compute_usage, content_digest

MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def server() -> Iterator[MockProviderServer]:
    with MockProviderServer() as mock:
        yield mock


@pytest.fixture(scope="module")
def client(server: MockProviderServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as sdk:
        yield sdk


def _named_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs of a named-event SSE body."""
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        name_line, data_line = block.split("\n")
        events.append((name_line.removeprefix("event: "), json.loads(data_line.removeprefix("data: "))))
    return events


def test_messages_non_stream_default_reply(client: anthropic.Anthropic) -> None:
    request: dict[str, Any] = {
        "system": "You are terse.",
        "messages": [{"role": "user", "content": "Say hi"}],
    }
    message = client.messages.create(model=MODEL, max_tokens=64, **request)

    digest = content_digest("anthropic", request)
    text = f"Mock reply: {digest[:8]}."
    assert [(block.type, getattr(block, "text", None)) for block in message.content] == [("text", text)]
    assert message.id.startswith("msg_")
    assert message.model == MODEL
    assert message.stop_reason == "end_turn"
    # One token count per block (system, then the user's text), each ceil(chars / 4).
    assert message.usage.input_tokens == math.ceil(len("You are terse.") / 4) + math.ceil(len("Say hi") / 4)
    assert message.usage.output_tokens == math.ceil(len(text) / 4)
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.cache_creation_input_tokens == 0
    assert message.usage.cache_creation is not None
    assert message.usage.cache_creation.ephemeral_1h_input_tokens == 0
    assert message.usage.model_dump(exclude_none=True) == compute_usage("anthropic", request, text)


def test_messages_tool_use_non_stream_and_stream(server: MockProviderServer, client: anthropic.Anthropic) -> None:
    arguments = '{"order_id": "A-42", "notes": ["é", "日本", "🎉"]}'
    server.state.add_scenario(
        "an-tool",
        [
            {
                "text": "Looking it up.",
                "tool_calls": [{"name": "get_order", "arguments": arguments}],
                "chunk_size": 6,
            }
        ],
    )
    messages: list[Any] = [{"role": "user", "content": "mock-scenario:an-tool"}]

    plain = client.messages.create(model=MODEL, max_tokens=64, messages=messages)
    with client.messages.stream(model=MODEL, max_tokens=64, messages=messages) as stream:
        streamed = stream.get_final_message()

    for message in (plain, streamed):
        assert message.stop_reason == "tool_use"
        text_block, tool_block = message.content
        assert text_block.type == "text" and text_block.text == "Looking it up."
        assert tool_block.type == "tool_use"
        assert tool_block.name == "get_order"
        assert tool_block.input == json.loads(arguments)
        assert tool_block.id.startswith("toolu_")
        assert message.usage.output_tokens == math.ceil(len("Looking it up." + arguments) / 4)
    assert streamed.id == plain.id
    assert streamed.content[1].id == plain.content[1].id  # type: ignore[union-attr]


def test_messages_stream_event_sequence(server: MockProviderServer) -> None:
    arguments = '{"q":"x"}'
    server.state.add_scenario(
        "an-seq",
        [
            {
                "chunks": ["Hi", " there"],
                "tool_calls": [{"name": "t", "arguments": arguments, "chunks": ["", '{"q"', ':"x"}']}],
            }
        ],
    )
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "stream": True,
        "messages": [{"role": "user", "content": "mock-scenario:an-seq"}],
    }
    raw = httpx2.post(server.url + "/v1/messages", json=body).content
    events = _named_events(raw)

    assert all(name == data["type"] for name, data in events)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start_usage = events[0][1]["message"]["usage"]
    assert start_usage["output_tokens"] == 1
    assert start_usage["cache_read_input_tokens"] == 0
    assert [data["delta"]["partial_json"] for _, data in events[7:10]] == ["", '{"q"', ':"x"}']
    assert events[6][1]["content_block"] == {
        "type": "tool_use",
        "id": events[6][1]["content_block"]["id"],
        "name": "t",
        "input": {},
    }
    final_delta = events[-2][1]
    assert final_delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final_delta["usage"]["output_tokens"] == math.ceil(len("Hi there" + arguments) / 4)


def test_messages_omit_usage_keeps_only_required_fields(server: MockProviderServer) -> None:
    server.state.add_scenario("an-omit", [{"omit_usage": True}])
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "mock-scenario:an-omit"}],
    }
    plain = httpx2.post(server.url + "/v1/messages", json=body).json()
    assert set(plain["usage"]) == {"input_tokens", "output_tokens"}

    raw = httpx2.post(server.url + "/v1/messages", json={**body, "stream": True}).content
    events = dict(_named_events(raw))
    assert set(events["message_start"]["message"]["usage"]) == {"input_tokens", "output_tokens"}
    assert set(events["message_delta"]["usage"]) == {"output_tokens"}


def test_non_object_tool_arguments_are_a_clear_mock_error(
    server: MockProviderServer, client: anthropic.Anthropic
) -> None:
    server.state.add_scenario("an-badargs", [{"tool_calls": [{"name": "t", "arguments": "not json"}]}])
    with pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[{"role": "user", "content": "mock-scenario:an-badargs"}],
        )
    assert "not a JSON object" in caught.value.message
