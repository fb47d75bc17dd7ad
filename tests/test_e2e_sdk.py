"""The official SDKs through wiregate (HTTPS with the dev CA, and the Unix socket) to the
mock provider: every carrier, stream and non-stream, equal to calling the mock directly."""

from __future__ import annotations

import array
import base64
import json
import uuid
from collections.abc import Iterator

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import (
    Env,
    GatewayThread,
    anthropic_client,
    direct_anthropic,
    direct_openai,
    openai_client,
)

TRANSPORTS = ["https", "uds"]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("sdk", secrets_=["never-matches-anything-0001"]) as started:
        yield started


def _scenario(mock: MockProviderServer, **step: object) -> str:
    sid = "s" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [step])
    return sid


TOOL_ARGS_A = json.dumps({"city": "Oslo", "units": "metric", "note": "naïve café ☕ 日本"})
TOOL_ARGS_B = '{"sku":"A-1","qty":3}'


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_non_stream(gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str) -> None:
    env, gateway = gw
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    via = openai_client(gateway, env, uds=transport == "uds").chat.completions.create(
        model="gpt-4.1", messages=messages
    )
    direct = direct_openai(mock.url).chat.completions.create(model="gpt-4.1", messages=messages)
    assert via.model_dump() == direct.model_dump()
    assert via.choices[0].message.content and via.usage is not None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_stream_with_tool_calls(gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str) -> None:
    env, gateway = gw
    sid = _scenario(
        mock,
        tool_calls=[{"name": "weather", "arguments": TOOL_ARGS_A}, {"name": "price", "arguments": TOOL_ARGS_B}],
        chunk_size=3,
    )
    messages = [{"role": "user", "content": f"weather and price please mock-scenario:{sid}"}]

    def run(client: object) -> list[tuple[str, str]]:
        with client.chat.completions.stream(model="gpt-4.1", messages=messages) as stream:  # type: ignore[attr-defined]
            final = stream.get_final_completion()
        return [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls]

    via = run(openai_client(gateway, env, uds=transport == "uds"))
    assert via == [("weather", TOOL_ARGS_A), ("price", TOOL_ARGS_B)]  # reassembled exactly
    assert via == run(direct_openai(mock.url))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_chat_stream_chunks_equal_direct(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str
) -> None:
    env, gateway = gw
    messages = [{"role": "user", "content": "count to three"}]
    kwargs = {"model": "gpt-4.1", "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
    via = [
        c.model_dump() for c in openai_client(gateway, env, uds=transport == "uds").chat.completions.create(**kwargs)
    ]
    direct = [c.model_dump() for c in direct_openai(mock.url).chat.completions.create(**kwargs)]
    assert via == direct
    assert via[-1]["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_responses_non_stream_and_stream(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str
) -> None:
    env, gateway = gw
    client = openai_client(gateway, env, uds=transport == "uds")
    # The Responses API echoes prompt_cache_key; wiregate sets one when the client does not
    # (cache planning), and never overrides the client's: with one set, results are equal.
    args = {
        "model": "gpt-5",
        "instructions": "Reply in one sentence.",
        "input": "Weather in Oslo?",
        "prompt_cache_key": "client-chosen-key",
    }
    via = client.responses.create(**args)
    direct = direct_openai(mock.url).responses.create(**args)
    assert via.model_dump() == direct.model_dump()
    assert via.output_text and via.prompt_cache_key == "client-chosen-key"
    planned = client.responses.create(**{k: v for k, v in args.items() if k != "prompt_cache_key"})
    assert planned.prompt_cache_key is not None and planned.prompt_cache_key.startswith("wg-")

    sid = _scenario(
        mock, text="Sunny, 4 °C — nice ☀", tool_calls=[{"name": "lookup", "arguments": TOOL_ARGS_B}], chunk_size=2
    )
    stream_args = {**args, "input": f"Weather? mock-scenario:{sid}"}
    with client.responses.stream(**stream_args) as stream:
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert final.output_text == "Sunny, 4 °C — nice ☀"
    assert [(c.name, c.arguments) for c in calls] == [("lookup", TOOL_ARGS_B)]
    with direct_openai(mock.url).responses.stream(**stream_args) as stream:
        assert stream.get_final_response().model_dump() == final.model_dump()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("encoding", ["float", "base64", None])
def test_embeddings(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str, encoding: str | None
) -> None:
    env, gateway = gw
    kwargs: dict[str, object] = {"model": "text-embedding-3-small", "input": ["alpha", "beta gamma"]}
    if encoding is not None:
        kwargs["encoding_format"] = encoding  # None: the SDK's default, which sends base64
    via = openai_client(gateway, env, uds=transport == "uds").embeddings.create(**kwargs)
    direct = direct_openai(mock.url).embeddings.create(**kwargs)
    assert via.model_dump(warnings=False) == direct.model_dump(warnings=False)
    assert len(via.data) == 2
    floats = openai_client(gateway, env).embeddings.create(**{**kwargs, "encoding_format": "float"})
    for got, want in zip(via.data, floats.data, strict=True):
        if encoding == "base64":  # asked for explicitly: the SDK hands back the base64 text
            assert isinstance(got.embedding, str)
            decoded = list(array.array("f", base64.b64decode(got.embedding)))
            assert decoded == pytest.approx(want.embedding, rel=1e-6)
        else:
            assert got.embedding == pytest.approx(want.embedding, rel=1e-6)
            assert isinstance(got.embedding[0], float)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_anthropic_messages(gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str) -> None:
    env, gateway = gw
    client = anthropic_client(gateway, env, uds=transport == "uds")
    args = {
        "model": "claude-test-model",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi"}],
    }
    via = client.messages.create(**args)
    assert via.model_dump() == direct_anthropic(mock.url).messages.create(**args).model_dump()

    sid = _scenario(
        mock, text="Let me check.", tool_calls=[{"name": "get_order", "arguments": TOOL_ARGS_A}], chunk_size=4
    )
    stream_args = {**args, "messages": [{"role": "user", "content": f"order? mock-scenario:{sid}"}]}
    with client.messages.stream(**stream_args) as stream:
        final = stream.get_final_message()
    tool = [b for b in final.content if b.type == "tool_use"]
    assert [b.text for b in final.content if b.type == "text"] == ["Let me check."]
    assert tool and tool[0].name == "get_order" and tool[0].input == json.loads(TOOL_ARGS_A)
    assert final.stop_reason == "tool_use"
    with direct_anthropic(mock.url).messages.stream(**stream_args) as stream:
        assert stream.get_final_message().model_dump() == final.model_dump()


def test_every_response_carries_a_server_request_id(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    from tests.harness import raw_client

    client = raw_client(gateway, env)
    seen = set()
    for method, path, headers in [
        ("GET", "/healthz", {}),
        ("GET", "/nope", {}),
        ("POST", "/v1/chat/completions", {"x-powercontext-request-id": "0000000000000000"}),
        ("GET", "/v1/chat/completions", {}),
        ("GET", "/v1/models", {"authorization": f"Bearer {env.gateway_key}"}),
    ]:
        r = client.request(method, path, headers=headers)
        rid = r.headers["x-powercontext-request-id"]
        assert len(rid) == 16 and all(c in "0123456789abcdef" for c in rid)
        assert rid != "0000000000000000"
        seen.add(rid)
    assert len(seen) == 5
