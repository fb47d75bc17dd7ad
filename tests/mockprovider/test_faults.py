"""Scenario steps: error statuses, timing, TCP-level splitting and injected faults."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from gateway.mockprovider import MockProviderServer, RequestRecord

MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def server() -> Iterator[MockProviderServer]:
    with MockProviderServer() as mock:
        yield mock


def _openai(server: MockProviderServer, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=retries)


def _anthropic(server: MockProviderServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)


def _chat_body(scenario: str, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "user", "content": f"mock-scenario:{scenario}"}],
    }


def _of(server: MockProviderServer, scenario: str) -> list[RequestRecord]:
    return [record for record in server.state.records() if record.scenario == scenario]


# -- error statuses -----------------------------------------------------------


def test_rate_limit_then_success_is_retried_by_the_sdk(server: MockProviderServer) -> None:
    server.state.add_scenario("f-429", [{"status": 429, "headers": {"retry-after-ms": "20"}}, {}])
    with _openai(server, retries=2) as client:
        completion = client.chat.completions.create(**_chat_body("f-429"))
    assert completion.choices[0].message.content
    records = _of(server, "f-429")
    assert [record.status for record in records] == [429, 200]
    assert records[1].headers["x-stainless-retry-count"] == "1"
    assert records[0].body == records[1].body


def test_rate_limit_error_body_and_headers(server: MockProviderServer) -> None:
    server.state.add_scenario(
        "f-429-body",
        [{"status": 429, "headers": {"retry-after": "0"}, "error_message": "slow down [marker-7]"}],
    )
    with _openai(server) as client, pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(**_chat_body("f-429-body"))
    error = caught.value
    assert error.status_code == 429
    assert error.body == {
        "message": "slow down [marker-7]",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert error.code == "rate_limit_exceeded"
    assert error.response.headers["retry-after"] == "0"
    assert error.request_id is not None and error.request_id.startswith("req_")


def test_anthropic_overloaded_529(server: MockProviderServer) -> None:
    server.state.add_scenario("f-529", [{"status": 529}])
    with _anthropic(server) as client, pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "mock-scenario:f-529"}])
    error = caught.value
    assert isinstance(error, anthropic.OverloadedError)
    assert error.status_code == 529
    body = error.response.json()
    assert body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error"
    assert body["request_id"] == error.response.headers["request-id"]


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
    ],
)
def test_anthropic_error_types(server: MockProviderServer, status: int, error_type: str) -> None:
    server.state.add_scenario(f"f-an-{status}", [{"status": status, "error_message": "boom"}])
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": f"mock-scenario:f-an-{status}"}],
    }
    response = httpx2.post(server.url + "/v1/messages", json=body)
    assert response.status_code == status
    assert response.json() == {
        "type": "error",
        "error": {"type": error_type, "message": "boom"},
        "request_id": response.headers["request-id"],
    }


def test_unknown_scenario_is_a_provider_shaped_400(server: MockProviderServer) -> None:
    with _openai(server) as client, pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**_chat_body("f-never-registered"))
    assert "f-never-registered" in caught.value.message
    assert caught.value.type == "invalid_request_error"

    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "mock-scenario:f-nope"}],
    }
    response = httpx2.post(server.url + "/v1/messages", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# -- connection faults --------------------------------------------------------


def test_reset_mid_stream(server: MockProviderServer) -> None:
    server.state.add_scenario("f-reset", [{"fault": "reset_mid_stream", "text": "x" * 80}])
    received: list[str] = []
    with _openai(server) as client, pytest.raises(openai.APIConnectionError):
        for chunk in client.chat.completions.create(**_chat_body("f-reset", stream=True)):
            received.extend(choice.delta.content or "" for choice in chunk.choices)
    assert 0 < len("".join(received)) < 80  # roughly the first half arrived

    # The anthropic SDK lets the transport error through unwrapped mid-stream.
    with (
        _anthropic(server) as anthropic_client,
        pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)),
        anthropic_client.messages.stream(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "mock-scenario:f-reset"}],
        ) as stream,
    ):
        stream.get_final_message()

    records = _of(server, "f-reset")
    assert [(r.status, r.finished, r.cancelled) for r in records] == [(200, False, False)] * 2


def test_reset_before_headers(server: MockProviderServer) -> None:
    server.state.add_scenario("f-reset-head", [{"fault": "reset_before_headers"}])
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-reset-head"))
    records = _of(server, "f-reset-head")
    assert [(r.status, r.finished) for r in records] == [(None, False)]


def test_reset_mid_body(server: MockProviderServer) -> None:
    server.state.add_scenario("f-reset-body", [{"fault": "reset_mid_stream"}])
    with pytest.raises(httpx2.RemoteProtocolError):
        httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-reset-body"))
    with _openai(server) as client, pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(**_chat_body("f-reset-body"))


def test_truncated_json_body(server: MockProviderServer) -> None:
    server.state.add_scenario("f-trunc", [{"fault": "truncated_json"}])
    response = httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-trunc"))
    assert response.status_code == 200
    assert int(response.headers["content-length"]) == len(response.content) > 0
    assert response.content.startswith(b'{"id":"chatcmpl-')
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.content)
    # `finished` is set just after the last write, so the client can be slightly ahead.
    assert server.state.wait_for(lambda _: _of(server, "f-trunc")[-1].finished, 2.0)


def test_truncated_stream_ends_cleanly_without_terminal_event(server: MockProviderServer) -> None:
    server.state.add_scenario("f-trunc-s", [{"fault": "truncated_json"}])
    chat = httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-trunc-s", stream=True))
    assert chat.status_code == 200
    assert chat.content.endswith(b"\n\n") and b"[DONE]" not in chat.content

    body = {
        "model": MODEL,
        "max_tokens": 5,
        "stream": True,
        "messages": [{"role": "user", "content": "mock-scenario:f-trunc-s"}],
    }
    messages = httpx2.post(server.url + "/v1/messages", json=body)
    assert b"event: message_delta" in messages.content
    assert b"message_stop" not in messages.content

    responses = httpx2.post(
        server.url + "/v1/responses",
        json={"model": "m", "stream": True, "input": "mock-scenario:f-trunc-s"},
    )
    assert b"response.output_item.done" in responses.content
    assert b"response.completed" not in responses.content


def test_hang_is_cancelled_when_the_client_gives_up(server: MockProviderServer) -> None:
    server.state.add_scenario("f-hang", [{"fault": "hang"}])
    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-hang"), timeout=0.3)
    gave_up = time.monotonic()
    assert server.state.wait_for(lambda records: any(r.scenario == "f-hang" and r.cancelled for r in records), 2.0)
    assert time.monotonic() - gave_up < 1.0
    record = _of(server, "f-hang")[-1]
    assert (record.status, record.finished, record.cancelled) == (None, False, True)


def test_hang_after_headers(server: MockProviderServer) -> None:
    server.state.add_scenario("f-hang-h", [{"fault": "hang_after_headers"}])
    url = server.url + "/v1/chat/completions"
    with (
        httpx2.Client(timeout=0.3) as client,
        client.stream("POST", url, json=_chat_body("f-hang-h", stream=True)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        assert next(lines).startswith('data: {"id":"chatcmpl-')
        with pytest.raises(httpx2.ReadTimeout):
            list(lines)
    assert server.state.wait_for(lambda records: any(r.scenario == "f-hang-h" and r.cancelled for r in records), 2.0)
    assert _of(server, "f-hang-h")[-1].status == 200

    with pytest.raises(httpx2.ReadTimeout):
        httpx2.post(url, json=_chat_body("f-hang-h"), timeout=0.3)  # non-stream: headers only
    assert server.state.wait_for(lambda _: _of(server, "f-hang-h")[-1].cancelled, 2.0)
    assert _of(server, "f-hang-h")[-1].status == 200


# -- timing and TCP splits ----------------------------------------------------


def test_delay_before_headers(server: MockProviderServer) -> None:
    server.state.add_scenario("f-delay", [{"delay_ms": 150}])
    started = time.monotonic()
    response = httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-delay"))
    assert response.status_code == 200
    assert 0.15 <= time.monotonic() - started < 2.0


def test_slow_drip_spaces_stream_events(server: MockProviderServer) -> None:
    server.state.add_scenario("f-drip", [{"chunks": ["a", "b", "c", "d"], "drip_ms": 60}])
    arrivals: list[float] = []
    started = time.monotonic()
    with _openai(server) as client:
        for chunk in client.chat.completions.create(**_chat_body("f-drip", stream=True)):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())
    elapsed = time.monotonic() - started
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    assert len(arrivals) == 4
    assert all(gap >= 0.05 for gap in gaps)
    # role, 4 text chunks, finish, [DONE]: 6 gaps of 60 ms.
    assert 0.36 <= elapsed < 2.0
    record = _of(server, "f-drip")[-1]
    assert record.last_write_at is not None
    assert record.last_write_at - record.started >= 0.36


MULTIBYTE_TEXT = "Café é 日本語 🎉 naïve — ok 🎉🎉"


def _splits_a_character(body: bytes, split_bytes: int) -> bool:
    """Whether some write boundary (every `split_bytes` bytes) falls inside a UTF-8 character."""
    return any(0x80 <= body[offset] <= 0xBF for offset in range(split_bytes, len(body), split_bytes))


def test_split_bytes_chat_stream_arrives_in_small_reads(server: MockProviderServer) -> None:
    server.state.add_scenario("f-split", [{"text": MULTIBYTE_TEXT, "split_bytes": 5, "chunk_size": 12}])
    url = server.url + "/v1/chat/completions"
    with (
        httpx2.Client() as raw_client,
        raw_client.stream("POST", url, json=_chat_body("f-split", stream=True)) as response,
    ):
        reads = list(response.iter_raw())
    body = b"".join(reads)
    assert len(reads) > 20  # many small TCP reads, not one buffer
    assert max(len(read) for read in reads) < len(body) // 4
    assert _splits_a_character(body, 5)

    with _openai(server) as client:
        stream = client.chat.completions.create(**_chat_body("f-split", stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == MULTIBYTE_TEXT


def test_split_bytes_anthropic_and_responses_streams_parse(server: MockProviderServer) -> None:
    server.state.add_scenario("f-split-an", [{"text": MULTIBYTE_TEXT, "split_bytes": 7}])
    with (
        _anthropic(server) as client,
        client.messages.stream(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": "mock-scenario:f-split-an"}],
        ) as stream,
    ):
        assert stream.get_final_text() == MULTIBYTE_TEXT

    server.state.add_scenario("f-split-re", [{"text": MULTIBYTE_TEXT, "split_bytes": 29}])
    with (
        _openai(server) as openai_client,
        openai_client.responses.stream(model="m", input="mock-scenario:f-split-re") as responses,
    ):
        assert responses.get_final_response().output_text == MULTIBYTE_TEXT


def test_split_bytes_with_drip(server: MockProviderServer) -> None:
    server.state.add_scenario("f-split-drip", [{"text": MULTIBYTE_TEXT, "split_bytes": 5, "drip_ms": 5}])
    with _openai(server) as client:
        stream = client.chat.completions.create(**_chat_body("f-split-drip", stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == MULTIBYTE_TEXT


# -- raw bodies and events ----------------------------------------------------


def test_raw_body_is_sent_verbatim(server: MockProviderServer) -> None:
    raw = '{"not": "what the SDK expects", "ü": 1'
    server.state.add_scenario("f-raw", [{"status": 502, "raw_body": raw, "content_type": "text/plain"}])
    response = httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-raw"))
    assert response.status_code == 502
    assert response.content == raw.encode()
    assert response.headers["content-type"] == "text/plain"


def test_raw_events_are_sent_verbatim(server: MockProviderServer) -> None:
    events = [
        'data: {"error": {"message": "mid-stream failure", "type": "server_error"}}\n\n',
        ": keep-alive comment\r\n\r\n",
        "data: [DONE]\n\n",
    ]
    server.state.add_scenario("f-raw-ev", [{"raw_events": events}])
    response = httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("f-raw-ev", stream=True))
    assert response.content == "".join(events).encode()
    assert response.headers["content-type"].startswith("text/event-stream")

    with _openai(server) as client, pytest.raises(openai.APIError) as caught:
        list(client.chat.completions.create(**_chat_body("f-raw-ev", stream=True)))
    assert "mid-stream failure" in caught.value.message
