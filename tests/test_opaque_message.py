"""Images and files are refused by default (`opaque_content`), and the refusal tells the
operator exactly how to allow them per profile — without repeating anything the request
held. Official SDKs as clients."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, post_json

IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
PROMPT = "describe-this-picture-please-4417"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("opaque_message") as started:
        yield started


def _says_how_to_allow(message: str, profile: str) -> None:
    assert f'add "{profile}" to allow_opaque_profiles in policy.toml' in message
    assert "opaque_content" in message
    assert PROMPT not in message and IMAGE not in message and "data:" not in message


def test_openai_image_refusal_names_the_policy_setting(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPT},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                    ],
                }
            ],
        )
    error = caught.value.body
    assert isinstance(error, dict) and error["reason_codes"] == ["opaque_content"]
    _says_how_to_allow(error["message"], "mock-openai")
    assert len(mock.state.records()) == before  # nothing was sent


def test_anthropic_document_refusal_names_the_policy_setting(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    with pytest.raises(anthropic.UnprocessableEntityError) as caught:
        anthropic_client(gateway, env).messages.create(
            model="claude-sonnet-4-6",
            max_tokens=16,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": PROMPT},
                        {
                            "type": "document",
                            "source": {"type": "base64", "media_type": "application/pdf", "data": IMAGE},
                        },
                    ],
                }
            ],
        )
    body = caught.value.body
    assert isinstance(body, dict)
    _says_how_to_allow(body["error"]["message"], "mock-anthropic")


def test_allowed_profile_passes_the_image(gateways: GatewayFactory) -> None:
    """Doing what the message says lets the image through to that profile."""
    with gateways("opaque_allowed", policy_extra='allow_opaque_profiles = ["mock-openai"]\n') as (env, gateway):
        reply = openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}}],
                }
            ],
        )
        assert reply.choices[0].message.content


PDF = "data:application/pdf;base64,JVBERi0xLjQKJcfsj6IKNSAwIG9iago8PC9MZW5ndGggNiAwIFI+PgpzdHJlYW0K"
PDF_SOURCE = {"type": "base64", "media_type": "application/pdf", "data": PDF.split(",", 1)[1]}
_CALL = {"type": "function_call", "call_id": "c1", "name": "fetch", "arguments": "{}"}
_FILE = {"type": "input_file", "filename": "notes.pdf", "file_data": PDF}
_TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"input": [_CALL, {"type": "function_call_output", "call_id": "c1", "output": [_FILE]}]}),
        (
            "/v1/responses",
            {
                "input": [
                    {"type": "custom_tool_call", "call_id": "c2", "name": "fetch", "input": "x"},
                    {"type": "custom_tool_call_output", "call_id": "c2", "output": [_FILE]},
                ]
            },
        ),
        (
            "/v1/responses",
            {
                "input": [
                    {"type": "computer_call", "call_id": "c3", "action": {"type": "screenshot"}},
                    {
                        "type": "computer_call_output",
                        "call_id": "c3",
                        "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64," + IMAGE},
                    },
                ]
            },
        ),
        (
            "/v1/responses",
            {"prompt": {"id": "pmpt_1", "variables": {"doc": _FILE}}, "input": "summarise the document"},
        ),
        (  # an inline skill: a zip the provider unpacks for the model to read
            "/v1/responses",
            {
                "input": "deploy it",
                "tools": [
                    {
                        "type": "shell",
                        "environment": {
                            "type": "container_auto",
                            "skills": [
                                {
                                    "type": "inline",
                                    "name": "deploy",
                                    "source": {"type": "base64", "media_type": "application/zip", "data": IMAGE},
                                }
                            ],
                        },
                    }
                ],
            },
        ),
        (  # an earlier image generation, its picture sent back as input
            "/v1/responses",
            {
                "input": [
                    {"role": "user", "content": "draw it"},
                    {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": IMAGE},
                ]
            },
        ),
        (  # an image edit's mask, a data URL in a tool's settings
            "/v1/responses",
            {
                "input": "edit it",
                "tools": [
                    {"type": "image_generation", "input_image_mask": {"image_url": f"data:image/png;base64,{IMAGE}"}}
                ],
            },
        ),
        *[
            (
                route,
                {
                    "max_tokens": 64,
                    "messages": [
                        {"role": "user", "content": "fetch it"},
                        {
                            "role": "assistant",
                            "content": [
                                {"type": "server_tool_use", "id": "s1", "name": "web_fetch", "input": {"url": "x"}},
                                {
                                    "type": "web_fetch_tool_result",
                                    "tool_use_id": "s1",
                                    "content": {
                                        "type": "web_fetch_result",
                                        "url": "https://example.com/a.pdf",
                                        "content": {"type": "document", "source": PDF_SOURCE},
                                    },
                                },
                            ],
                        },
                        {"role": "user", "content": "what does it say?"},
                    ],
                },
            )
            for route in ("/v1/messages", "/v1/messages/count_tokens")
        ],
        (
            "/v1/messages",
            {
                "max_tokens": 64,
                "messages": [
                    _TOOL_USE,
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [
                                    {
                                        "type": "search_result",
                                        "source": "https://example.com",
                                        "title": "t",
                                        "content": [{"type": "document", "source": PDF_SOURCE}],
                                    }
                                ],
                            }
                        ],
                    },
                ],
            },
        ),
    ],
)
def test_files_anywhere_the_provider_reads_them_are_refused(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, path: str, body: dict[str, object]
) -> None:
    """A file or an image is opaque wherever it sits — a tool's output, a server tool's
    fetched document, a search result, a prompt template's variables — not only in a
    message's content: refused, and nothing reaches the provider."""
    env, gateway = gw
    model = "claude-test" if path.startswith("/v1/messages") else "gpt-4.1"
    before = len(mock.state.records())
    answer = post_json(gateway, env, path, {"model": model, **body})
    assert answer.status_code == 422, answer.text
    assert "opaque_content" in answer.text and PDF not in answer.text
    assert len(mock.state.records()) == before


