"""Long strict streams: SSE comment heartbeats while buffering; once headers are out, a
block (or a broken upstream) becomes the protocol's own error event and the stream ends."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, raw_client

SECRET = "sk-heartbeat-SECRET-777"
BEATS = "[streaming]\nheartbeat_after_s = 0.1\nheartbeat_every_s = 0.1\nheartbeat_stall_s = 1.0\n"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("beats", secrets_=[SECRET], config_extra=BEATS) as started:
        yield started


ROUTES = {
    "chat": (
        "/v1/chat/completions",
        lambda c: {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": c}]},
    ),
    "responses": ("/v1/responses", lambda c: {"model": "gpt-5", "stream": True, "input": c}),
    "messages": (
        "/v1/messages",
        lambda c: {
            "model": "claude-test-model",
            "max_tokens": 50,
            "stream": True,
            "messages": [{"role": "user", "content": c}],
        },
    ),
}


def _slow(mock: MockProviderServer, **step: Any) -> str:
    sid = "h" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"chunk_size": 2, "drip_ms": 30, **step}])
    return sid


def _stream(env: Env, gateway: GatewayThread, route: str, sid: str) -> tuple[int, bytes]:
    path, body = ROUTES[route]
    r = raw_client(gateway, env).post(
        path, json=body(f"mock-scenario:{sid}"), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    return r.status_code, r.content


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_heartbeats_then_the_checked_stream(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str
) -> None:
    env, gateway = gw
    status, body = _stream(env, gateway, route, _slow(mock, text="a perfectly fine answer"))
    assert status == 200
    assert body.startswith(sse.HEARTBEAT)
    events, clean = sse.parse_all(body)
    assert clean and events
    assert "error" not in (events[-1].event or "")
    folded_text = "".join(
        (json.loads(e.data).get("delta") or {}).get("text", "")
        if route == "messages"
        else (
            json.loads(e.data).get("delta", "")
            if route == "responses" and e.event == "response.output_text.delta"
            else "".join((ch.get("delta") or {}).get("content") or "" for ch in json.loads(e.data).get("choices", []))
            if route == "chat" and e.data != "[DONE]"
            else ""
        )
        for e in events
    )
    assert folded_text == "a perfectly fine answer"


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_block_after_headers_is_an_error_event(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str
) -> None:
    env, gateway = gw
    status, body = _stream(env, gateway, route, _slow(mock, text=f"leaking {SECRET} now"))
    assert status == 200  # headers went out with the first heartbeat
    assert body.startswith(sse.HEARTBEAT) and SECRET.encode() not in body
    events, clean = sse.parse_all(body)
    assert clean and len(events) == 1  # nothing of the response, only the error event
    payload = json.loads(events[0].data)
    assert "response_blocked" in json.dumps(payload) and "secret_value" in json.dumps(payload)
    if route != "chat":
        assert events[0].event == "error"


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_broken_upstream_after_headers_is_an_error_event(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str
) -> None:
    env, gateway = gw
    status, body = _stream(env, gateway, route, _slow(mock, text="x" * 40, fault="reset_mid_stream"))
    assert status == 200
    events, _ = sse.parse_all(body)
    assert len(events) == 1 and "response_incomplete" in events[0].data


def test_sdks_raise_on_the_error_event(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _slow(mock, text=f"leaking {SECRET}")
    with pytest.raises(openai.APIError) as info:
        for _ in openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1", stream=True, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        ):
            pass
    assert "response_blocked" in json.dumps(info.value.body)
    sid = _slow(mock, text=f"leaking {SECRET}")
    with pytest.raises(openai.APIError):
        with openai_client(gateway, env).responses.stream(model="gpt-5", input=f"mock-scenario:{sid}") as s:
            s.get_final_response()
    sid = _slow(mock, text=f"leaking {SECRET}")
    with (
        pytest.raises(anthropic.APIStatusError) as ainfo,
        anthropic_client(gateway, env).messages.stream(
            model="claude-test-model", max_tokens=20, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        ) as s,
    ):
        s.get_final_message()
    assert "response_blocked" in json.dumps(ainfo.value.body)


def test_fast_streams_get_no_heartbeat(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = "q" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"text": f"quick {SECRET}"}])
    status, body = _stream(env, gateway, "chat", sid)
    assert status == 403 and b"response_blocked" in body  # no heartbeat was needed: a plain 403


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_stalled_upstream_stops_the_heartbeats(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str
) -> None:
    """The upstream sends its first event, then nothing (its read limit is 5 s). Heartbeats
    stop after `heartbeat_stall_s` (1 s) without upstream bytes, so the client's own read
    timeout (2.5 s) fires instead of being fed keep-alives until the upstream read limit."""
    env, gateway = gw
    sid = _slow(mock, text="never finished", fault="hang_after_headers")
    path, body = ROUTES[route]
    client = raw_client(gateway, env)
    client.timeout = httpx2.Timeout(30, read=2.5)
    received: list[bytes] = []
    with pytest.raises(httpx2.ReadTimeout):
        with client.stream(
            "POST", path, json=body(f"mock-scenario:{sid}"), headers={"authorization": f"Bearer {env.gateway_key}"}
        ) as response:
            assert response.status_code == 200
            received.extend(response.iter_raw())
    assert b"".join(received).startswith(sse.HEARTBEAT)  # it did beat while the upstream moved
    assert b"never" not in b"".join(received)
    assert mock.state.wait_for(lambda recs: any(r.scenario == sid and r.cancelled for r in recs), timeout=10)


def test_the_sdk_times_out_on_a_stalled_upstream(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _slow(mock, text="never finished", fault="hang_after_headers")
    client = openai_client(gateway, env, timeout=httpx2.Timeout(30, read=2.5))
    with pytest.raises((openai.APITimeoutError, httpx2.ReadTimeout)):
        for _ in client.chat.completions.create(
            model="gpt-4.1", stream=True, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        ):
            pass


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("fault", ["reset_mid_stream", "truncated_json"])
def test_in_stream_incomplete_error_type(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, fault: str
) -> None:
    """After heartbeats the status is 200: the event's type is all that says what happened.
    A stream cut short (with a secret in its fragment) is a provider failure."""
    env, gateway = gw
    status, body = _stream(env, gateway, route, _slow(mock, text=f"leaking {SECRET} " * 3, fault=fault))
    assert status == 200 and SECRET.encode() not in body
    events, _ = sse.parse_all(body)
    assert len(events) == 1
    error = json.loads(events[0].data)["error"]
    assert error["code"] == "response_incomplete"
    assert error["type"] == ("api_error" if route == "messages" else "server_error")
