"""Faults through the real gateway: strict buffering, cancellation, retries, fallback,
broken and hanging upstreams, and the concurrency limit."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from gateway.mockprovider import MockProviderServer
from gateway.state import METRICS
from tests.conftest import GatewayFactory
from tests.harness import (
    Env,
    GatewayThread,
    anthropic_client,
    chat_chunk_event,
    mock_profile,
    openai_client,
    raw_client,
)


@pytest.fixture(scope="module")
def gw(mock: MockProviderServer, gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("primary", "openai", mock.url, fallbacks=["backup"]),
        mock_profile("backup", "openai", mock.url),
        mock_profile(
            "hangy", "openai", mock.url, retry={"attempts": 0}, timeouts={"connect_s": 1, "read_s": 0.5, "total_s": 1.5}
        ),
        mock_profile("mock-anthropic", "anthropic", mock.url),
        mock_profile("single", "openai", mock.url),  # retries, but no fallback
        mock_profile(  # retries, then its total runs out mid-attempt
            "impatient",
            "openai",
            mock.url,
            retry={"attempts": 2, "backoff_initial_ms": 10, "backoff_max_ms": 50},
            timeouts={"connect_s": 1, "read_s": 5, "total_s": 1.5},
        ),
        mock_profile(
            "hangy-anthropic",
            "anthropic",
            mock.url,
            retry={"attempts": 0},
            timeouts={"connect_s": 1, "read_s": 0.5, "total_s": 1.5},
        ),
    ]
    with gateways(
        "faults",
        profiles=profiles,
        secrets_=["sk-faults-secret-99"],
        policy_extra='allow_opaque_profiles = ["primary"]\n',
    ) as started:
        yield started


def _sid(mock: MockProviderServer, *steps: dict[str, Any]) -> str:
    sid = "f" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, list(steps))
    return sid


def _records(mock: MockProviderServer, sid: str) -> list[Any]:
    return [r for r in mock.state.records() if r.scenario == sid]


def _post(
    env: Env,
    gateway: GatewayThread,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    path: str = "/v1/chat/completions",
    timeout: float = 30,
) -> httpx2.Response:
    client = raw_client(gateway, env)
    client.timeout = httpx2.Timeout(timeout)
    return client.post(path, json=body, headers={"authorization": f"Bearer {env.gateway_key}", **(headers or {})})


def _chat(sid: str, stream: bool = False) -> dict[str, Any]:
    return {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}


def test_strict_stream_first_byte_after_upstream_last_byte(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": "a slow, dripping answer", "chunk_size": 2, "drip_ms": 40})
    client = raw_client(gateway, env)
    started = time.monotonic()
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json=_chat(sid, stream=True),
        headers={"authorization": f"Bearer {env.gateway_key}"},
    ) as response:
        first_byte = None
        chunks = []
        for chunk in response.iter_raw():
            if first_byte is None:
                first_byte = time.monotonic()
            chunks.append(chunk)
    assert response.status_code == 200 and first_byte is not None
    record = _records(mock, sid)[-1]
    assert record.finished and record.last_write_at is not None
    # Nothing reached the client before the upstream began writing its final bytes...
    assert first_byte >= record.last_write_at
    # ...and the drip really was slow (13 events x 40 ms), so streaming through would show.
    assert first_byte - started >= 0.4
    assert b"data: [DONE]" in b"".join(chunks)


@pytest.mark.parametrize(
    "fault_step",
    [
        {"text": "x" * 400, "chunk_size": 1, "drip_ms": 20},  # slow stream, disconnect mid-buffering
        {"fault": "hang_after_headers"},
        {"fault": "hang"},
    ],
)
def test_client_disconnect_cancels_upstream(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, fault_step: dict[str, Any]
) -> None:
    env, gateway = gw
    sid = _sid(mock, fault_step)
    with pytest.raises(httpx2.TimeoutException):
        _post(env, gateway, _chat(sid, stream=True), timeout=0.6)
    assert mock.state.wait_for(lambda recs: any(r.scenario == sid and r.cancelled for r in recs), timeout=5)
    deadline = time.monotonic() + 5
    while gateway.pending_tasks() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gateway.pending_tasks() == []
    assert gateway.running is not None
    from gateway.state import CAPACITY

    assert gateway.running.app[CAPACITY].in_use == 0


def test_429_then_success_is_retried(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"status": 429, "headers": {"retry-after-ms": "30"}}, {"text": "ok after retry"})
    result = openai_client(gateway, env).chat.completions.create(**_chat(sid))
    assert result.choices[0].message.content == "ok after retry"
    assert [r.status for r in _records(mock, sid)] == [429, 200]


def test_500_reaches_fallback_profile(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    # primary: 1 try + 2 retries, all 500; then the fallback profile gets the 4th answer.
    sid = _sid(mock, {"status": 500}, {"status": 500}, {"status": 500}, {"text": "from the fallback"})
    result = openai_client(gateway, env).chat.completions.create(**_chat(sid))
    assert result.choices[0].message.content == "from the fallback"
    assert [r.status for r in _records(mock, sid)] == [500, 500, 500, 200]
    metrics = raw_client(gateway, env).get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
    assert 'wiregate_upstream_attempts_total{outcome="response",profile="backup"}' in metrics


def test_fallback_target_is_checked_again(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """The primary profile accepts opaque content (an image); the fallback does not. After
    the primary fails, before_send runs again for the fallback and withholds."""
    env, gateway = gw
    sid = _sid(mock, {"status": 500})
    body = {
        "model": "gpt-4.1",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"describe mock-scenario:{sid}"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                ],
            }
        ],
    }
    r = _post(env, gateway, body)
    assert r.status_code == 422
    assert r.json()["error"]["reason_codes"] == ["opaque_content"]
    assert len(_records(mock, sid)) == 3  # only the primary's attempts; the fallback got nothing


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", ["reset_mid_stream", "truncated_json"])
def test_broken_upstream_releases_nothing_partial(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, stream: bool, fault: str
) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": "partial answer that never completes", "fault": fault, "chunk_size": 4})
    r = _post(env, gateway, _chat(sid, stream=stream))
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["code"] == "response_incomplete" and "response_incomplete" in error["reason_codes"]
    assert "partial" not in r.text and "data:" not in r.text


def test_sdk_maps_incomplete_to_server_error(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"fault": "reset_mid_stream", "text": "abc def ghi"})
    with pytest.raises(openai.InternalServerError) as info:
        list(openai_client(gateway, env).chat.completions.create(**_chat(sid, stream=True)))
    assert info.value.status_code == 503


@pytest.mark.parametrize("fault", ["hang", "hang_after_headers"])
def test_hang_hits_the_time_limit(gw: tuple[Env, GatewayThread], mock: MockProviderServer, fault: str) -> None:
    env, gateway = gw
    sid = _sid(mock, {"fault": fault})
    started = time.monotonic()
    r = _post(env, gateway, _chat(sid, stream=True), headers={"x-wiregate-profile": "hangy"})
    elapsed = time.monotonic() - started
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert elapsed < 5  # the profile's 0.5 s read / 1.5 s total limits, not forever
    assert mock.state.wait_for(lambda recs: any(x.scenario == sid and x.cancelled for x in recs), timeout=5)


def test_concurrency_limit_refuses_instead_of_queueing(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    env = make_env(config_extra="[limits]\nconcurrent_buffered_responses = 1\n")
    gateway = gateway_for(env)
    sid = _sid(mock, {"text": "slow one", "chunk_size": 1, "drip_ms": 60})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(_post, env, gateway, _chat(sid, stream=True))
        assert mock.state.wait_for(lambda recs: any(x.scenario == sid for x in recs), timeout=5)
        r = _post(env, gateway, {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["reason_codes"] == ["capacity_exceeded"]
        assert slow.result(30).status_code == 200
    ok = _post(env, gateway, {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200


def test_unreadable_provider_error_is_not_relayed(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"status": 502, "raw_body": "<html>proxy says no</html>", "content_type": "text/html"})
    r = _post(env, gateway, _chat(sid), headers={"x-wiregate-profile": "hangy"})
    assert r.status_code == 502 and "proxy says no" not in r.text
    assert r.json()["error"]["reason_codes"] == ["upstream_invalid_response"]
    assert json.loads(r.text)["error"]["type"] == "server_error"


@pytest.mark.parametrize("status", [299, 600, 999])
@pytest.mark.parametrize("stream", [False, True])
def test_a_status_outside_what_http_defines_is_not_relayed(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, status: int, stream: bool
) -> None:
    """A readable body under a status no SDK knows how to read (600 and up) is not released
    with it: 502 `upstream_invalid_response`, as for a redirect. An unusual 2xx is a success."""
    env, gateway = gw
    sid = _sid(mock, {"status": status, "text": "a readable answer"})
    r = _post(env, gateway, _chat(sid, stream=stream), headers={"x-wiregate-profile": "single"})
    if status < 300:
        assert r.status_code == status and ("a readable answer" in r.text or stream)
    else:
        assert r.status_code == 502 and r.json()["error"]["reason_codes"] == ["upstream_invalid_response"]
        assert "a readable answer" not in r.text


# --- a provider error event in the middle of a stream ---------------------------------------

_LEAD = "a first half that must never be released"


def _ev(data: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def _chat_error_events() -> list[str]:
    chunk = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": _LEAD}}]}
    error = {"error": {"message": "server had an error", "type": "server_error", "code": None}}
    return [_ev(chunk), _ev(error), "data: [DONE]\n\n"]


def _messages_error_events() -> list[str]:
    start = {"type": "message_start", "message": {"id": "m1", "type": "message", "role": "assistant", "content": []}}
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": _LEAD}}
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return [
        _ev(start, "message_start"),
        _ev(block, "content_block_start"),
        _ev(delta, "content_block_delta"),
        _ev(error, "error"),
    ]


def _responses_error_events(terminal: str) -> list[str]:
    created = {"type": "response.created", "response": {"id": "r1", "status": "in_progress"}}
    delta = {"type": "response.output_text.delta", "output_index": 0, "content_index": 0, "delta": _LEAD}
    end: dict[str, Any]
    if terminal == "error":
        end = {"type": "error", "code": "server_error", "message": "boom", "param": None}
    else:
        end = {
            "type": "response.failed",
            "response": {"id": "r1", "status": "failed", "error": {"code": "server_error", "message": "boom"}},
        }
    return [_ev(created, "response.created"), _ev(delta, "response.output_text.delta"), _ev(end, terminal)]


_ERROR_STREAMS: dict[str, tuple[str, Any]] = {
    "chat": ("/v1/chat/completions", _chat_error_events),
    "messages": ("/v1/messages", _messages_error_events),
    "responses-error": ("/v1/responses", lambda: _responses_error_events("error")),
    "responses-failed": ("/v1/responses", lambda: _responses_error_events("response.failed")),
}


def _stream_body(path: str, sid: str) -> dict[str, Any]:
    prompt = f"mock-scenario:{sid}"
    if path == "/v1/messages":
        return {
            "model": "claude-x",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": prompt}],
        }
    if path == "/v1/responses":
        return {"model": "gpt-5", "stream": True, "input": prompt}
    return _chat(sid, stream=True)


@pytest.mark.parametrize("case", sorted(_ERROR_STREAMS))
def test_error_event_mid_stream_is_incomplete(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, case: str
) -> None:
    env, gateway = gw
    path, events = _ERROR_STREAMS[case]
    sid = _sid(mock, {"raw_events": events()})
    r = _post(env, gateway, _stream_body(path, sid), path=path)
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    error = body["error"]
    assert error["code"] == "response_incomplete" and error["reason_codes"] == ["response_incomplete"]
    assert _LEAD not in r.text and "data:" not in r.text


def test_error_event_mid_stream_raises_in_the_sdks(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"raw_events": _chat_error_events()})
    with pytest.raises(openai.InternalServerError):
        list(openai_client(gateway, env).chat.completions.create(**_chat(sid, stream=True)))
    sid = _sid(mock, {"raw_events": _messages_error_events()})
    with pytest.raises(anthropic.InternalServerError) as info:
        stream = anthropic_client(gateway, env).messages.create(
            model="claude-x", max_tokens=20, stream=True, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        )
        list(stream)
    assert info.value.status_code == 503


# --- an answer framed other than the client asked ------------------------------------------


def test_a_success_framed_other_than_the_client_asked_is_refused(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """An event stream to a call that did not ask for one (or a JSON body to one that did)
    is no answer the client can read: 502 `upstream_invalid_response`, never released as it
    came; the same answers framed as asked go through."""
    env, gateway = gw
    events = [
        chat_chunk_event({"role": "assistant", "content": "framed as a stream"}),
        chat_chunk_event({}, "stop"),
        "data: [DONE]\n\n",
    ]
    body = json.dumps(
        {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4.1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a body"}, "finish_reason": "stop"}],
        }
    )
    for step, asked_stream in (({"raw_events": events}, False), ({"raw_body": body}, True)):
        r = _post(env, gateway, _chat(_sid(mock, step), stream=asked_stream))
        assert r.status_code == 502, (asked_stream, r.text)
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["reason_codes"] == ["upstream_invalid_response"]
        assert "framed as a stream" not in r.text and "a body" not in r.text
        r = _post(env, gateway, _chat(_sid(mock, step), stream=not asked_stream))
        assert r.status_code == 200, r.text
    with pytest.raises(openai.InternalServerError):
        openai_client(gateway, env).chat.completions.create(**_chat(_sid(mock, {"raw_events": events})))


# --- a long retry-after that the caller would not wait for ----------------------------------


def test_long_retry_after_goes_back_when_the_sdk_would_time_out(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """The SDK declares a 2 s timeout; the provider asks for 4 s (within the profile's
    max_retry_after_s). Sleeping would outlast the caller: the 429 goes back at once.
    (With a fallback profile the call moves on to it instead, without waiting.)"""
    env, gateway = gw
    sid = _sid(mock, {"status": 429, "headers": {"retry-after": "4"}}, {"text": "too late to matter"})
    client = openai_client(gateway, env, timeout=2.0, default_headers={"x-wiregate-profile": "single"})
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(**_chat(sid))
    assert info.value.response.headers["retry-after"] == "4"
    assert [r.status for r in _records(mock, sid)] == [429]
    sid = _sid(mock, {"status": 429, "headers": {"retry-after": "4"}}, {"text": "too late to matter"})
    with pytest.raises(anthropic.RateLimitError):
        anthropic_client(gateway, env, timeout=2.0).messages.create(
            model="claude-x", max_tokens=20, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        )
    assert [r.status for r in _records(mock, sid)] == [429]


def test_retry_after_that_fits_the_declared_timeout_is_waited(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    sid = _sid(mock, {"status": 429, "headers": {"retry-after-ms": "50"}}, {"text": "worth the wait"})
    r = _post(env, gateway, _chat(sid), headers={"x-stainless-read-timeout": "20"})
    assert r.status_code == 200 and "worth the wait" in r.text
    assert [r.status for r in _records(mock, sid)] == [429, 200]


# --- the gateway's retries do not multiply with the SDK's -----------------------------------

_BUDGET = 1 + 2  # the first try and FAST_RETRY's two retries (tests.harness)


def _persistent(mock: MockProviderServer, status: int) -> str:
    # The mock repeats a scenario's last step: a persistent failure.
    return _sid(mock, {"status": status, "headers": {"retry-after-ms": "10"}})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [429, 500, 503])
def test_openai_sdk_does_not_retry_what_the_gateway_retried(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, status: int, stream: bool
) -> None:
    env, gateway = gw
    sid = _persistent(mock, status)
    client = openai_client(gateway, env, max_retries=openai.DEFAULT_MAX_RETRIES)
    with pytest.raises(openai.APIStatusError) as info:
        list(client.with_options(default_headers={"x-wiregate-profile": "single"}).chat.completions.create(
            **_chat(sid, stream=stream)
        ))  # fmt: skip
    assert info.value.status_code == status
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(_records(mock, sid)) == _BUDGET


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status", [429, 503, 529])
def test_anthropic_sdk_does_not_retry_what_the_gateway_retried(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, status: int, stream: bool
) -> None:
    env, gateway = gw
    sid = _persistent(mock, status)
    client = anthropic_client(gateway, env, max_retries=anthropic.DEFAULT_MAX_RETRIES)
    with pytest.raises(anthropic.APIStatusError) as info:
        result = client.messages.create(
            model="claude-x",
            max_tokens=20,
            stream=stream,
            messages=[{"role": "user", "content": f"mock-scenario:{sid}"}],
        )
        if stream:
            list(result)
    assert info.value.status_code == status
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(_records(mock, sid)) == _BUDGET


def test_a_single_attempt_leaves_retrying_to_the_sdk(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """Nothing was retried here (a 4xx the gateway does not retry): no advice is added."""
    env, gateway = gw
    sid = _sid(mock, {"status": 409})
    r = _post(env, gateway, _chat(sid), headers={"x-wiregate-profile": "single"})
    assert r.status_code == 409 and "x-should-retry" not in r.headers
    assert len(_records(mock, sid)) == 1


# --- the error type says what the reason says, per carrier ----------------------------------

_CARRIER_PATHS = ["/v1/chat/completions", "/v1/messages", "/v1/responses"]


def _error_type(r: httpx2.Response) -> str:
    return str(r.json()["error"]["type"])


@pytest.mark.parametrize("path", _CARRIER_PATHS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", ["reset_mid_stream", "truncated_json"])
def test_incomplete_response_error_type(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, path: str, stream: bool, fault: str
) -> None:
    """Cut short, with a secret in the fragment: still `response_incomplete`, a server error
    (api_error / server_error), never a permission or overload error."""
    env, gateway = gw
    sid = _sid(mock, {"text": "partial sk-faults-secret-99 answer " * 3, "fault": fault, "chunk_size": 4})
    body = _stream_body(path, sid)
    body["stream"] = stream
    r = _post(env, gateway, body, path=path)
    assert r.status_code == 503 and r.json()["error"]["code"] == "response_incomplete"
    assert "response_incomplete" in r.json()["error"]["reason_codes"]
    assert _error_type(r) == ("api_error" if path == "/v1/messages" else "server_error")
    assert "sk-faults-secret-99" not in r.text and "partial" not in r.text


@pytest.mark.parametrize("path", _CARRIER_PATHS)
def test_upstream_failures_error_type(gw: tuple[Env, GatewayThread], mock: MockProviderServer, path: str) -> None:
    env, gateway = gw
    anthropic_ = path == "/v1/messages"
    profile = {"x-wiregate-profile": "hangy-anthropic" if anthropic_ else "hangy"}
    sid = _sid(mock, {"fault": "hang"})
    r = _post(env, gateway, _stream_body(path, sid), path=path, headers=profile)
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_timeout"
    assert _error_type(r) == ("timeout_error" if anthropic_ else "server_error")
    sid = _sid(mock, {"status": 502, "raw_body": "<html>no</html>", "content_type": "text/html"})
    r = _post(env, gateway, _stream_body(path, sid), path=path, headers=profile)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    assert _error_type(r) == ("api_error" if anthropic_ else "server_error")


# --- a connection reset before headers: the request may have reached the provider -----------


@pytest.mark.parametrize("path", _CARRIER_PATHS)
def test_reset_before_headers_is_not_resent_by_default(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, path: str
) -> None:
    """The provider read the request and dropped the connection: resending could generate
    (and bill) twice. By default the gateway fails closed with one attempt, a provider-shaped
    502, and tells the SDK not to resend either."""
    env, gateway = gw
    profile = "mock-anthropic" if path == "/v1/messages" else "single"
    sid = _sid(mock, {"fault": "reset_before_headers"}, {"text": "a second generation"})
    r = _post(
        env, gateway, _stream_body(path, sid) | {"stream": False}, path=path, headers={"x-wiregate-profile": profile}
    )
    assert r.status_code == 502
    error = r.json()["error"]
    assert error["code"] == "upstream_unavailable" and error["reason_codes"] == ["upstream_reset"]
    assert error["type"] == ("api_error" if path == "/v1/messages" else "server_error")
    assert r.headers["x-should-retry"] == "false"
    assert len(_records(mock, sid)) == 1


def test_reset_before_headers_is_resent_when_the_profile_allows(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    profile = mock_profile("resends", "openai", mock.url)
    profile["retry"]["resend_after_reset"] = True
    env = make_env(profiles=[profile])
    gateway = gateway_for(env)
    sid = _sid(mock, {"fault": "reset_before_headers"}, {"text": "answered on the resend"})
    result = openai_client(gateway, env).chat.completions.create(**_chat(sid))
    assert result.choices[0].message.content == "answered on the resend"
    assert [r.status for r in _records(mock, sid)] == [None, 200]


def test_sdk_sees_the_reset_as_a_server_error(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"fault": "reset_before_headers"})
    client = openai_client(gateway, env, max_retries=2, default_headers={"x-wiregate-profile": "single"})
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(**_chat(sid))
    assert info.value.status_code == 502
    assert len(_records(mock, sid)) == 1  # neither the gateway nor the SDK resent it


# --- a timeout once the request was written: it may have reached the provider too ----------

_PATIENT_RETRY = {"attempts": 2, "backoff_initial_ms": 10, "backoff_max_ms": 50}


def _timeout_profiles(mock: MockProviderServer, name: str, timeouts: dict[str, float], **retry: Any) -> list[Any]:
    return [
        mock_profile(name, "openai", mock.url, retry=_PATIENT_RETRY | retry, timeouts=timeouts, fallbacks=["backup"]),
        mock_profile("backup", "openai", mock.url),
    ]


@pytest.mark.parametrize(
    "timeouts",
    [{"connect_s": 2, "read_s": 0.5, "total_s": 10}, {"connect_s": 2, "read_s": 10, "total_s": 1.0}],
    ids=["read_s", "total_s"],
)
def test_timeout_before_headers_is_not_resent_by_default(
    mock: MockProviderServer, make_env: Any, gateway_for: Any, timeouts: dict[str, float]
) -> None:
    """The provider holds the whole request and has not answered when the read timeout (or
    the attempt's total) passes: like a reset at that point, neither a retry, nor the
    fallback profile, nor the SDK sends it again."""
    env = make_env(profiles=_timeout_profiles(mock, "patient", timeouts))
    gateway = gateway_for(env)
    sid = _sid(mock, {"fault": "hang"}, {"text": "a second generation"})
    client = openai_client(gateway, env, max_retries=2, default_headers={"x-wiregate-profile": "patient"})
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**_chat(sid))
    assert info.value.status_code == 503 and info.value.response.headers["x-should-retry"] == "false"
    assert info.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    assert len(_records(mock, sid)) == 1


def test_timeout_before_headers_is_resent_when_the_profile_allows(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    profiles = _timeout_profiles(
        mock, "resends", {"connect_s": 2, "read_s": 0.5, "total_s": 10}, attempts=1, resend_after_reset=True
    )
    env = make_env(profiles=profiles)
    gateway = gateway_for(env)
    sid = _sid(mock, {"fault": "hang"}, {"text": "answered on the resend"})
    client = openai_client(gateway, env, default_headers={"x-wiregate-profile": "resends"})
    result = client.chat.completions.create(**_chat(sid))
    assert result.choices[0].message.content == "answered on the resend"
    assert [r.status for r in _records(mock, sid)] == [None, 200]


def test_a_retry_after_longer_than_the_attempts_total_goes_back_at_once(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    """A 429 whose wait would outlast the profile's `total_s` is the answer: the client gets
    the provider's 429 and its retry-after, not a timeout after a wait cut short."""
    profile = mock_profile(
        "brief", "openai", mock.url, retry=_PATIENT_RETRY, timeouts={"connect_s": 2, "read_s": 5, "total_s": 1.5}
    )
    env = make_env(profiles=[profile])
    gateway = gateway_for(env)
    sid = _sid(mock, {"status": 429, "headers": {"retry-after": "3"}}, {"text": "too late"})
    r = _post(env, gateway, _chat(sid))
    assert r.status_code == 429 and r.headers["retry-after"] == "3"
    assert [x.status for x in _records(mock, sid)] == [429]


# --- the fault matrix: every carrier, streaming or not, through the official SDKs ------------
#
# Each case asserts the SDK's exception class (or, where the gateway can check and release,
# the answer), that no unchecked text reached the client, and that the call left nothing
# behind in the gateway: no task, no buffered-response slot, no upstream connection in use,
# no file descriptor beyond what the connection pools keep.

MARK = "UNRELEASED-MARKER"
_CARRIERS = ("chat", "messages", "responses")
_STREAM_ONLY = frozenset({"cut_sse_event", "error_event"})
_HANGS = frozenset({"hang_before_headers", "hang_mid_stream"})


def _events_without_end(carrier: str) -> list[str]:
    """A carrier's events up to (not including) its terminal event, with MARK as text."""
    if carrier == "chat":
        chunk = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": MARK}}]}
        return [_ev(chunk)]
    if carrier == "messages":
        return [e.replace(_LEAD, MARK) for e in _messages_error_events()[:-1]]
    return [e.replace(_LEAD, MARK) for e in _responses_error_events("error")[:-1]]


def _error_event_stream(carrier: str) -> list[str]:
    events = {"chat": _chat_error_events, "messages": _messages_error_events}.get(carrier)
    built = events() if events is not None else _responses_error_events("response.failed")
    return [e.replace(_LEAD, MARK) for e in built]


def _plain_body(carrier: str, text: str) -> str:
    if carrier == "chat":
        message = {"role": "assistant", "content": text}
        doc: dict[str, Any] = {
            "id": "c1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4.1",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        }
    elif carrier == "messages":
        doc = {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    else:
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {"type": "message", "id": "i1", "status": "completed", "role": "assistant", "content": [part]}
        doc = {"id": "r1", "object": "response", "created_at": 0, "status": "completed", "model": "gpt-5"}
        doc.update(
            {"output": [item], "error": None, "incomplete_details": None, "tools": [], "parallel_tool_calls": True}
        )
    return json.dumps(doc)


def _matrix_step(fault: str, carrier: str) -> tuple[dict[str, Any], ...]:
    text = {"text": f"{MARK} " * 8, "chunk_size": 4}
    steps: dict[str, dict[str, Any]] = {
        "429_retry_after": {"status": 429, "headers": {"retry-after": "0"}},
        "500": {"status": 500},
        "502": {"status": 502},
        "503": {"status": 503},
        "529": {"status": 529},
        "reset_before_headers": {"fault": "reset_before_headers"},
        "reset_mid_body": {**text, "fault": "reset_mid_stream"},
        "truncated_json": {**text, "fault": "truncated_json"},
        "cut_sse_event": {"raw_events": [*_events_without_end(carrier), f'data: {{"cut": "{MARK}']},
        "hang_before_headers": {"fault": "hang"},
        "hang_mid_stream": {**text, "fault": "hang_after_headers"},
        "error_event": {"raw_events": _error_event_stream(carrier)},
        "non_json_200": {"raw_body": f"<html>{MARK}</html>", "content_type": "text/html"},
        # A readable JSON body and a Location: neither followed nor relayed.
        "redirect": {
            "status": 307,
            "headers": {"location": f"http://127.0.0.1:9/{MARK}"},
            "raw_body": json.dumps({"moved": MARK}),
            "content_type": "application/json",
        },
        "wrong_content_type": {"raw_body": _plain_body(carrier, "typed wrong"), "content_type": "text/plain"},
        "wrong_content_type_stream": {"raw_events": _events_without_end(carrier), "content_type": "application/json"},
    }
    return (steps[fault],)


_FAULTS = (
    "429_retry_after", "500", "502", "503", "529", "reset_before_headers", "reset_mid_body", "truncated_json",
    "cut_sse_event", "hang_before_headers", "hang_mid_stream", "error_event", "non_json_200", "wrong_content_type",
    "redirect",
)  # fmt: skip


def _expected(fault: str, carrier: str, stream: bool) -> tuple[int, type[Exception] | None]:
    """(status the SDK sees, the exception class it raises; None: the checked answer)."""
    anthropic_ = carrier == "messages"
    if fault == "wrong_content_type" and not stream:
        return 200, None  # valid JSON, checked, released as application/json
    statuses = {
        "429_retry_after": 429, "500": 500, "502": 502, "503": 503, "529": 529, "reset_before_headers": 502,
        "redirect": 502,
    }  # fmt: skip
    status = statuses.get(fault, 503)
    if status == 429:
        return status, anthropic.RateLimitError if anthropic_ else openai.RateLimitError
    if status == 529 and anthropic_:
        return status, anthropic.OverloadedError
    if status == 503 and anthropic_:
        return status, anthropic.ServiceUnavailableError
    return status, anthropic.InternalServerError if anthropic_ else openai.InternalServerError


def _matrix_call(gateway: GatewayThread, env: Env, carrier: str, stream: bool, sid: str, profile: str) -> str:
    """One SDK call (the stream read to its end); returns the answer's text."""
    prompt = f"mock-scenario:{sid}"
    headers = {"x-wiregate-profile": profile}
    if carrier == "messages":
        with anthropic_client(gateway, env, default_headers=headers) as aclient:
            if stream:
                with aclient.messages.stream(
                    model="claude-x", max_tokens=20, messages=[{"role": "user", "content": prompt}]
                ) as events:
                    return "".join(events.text_stream)
            message = aclient.messages.create(
                model="claude-x", max_tokens=20, messages=[{"role": "user", "content": prompt}]
            )
            return "".join(getattr(block, "text", "") for block in message.content)
    with openai_client(gateway, env, default_headers=headers) as client:
        if carrier == "chat":
            if stream:
                parts = client.chat.completions.create(
                    model="gpt-4.1", stream=True, messages=[{"role": "user", "content": prompt}]
                )
                return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
            done = client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": prompt}])
            return done.choices[0].message.content or ""
        if stream:
            with client.responses.stream(model="gpt-5", input=prompt) as rs:
                return rs.get_final_response().output_text
        return client.responses.create(model="gpt-5", input=prompt).output_text


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settled(gateway: GatewayThread, fds_before: int) -> list[str]:
    """What the call left behind, once the gateway has had a moment to tidy up."""
    from gateway.proxy.upstream import UPSTREAM
    from gateway.state import CAPACITY

    assert gateway.running is not None
    app = gateway.running.app
    connector = app[UPSTREAM].session.connector
    assert connector is not None
    left: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [f"task {t}" for t in gateway.pending_tasks()]
        if app[CAPACITY].in_use:
            left.append("buffered-response slot")
        if connector._acquired:  # aiohttp keeps the connections in use here
            left.append("upstream connection in use")
        # The pools may keep one idle upstream connection (two descriptors in this process,
        # the gateway's end and the mock's) beyond what was open before.
        if _open_fds() > fds_before + 2:
            left.append(f"descriptors {_open_fds()} > {fds_before} + 2")
        if not left:
            return []
        time.sleep(0.05)
    return left


@pytest.mark.parametrize(
    ("stream", "fault"),
    [(stream, fault) for stream in (False, True) for fault in _FAULTS if stream or fault not in _STREAM_ONLY],
    ids=lambda v: ("stream" if v else "json") if isinstance(v, bool) else v,
)
@pytest.mark.parametrize("carrier", _CARRIERS)
def test_fault_matrix(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, carrier: str, stream: bool, fault: str
) -> None:
    env, gateway = gw
    step = fault + ("_stream" if fault == "wrong_content_type" and stream else "")
    sid = _sid(mock, *_matrix_step(step, carrier))
    if carrier == "messages":
        profile = "hangy-anthropic" if fault in _HANGS else "mock-anthropic"
    else:
        profile = "hangy" if fault in _HANGS else "single"
    status, raises = _expected(fault, carrier, stream)
    fds_before = _open_fds()
    if raises is None:
        assert _matrix_call(gateway, env, carrier, stream, sid, profile) == "typed wrong"
    else:
        with pytest.raises(raises) as info:
            _matrix_call(gateway, env, carrier, stream, sid, profile)
        error = info.value
        assert isinstance(error, (openai.APIStatusError, anthropic.APIStatusError))
        assert error.status_code == status
        assert MARK not in error.message and MARK not in json.dumps(error.body)
        if fault == "redirect":  # not followed, not retried (by the gateway or, told so, the SDK), not relayed
            assert [r.status for r in _records(mock, sid)] == [307]
            assert "location" not in error.response.headers and error.response.headers["x-should-retry"] == "false"
    assert _settled(gateway, fds_before) == []


@pytest.mark.parametrize("first", [{"status": 500}, {"status": 429, "headers": {"retry-after": "0"}}])
def test_a_deadline_mid_retry_keeps_the_attempts_made(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, first: dict[str, Any]
) -> None:
    """The profile's total runs out while its second attempt hangs: the answer is a 503
    timeout that still counts both attempts — the metrics say so, and the SDK is told not
    to retry what the gateway already retried."""
    env, gateway = gw
    assert gateway.running is not None
    attempts = gateway.running.app[METRICS].upstream_attempts
    before = {o: attempts.labels("impatient", o)._value.get() for o in ("retry", "timeout")}
    sid = _sid(mock, first, {"fault": "hang"})
    client = openai_client(gateway, env, max_retries=2).with_options(
        default_headers={"x-wiregate-profile": "impatient"}
    )
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**_chat(sid))
    assert info.value.status_code == 503 and info.value.response.headers["x-should-retry"] == "false"
    assert info.value.body["code"] == "upstream_timeout"  # type: ignore[index]
    assert len(_records(mock, sid)) == 2  # the SDK sent nothing again
    assert attempts.labels("impatient", "retry")._value.get() == before["retry"] + 1
    assert attempts.labels("impatient", "timeout")._value.get() == before["timeout"] + 1


@pytest.fixture(scope="module")
def total(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    timeouts = {"connect_s": 1, "read_s": 5, "total_s": 1.0}
    profiles = [
        mock_profile(name, "openai", mock.url, timeouts=timeouts, retry={"attempts": 0}, **extra)
        for name, extra in (("strict", {}), ("windowed", {"release": "windowed"}), ("observed", {}))
    ]
    policy = '[profile_modes.observed]\nbefore_release = "observe"\n'
    with gateways("faults-total", profiles=profiles, policy_extra=policy) as started:
        yield started


@pytest.mark.parametrize("profile", ["strict", "windowed", "observed"])
def test_a_profile_total_covers_the_whole_attempt_in_every_mode(
    total: tuple[Env, GatewayThread], mock: MockProviderServer, profile: str
) -> None:
    """`timeouts.total_s` is the whole attempt, reading the body included: a provider that
    trickles a stream past it is cut there, whether the stream is buffered, released in
    windows or passed through in observe mode (it once bounded only the wait for headers)."""
    env, gateway = total
    sid = "tot" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"text": "y" * 40, "chunk_size": 1, "drip_ms": 100}])  # four seconds
    body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"hi mock-scenario:{sid}"}]}
    headers = {"authorization": f"Bearer {env.gateway_key}", "x-wiregate-profile": profile}
    try:
        answer = raw_client(gateway, env).post("/v1/chat/completions", json=body, headers=headers)
        text, status = answer.text, answer.status_code
    except httpx2.RemoteProtocolError:  # observe: cut mid-stream, never ended cleanly
        text, status = "", 200
    if profile == "strict":
        assert status == 503 and "buffer_timeout" in text, text
    else:
        assert text.count("y") < 40  # ended before the provider did
        assert "[DONE]" not in text
