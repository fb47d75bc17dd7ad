"""Runners, request records, admin API, auth, Unix sockets and determinism."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import openai
import pytest

from gateway.mockprovider import (
    MockProviderServer,
    MockState,
    Step,
    StepError,
    compute_usage,
    serve_forever,
)

MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def server() -> Iterator[MockProviderServer]:
    with MockProviderServer() as mock:
        yield mock


def _chat_body(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": content}], **extra}


# -- request records ----------------------------------------------------------


def test_record_keeps_exact_body_bytes_and_headers(server: MockProviderServer) -> None:
    body = (
        b'{ "model":"m",\n  "messages":[{"role":"user","content":"caf\\u00e9 + caf\xc3\xa9 mock-scenario:r-exact"}] }'
    )
    server.state.add_scenario("r-exact", [{}])
    response = httpx2.post(
        server.url + "/v1/chat/completions?trace=1",
        content=body,
        headers={
            "Content-Type": "application/json",
            "X-Custom-Trace": "AbC  123",
            "Authorization": "Bearer k1",
        },
    )
    assert response.status_code == 200

    # `finished` is set just after the last write, so the client can be slightly ahead.
    assert server.state.wait_for(lambda records: any(r.scenario == "r-exact" and r.finished for r in records), 2.0)
    record = next(r for r in server.state.records() if r.scenario == "r-exact")
    assert record.body == body
    assert record.json["messages"][0]["content"] == "café + café mock-scenario:r-exact"
    assert record.headers["x-custom-trace"] == "AbC  123"
    assert record.headers["authorization"] == "Bearer k1"
    assert record.headers["content-type"] == "application/json"
    assert (record.method, record.path, record.query) == ("POST", "/v1/chat/completions", "trace=1")
    assert (record.status, record.finished, record.cancelled) == (200, True, False)
    assert record.started <= time.monotonic()

    listed = httpx2.get(server.url + "/_mock/requests").json()["requests"]
    as_json = next(item for item in listed if item["seq"] == record.seq)
    assert base64.b64decode(as_json["body_b64"]) == body
    assert as_json["body"] == body.decode()
    assert as_json["headers"]["x-custom-trace"] == "AbC  123"


def test_invalid_json_is_recorded_and_rejected(server: MockProviderServer) -> None:
    response = httpx2.post(server.url + "/v1/chat/completions", content=b"{not json mock-scenario:r-bad")
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    # An unknown scenario wins over the parse error: scenarios are chosen from raw bytes.
    record = server.state.records()[-1]
    assert (record.body, record.json, record.scenario, record.status) == (
        b"{not json mock-scenario:r-bad",
        None,
        "r-bad",
        400,
    )


def test_unknown_v1_route_is_recorded_404(server: MockProviderServer) -> None:
    response = httpx2.get(server.url + "/v1/nonexistent")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert server.state.records()[-1].path == "/v1/nonexistent"


def test_clear_records_and_sequence_numbers() -> None:
    with MockProviderServer() as mock:
        for _ in range(2):
            httpx2.post(mock.url + "/v1/chat/completions", json=_chat_body("hi"))
        assert [r.seq for r in mock.state.records()] == [1, 2]
        cleared = httpx2.delete(mock.url + "/_mock/requests").json()
        assert cleared == {"cleared": 2}
        assert mock.state.records() == []
        httpx2.post(mock.url + "/v1/chat/completions", json=_chat_body("hi"))
        assert [r.seq for r in mock.state.records()] == [3]
        assert mock.state.clear() == 1
        assert httpx2.get(mock.url + "/_mock/requests").json() == {"requests": []}


def test_admin_routes_are_not_recorded(server: MockProviderServer) -> None:
    before = len(server.state.records())
    assert httpx2.get(server.url + "/_mock/healthz").json() == {"status": "ok"}
    assert len(server.state.records()) == before


# -- scenarios ----------------------------------------------------------------


def test_register_scenario_over_http(server: MockProviderServer) -> None:
    url = server.url + "/_mock/scenarios"
    ok = httpx2.post(url, json={"id": "r-http", "steps": [{"text": "first"}, {"text": "then"}]})
    assert ok.json() == {"id": "r-http", "steps": 2}
    with openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client:
        texts = [
            client.chat.completions.create(**_chat_body("mock-scenario:r-http")).choices[0].message.content
            for _ in range(3)
        ]
    assert texts == ["first", "then", "then"]  # the last step repeats

    bad = [
        {"id": "has space", "steps": [{}]},
        {"id": "r-x", "steps": []},
        {"id": "r-x", "steps": [{"stauts": 429}]},
        {"id": "r-x", "steps": [{"fault": "explode"}]},
        {"id": "r-x", "steps": [{"status": "429"}]},
        {"id": "r-x", "steps": [{"text": "ab", "chunks": ["a", "c"]}]},
        {"id": "r-x", "steps": [{"tool_calls": [{"arguments": "{}"}]}]},
    ]
    for payload in bad:
        response = httpx2.post(url, json=payload)
        assert response.status_code == 400, payload
        assert response.json()["error"]


def test_step_validation_in_python() -> None:
    state = MockState()
    with pytest.raises(StepError, match="unknown step field"):
        state.add_scenario("x", [{"delay": 5}])
    with pytest.raises(StepError, match="scenario id"):
        state.add_scenario("x" * 65, [{}])
    state.add_scenario("x", [Step(status=500), {"text": "ok"}])
    assert [state.next_step("x") for _ in range(3)] == [
        Step(status=500),
        Step(text="ok"),
        Step(text="ok"),
    ]
    assert state.next_step("unknown") is None
    assert state.next_step(None) == Step()


def test_wait_for_polls_until_true_or_timeout() -> None:
    state = MockState()
    assert not state.wait_for(lambda records: bool(records), 0.05)
    assert asyncio.run(state.wait_for_async(lambda records: not records, 0.05))
    assert not asyncio.run(state.wait_for_async(lambda records: bool(records), 0.05))


# -- usage --------------------------------------------------------------------


def test_compute_usage_counts_unicode_characters() -> None:
    request = {"messages": [{"role": "user", "content": "日本語🎉"}]}  # 4 characters, 13 bytes
    usage = compute_usage("openai_chat", request, "é" * 9)
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (1, 3, 4)
    anthropic_usage = compute_usage("anthropic", {"system": "abcde", "messages": []}, "")
    assert (anthropic_usage["input_tokens"], anthropic_usage["output_tokens"]) == (2, 1)


# -- auth ---------------------------------------------------------------------


def test_auth_required_when_a_key_is_set() -> None:
    with MockProviderServer(api_key="sekrit") as mock:
        with openai.OpenAI(base_url=mock.url + "/v1", api_key="wrong", max_retries=0) as client:
            with pytest.raises(openai.AuthenticationError) as caught:
                client.chat.completions.create(**_chat_body("hi"))
            assert caught.value.code == "invalid_api_key"
        with openai.OpenAI(base_url=mock.url + "/v1", api_key="sekrit", max_retries=0) as client:
            assert client.chat.completions.create(**_chat_body("hi")).choices[0].message.content

        messages: list[Any] = [{"role": "user", "content": "hi"}]
        with anthropic.Anthropic(base_url=mock.url, api_key="wrong", max_retries=0) as client:
            with pytest.raises(anthropic.AuthenticationError) as an_caught:
                client.messages.create(model=MODEL, max_tokens=5, messages=messages)
            assert an_caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with anthropic.Anthropic(base_url=mock.url, api_key="sekrit", max_retries=0) as client:
            assert client.messages.create(model=MODEL, max_tokens=5, messages=messages).content

        # Anthropic also takes x-api-key (the SDK itself sends a Bearer token);
        # OpenAI routes take only the Bearer form.
        anthropic_body = {"model": MODEL, "max_tokens": 5, "messages": messages}
        for key, expected in (("sekrit", 200), ("wrong", 401)):
            response = httpx2.post(mock.url + "/v1/messages", json=anthropic_body, headers={"x-api-key": key})
            assert response.status_code == expected
        openai_with_x_api_key = httpx2.post(
            mock.url + "/v1/chat/completions",
            json=_chat_body("hi"),
            headers={"x-api-key": "sekrit"},
        )
        assert openai_with_x_api_key.status_code == 401
        assert [r.status for r in mock.state.records()] == [401, 200, 401, 200, 200, 401, 401]

        mock.state.api_key = None
        assert httpx2.post(mock.url + "/v1/chat/completions", json=_chat_body("hi")).status_code == 200


def test_no_key_configured_accepts_any_or_no_key(server: MockProviderServer) -> None:
    assert httpx2.post(server.url + "/v1/chat/completions", json=_chat_body("hi")).status_code == 200
    response = httpx2.post(
        server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200


# -- runners and Unix sockets -------------------------------------------------


def test_tcp_runner_properties() -> None:
    mock = MockProviderServer()
    assert mock.uds is None
    with mock:
        assert mock.port > 0
        assert mock.url == f"http://127.0.0.1:{mock.port}"
        with pytest.raises(RuntimeError):
            mock.start()
    mock.stop()  # idempotent
    with pytest.raises(ValueError, match="loopback"):
        MockProviderServer(host="0.0.0.0")


def test_unix_socket_server(tmp_path: Path) -> None:
    path = str(tmp_path / "mock.sock")
    with MockProviderServer(uds=path) as mock:
        assert mock.uds == path and mock.url == "http://localhost"
        transport = httpx2.HTTPTransport(uds=path)
        with httpx2.Client(transport=transport) as http_client:
            sdk = openai.OpenAI(base_url=mock.url + "/v1", api_key="k", http_client=http_client, max_retries=0)
            assert sdk.chat.completions.create(**_chat_body("over uds")).choices[0].message.content
        assert mock.state.records()[0].path == "/v1/chat/completions"
    assert not os.path.exists(path)


def test_serve_forever_on_unix_socket(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = str(tmp_path / "cli.sock")

    async def scenario() -> dict[str, Any]:
        task = asyncio.create_task(serve_forever(host="127.0.0.1", port=None, uds=path, api_key=None))
        for _ in range(500):
            if await asyncio.to_thread(os.path.exists, path):
                break
            await asyncio.sleep(0.01)
        connector = aiohttp.UnixConnector(path=path)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post("http://localhost/v1/chat/completions", json=_chat_body("secret-prompt")) as resp,
        ):
            payload: dict[str, Any] = await resp.json()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return payload

    with caplog.at_level(logging.INFO, logger="wiregate.mockprovider"):
        payload = asyncio.run(scenario())
    assert payload["object"] == "chat.completion"
    assert not os.path.exists(path)
    messages = [record.getMessage() for record in caplog.records if record.name == "wiregate.mockprovider"]
    assert messages == [f"mock provider listening on unix:{path} (API key not required)"]
    assert "secret-prompt" not in caplog.text


def test_stop_cancels_in_flight_hangs() -> None:
    mock = MockProviderServer().start()
    mock.state.add_scenario("r-hang", [{"fault": "hang"}])
    errors: list[BaseException] = []

    def call() -> None:
        try:
            httpx2.post(
                mock.url + "/v1/chat/completions",
                json=_chat_body("mock-scenario:r-hang"),
                timeout=10,
            )
        except httpx2.HTTPError as error:
            errors.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    assert mock.state.wait_for(lambda records: len(records) == 1, 2.0)
    started = time.monotonic()
    mock.stop()
    assert time.monotonic() - started < 3.0
    caller.join(5)
    assert len(errors) == 1
    assert mock.state.records()[0].cancelled


# -- determinism --------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", _chat_body("same")),
        (
            "/v1/chat/completions",
            _chat_body("same", stream=True, stream_options={"include_usage": True}),
        ),
        ("/v1/responses", {"model": "m", "input": "same", "stream": True}),
        (
            "/v1/messages",
            {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        ),
        (
            "/v1/messages",
            {
                "model": MODEL,
                "max_tokens": 5,
                "stream": True,
                "messages": [{"role": "user", "content": "x"}],
            },
        ),
        ("/v1/embeddings", {"model": "e", "input": ["same", "other"]}),
    ],
)
def test_identical_requests_get_identical_bytes(server: MockProviderServer, path: str, body: dict[str, Any]) -> None:
    first, second = (httpx2.post(server.url + path, json=body) for _ in range(2))
    assert first.status_code == 200
    assert first.content == second.content
    assert first.headers.get("x-request-id") == second.headers.get("x-request-id")


def test_cache_fields_do_not_change_ids_or_text(server: MockProviderServer) -> None:
    server.state.add_scenario("r-tools", [{"text": "Calling.", "tool_calls": [{"name": "f", "arguments": "{}"}]}])
    plain_chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hello mock-scenario:r-tools"}],
    }
    cached_chat = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Hello mock-scenario:r-tools",
                        "prompt_cache_breakpoint": {"mode": "explicit"},
                    }
                ],
            }
        ],
        "prompt_cache_key": "tenant-42",
        "metadata": {"k": "v"},
    }
    a, b = (httpx2.post(server.url + "/v1/chat/completions", json=body).json() for body in (plain_chat, cached_chat))
    assert a["id"] == b["id"]
    assert a["choices"] == b["choices"]
    assert a["usage"] == b["usage"]

    plain_msg = {
        "model": MODEL,
        "max_tokens": 5,
        "system": "Policy.",
        "messages": [{"role": "user", "content": "Hi mock-scenario:r-tools"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }
    cached_msg = {
        **plain_msg,
        "system": [{"type": "text", "text": "Policy.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Hi mock-scenario:r-tools",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
        ],
        "tools": [
            {
                "name": "f",
                "input_schema": {"type": "object"},
                # 1 h: a 1 h marker (system) after a 5 min one is a 400, as in the API.
                "cache_control": {"type": "ephemeral", "ttl": "1h"},
            }
        ],
        "cache_control": {"type": "ephemeral"},
        "metadata": {"user_id": "u1"},
    }
    c, d = (httpx2.post(server.url + "/v1/messages", json=body).json() for body in (plain_msg, cached_msg))
    assert c["id"] == d["id"]
    assert c["content"] == d["content"]
    assert c["content"][1]["id"].startswith("toolu_")

    plain_resp = {"model": "m", "input": "Hey"}
    e, f = (
        httpx2.post(server.url + "/v1/responses", json=body).json()
        for body in (
            plain_resp,
            {**plain_resp, "prompt_cache_key": "tenant-42", "stream_options": {}},
        )
    )
    assert e["id"] == f["id"]
    assert e["output"] == f["output"]
    assert json.dumps(e["usage"]) == json.dumps(f["usage"])
