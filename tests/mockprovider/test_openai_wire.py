"""The mock's OpenAI wire formats, checked through the official openai SDK."""

from __future__ import annotations

import base64
import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from gateway.mockprovider import MockProviderServer, compute_usage, content_digest

FIXED_CREATED = 1767225600


@pytest.fixture(scope="module")
def server() -> Iterator[MockProviderServer]:
    with MockProviderServer() as mock:
        yield mock


@pytest.fixture(scope="module")
def client(server: MockProviderServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as sdk:
        yield sdk


def _sse_payloads(raw: bytes) -> list[str]:
    """The data lines of a data-only SSE body, in order."""
    events = raw.decode().split("\n\n")
    assert events[-1] == ""
    return [event.removeprefix("data: ") for event in events[:-1]]


# -- chat completions ---------------------------------------------------------


def test_chat_non_stream_default_reply(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is 2+2?"}]
    completion = client.chat.completions.create(model="gpt-4.1-mini", messages=messages)

    digest = content_digest("openai_chat", {"messages": messages})
    text = f"Mock reply: {digest[:8]}."
    assert completion.choices[0].message.content == text
    assert completion.choices[0].finish_reason == "stop"
    assert completion.id.startswith("chatcmpl-")
    assert completion.created == FIXED_CREATED
    assert completion.model == "gpt-4.1-mini"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == math.ceil(len("What is 2+2?") / 4)
    assert completion.usage.completion_tokens == math.ceil(len(text) / 4)
    assert completion.usage.total_tokens == 3 + 6
    assert completion.usage.prompt_tokens_details is not None
    assert completion.usage.prompt_tokens_details.cached_tokens == 0
    expected = compute_usage("openai_chat", {"messages": messages}, text)
    assert completion.usage.model_dump(exclude_none=True) == expected


def test_chat_stream_parallel_tool_calls_are_reassembled(server: MockProviderServer, client: openai.OpenAI) -> None:
    first_args = '{"city": "Zürich", "units": "metric"}'
    second_args = '{"query": "日本 🎉"}'
    server.state.add_scenario(
        "oa-tools",
        [
            {
                "tool_calls": [
                    {"name": "get_weather", "arguments": first_args},
                    {
                        "name": "search",
                        "arguments": second_args,
                        "chunks": ['{"query": ', '"日本 🎉"}'],
                    },
                ],
                "chunk_size": 5,
            }
        ],
    )
    messages: list[Any] = [{"role": "user", "content": "mock-scenario:oa-tools"}]

    with client.chat.completions.stream(model="gpt-4.1-mini", messages=messages) as stream:
        argument_deltas = [
            (event.index, event.arguments_delta)
            for event in stream
            if event.type == "tool_calls.function.arguments.delta" and event.arguments_delta
        ]
        final = stream.get_final_completion()

    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        ("get_weather", first_args),
        ("search", second_args),
    ]
    assert all(call.id.startswith("call_") for call in calls)
    assert calls[0].id != calls[1].id
    # chunk_size 5 for the first call, the explicit chunks for the second.
    assert [delta for index, delta in argument_deltas if index == 0] == [
        first_args[i : i + 5] for i in range(0, len(first_args), 5)
    ]
    assert [delta for index, delta in argument_deltas if index == 1] == ['{"query": ', '"日本 🎉"}']


def test_chat_stream_tool_call_fragments_follow_the_wire_format(
    server: MockProviderServer,
) -> None:
    server.state.add_scenario(
        "oa-frag",
        [{"tool_calls": [{"name": "f", "arguments": '{"a":1}', "chunks": ['{"a"', ":1}"]}]}],
    )
    body = {
        "model": "m",
        "stream": True,
        "messages": [{"role": "user", "content": "mock-scenario:oa-frag"}],
    }
    raw = httpx2.post(server.url + "/v1/chat/completions", json=body).content
    payloads = _sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    deltas = [json.loads(p)["choices"][0]["delta"] for p in payloads[:-1]]
    assert deltas[0] == {"role": "assistant", "content": None, "refusal": None}
    head = deltas[1]["tool_calls"][0]
    assert head["index"] == 0 and head["type"] == "function" and head["id"].startswith("call_")
    assert head["function"] == {"name": "f", "arguments": ""}
    assert deltas[2:4] == [
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
    ]
    assert json.loads(payloads[-2])["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_stream_include_usage_adds_a_final_usage_chunk(client: openai.OpenAI) -> None:
    messages: list[Any] = [{"role": "user", "content": "count me"}]
    stream = client.chat.completions.create(
        model="gpt-4.1-mini",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1] if c.choices)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump(exclude_none=True) == compute_usage("openai_chat", {"messages": messages}, text)
    assert len({chunk.id for chunk in chunks}) == 1


def test_chat_stream_without_include_usage_has_no_usage(server: MockProviderServer) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "no usage"}]}
    raw = httpx2.post(server.url + "/v1/chat/completions", json=body).content
    payloads = _sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all("usage" not in chunk and chunk["choices"] for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_chat_explicit_chunks_and_omit_usage(server: MockProviderServer, client: openai.OpenAI) -> None:
    server.state.add_scenario("oa-chunks", [{"chunks": ["Hel", "lo, ", "wörld"], "omit_usage": True}])
    messages: list[Any] = [{"role": "user", "content": "mock-scenario:oa-chunks"}]
    stream = client.chat.completions.create(
        model="m", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content] == [
        "Hel",
        "lo, ",
        "wörld",
    ]
    assert all(chunk.choices and chunk.usage is None for chunk in chunks)

    completion = client.chat.completions.create(model="m", messages=messages)
    assert completion.choices[0].message.content == "Hello, wörld"
    assert completion.usage is None


# -- responses ----------------------------------------------------------------


def test_responses_non_stream(client: openai.OpenAI) -> None:
    response = client.responses.create(model="gpt-5-mini", instructions="Be brief.", input="Hello there")

    digest = content_digest("openai_responses", {"instructions": "Be brief.", "input": "Hello there"})
    assert response.output_text == f"Mock reply: {digest[:8]}."
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.created_at == FIXED_CREATED
    assert response.usage is not None
    # One token count per segment (instructions, then the input message).
    assert response.usage.input_tokens == math.ceil(len("Be brief.") / 4) + math.ceil(len("Hello there") / 4)
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.input_tokens_details.cache_write_tokens == 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_responses_stream_text_and_function_call(server: MockProviderServer, client: openai.OpenAI) -> None:
    arguments = '{"city":"Oslo","note":"é 🎉"}'
    server.state.add_scenario(
        "oa-resp",
        [
            {
                "text": "Checking the weather…",
                "tool_calls": [{"name": "get_weather", "arguments": arguments}],
                "chunk_size": 4,
            }
        ],
    )
    with client.responses.stream(model="gpt-5-mini", input="mock-scenario:oa-resp") as stream:
        events = list(stream)
        final = stream.get_final_response()

    assert final.output_text == "Checking the weather…"
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1
    assert calls[0].name == "get_weather" and calls[0].arguments == arguments
    assert calls[0].call_id.startswith("call_")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text_deltas = math.ceil(len("Checking the weather…") / 4)
    argument_deltas = math.ceil(len(arguments) / 4)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * text_deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * argument_deltas,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert final.usage is not None
    assert final.usage.output_tokens == math.ceil(len("Checking the weather…" + arguments) / 4)


# -- embeddings and models ----------------------------------------------------


def test_embeddings_base64_default_equals_float(client: openai.OpenAI) -> None:
    inputs = ["alpha", "beta", "日本"]
    default = client.embeddings.create(model="text-embedding-3-small", input=inputs)
    floats = client.embeddings.create(model="text-embedding-3-small", input=inputs, encoding_format="float")

    assert [d.embedding for d in default.data] == [d.embedding for d in floats.data]
    vectors = [d.embedding for d in floats.data]
    assert all(len(vector) == 16 for vector in vectors)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-5 for v in vectors)
    assert len({tuple(v) for v in vectors}) == 3
    assert floats.usage.prompt_tokens == math.ceil(len("alphabeta日本") / 4)