def test_a_tool_calls_own_input_is_not_taken_for_a_file(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """What the model wrote as a tool's input is data, even shaped like an image block."""
    env, gateway = gw
    tool_use = {"type": "tool_use", "id": "t1", "name": "draw", "input": {"type": "image", "source": {"type": "url"}}}
    answer = post_json(
        gateway,
        env,
        "/v1/messages",
        {
            "model": "claude-test",
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": "draw"},
                {"role": "assistant", "content": [tool_use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "done"}]},
            ],
        },
    )
    assert answer.status_code == 200, answer.text


def test_text_sources_and_data_urls_are_read_not_refused(gw: tuple[Env, GatewayThread]) -> None:
    """A `base64` source of text, or a `data:` URL of text, is text the checks read: sent."""
    env, gateway = gw
    body = {
        "model": "gpt-4.1",
        "input": "hello",
        "metadata": {"note": "data:text/plain,hello"},
        "tools": [
            {
                "type": "shell",
                "environment": {
                    "type": "container_auto",
                    "skills": [
                        {
                            "type": "inline",
                            "name": "notes",
                            "source": {"type": "base64", "media_type": "text/markdown", "data": "aGVsbG8="},
                        }
                    ],
                },
            }
        ],
    }
    assert post_json(gateway, env, "/v1/responses", body).status_code == 200
    for ordinary in (  # text that merely starts with "data:" is text
        {
            "model": "gpt-4.1",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Data: 3, 5, 8."}]}],
        },
        {"model": "gpt-4.1", "instructions": "data: answer in one line", "input": "hi"},
        {"model": "gpt-4.1", "input": "hi", "metadata": {"source": "data:warehouse/eu,2024"}},
    ):
        assert post_json(gateway, env, "/v1/responses", ordinary).status_code == 200, ordinary


def test_an_answer_that_starts_with_data_is_released(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = "dat" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"text": "Data: the mean is 5.33"}])
    answer = post_json(gateway, env, "/v1/responses", {"model": "gpt-5", "input": f"mean? mock-scenario:{sid}"})
    assert answer.status_code == 200 and "the mean is 5.33" in answer.text


def _generated_image(stream: bool) -> dict[str, object]:
    item = {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": IMAGE}
    response = {
        "id": "resp_img",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "gpt-5",
        "output": [item],
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
    }
    if not stream:
        return {"raw_body": json.dumps(response)}
    events = [
        {"type": "response.created", "response": {**response, "status": "in_progress", "output": []}},
        {
            "type": "response.image_generation_call.partial_image",
            "output_index": 0,
            "item_id": "ig_1",
            "partial_image_index": 0,
            "partial_image_b64": IMAGE,
        },
        {"type": "response.completed", "response": response},
    ]
    return {"raw_events": [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]}


@pytest.mark.parametrize("stream", [False, True])
def test_a_generated_image_is_withheld_unless_the_profile_allows_it(
    gw: tuple[Env, GatewayThread], gateways: GatewayFactory, mock: MockProviderServer, stream: bool
) -> None:
    """An image in a Responses answer (its result, or its partial images as they stream) is
    content no check reads: withheld as `opaque_content`, released where allowed."""
    env, gateway = gw
    sid = "img" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [_generated_image(stream)])
    body = {"model": "gpt-5", "stream": stream, "input": f"draw mock-scenario:{sid}"}
    answer = post_json(gateway, env, "/v1/responses", body)
    assert answer.status_code == 403, answer.text
    assert "opaque_content" in answer.text and IMAGE not in answer.text
    with gateways("opaque_image_allowed", policy_extra='allow_opaque_profiles = ["mock-openai"]\n') as (env2, gw2):
        sid = "img" + uuid.uuid4().hex[:10]
        mock.state.add_scenario(sid, [_generated_image(stream)])
        body["input"] = f"draw mock-scenario:{sid}"
        allowed = post_json(gw2, env2, "/v1/responses", body)
        assert allowed.status_code == 200 and IMAGE in allowed.text


def _spoken_answer(stream: bool) -> dict[str, object]:
    audio = {"id": "audio_1", "data": IMAGE, "expires_at": 1, "transcript": "hello"}
    if not stream:
        answer = {
            "id": "chatcmpl-audio",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o-audio-preview",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": None, "audio": audio}, "finish_reason": "stop"}
            ],
        }
        return {"raw_body": json.dumps(answer)}
    chunk = {"id": "chatcmpl-audio", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-audio-preview"}
    chunks = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "audio": audio}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    return {"raw_events": [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]}


@pytest.mark.parametrize("stream", [False, True])
def test_a_spoken_chat_answer_is_withheld(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, stream: bool
) -> None:
    """A chat answer's audio is as unreadable as an image: withheld by default."""
    env, gateway = gw
    sid = "aud" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [_spoken_answer(stream)])
    body = {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"say mock-scenario:{sid}"}]}
    answer = post_json(gateway, env, "/v1/chat/completions", body)
    assert answer.status_code == 403, answer.text
    assert "opaque_content" in answer.text and IMAGE not in answer.text