def test_embeddings_wire_encodings_and_token_inputs(server: MockProviderServer) -> None:
    url = server.url + "/v1/embeddings"
    raw_b64 = httpx2.post(url, json={"model": "e", "input": [[1, 2, 3]], "dimensions": 8, "encoding_format": "base64"})
    raw_float = httpx2.post(url, json={"model": "e", "input": [1, 2, 3], "dimensions": 8})

    b64_item = raw_b64.json()["data"][0]
    float_item = raw_float.json()["data"][0]
    assert isinstance(b64_item["embedding"], str)
    assert len(float_item["embedding"]) == 8
    decoded = list(struct.unpack("<8f", base64.b64decode(b64_item["embedding"])))
    assert decoded == float_item["embedding"]
    assert raw_float.json()["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_embeddings_reject_bad_input(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="e", input=[], encoding_format="float")
    assert "'input'" in caught.value.message


def test_models_list(client: openai.OpenAI) -> None:
    ids = [model.id for model in client.models.list()]
    assert "gpt-4.1-mini" in ids and "text-embedding-3-small" in ids


def test_responses_omit_usage(server: MockProviderServer) -> None:
    server.state.add_scenario("oa-resp-omit", [{"omit_usage": True}])
    body: dict[str, Any] = {"model": "m", "input": "mock-scenario:oa-resp-omit"}
    plain = httpx2.post(server.url + "/v1/responses", json=body).json()
    assert plain["status"] == "completed" and "usage" not in plain

    raw = httpx2.post(server.url + "/v1/responses", json={**body, "stream": True}).content
    last_event = raw.decode().split("\n\n")[-2]
    assert last_event.startswith("event: response.completed\n")
    assert "usage" not in json.loads(last_event.split("\ndata: ", 1)[1])["response"]
