"""Usage at the edges: an Anthropic stream cut before its closing usage never claims a
known output count; observe and off modes pass a stream through exactly as the client
asked for it (no usage chunk the gateway asked for) and still record the provider's own
usage; a client's `"stream_options": null` is a value to fill, never a second member."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, post_json, raw_client

POLICY = (
    '[profile_modes.obs-openai]\nbefore_release = "observe"\n[profile_modes.off-openai]\nbefore_release = "off"\n'
    '[profile_modes.off-anthropic]\nbefore_release = "off"\n'
)


@pytest.fixture(scope="module")
def gw(mock: MockProviderServer, gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("mock-anthropic", "anthropic", mock.url),
        mock_profile("est-anthropic", "anthropic", mock.url, estimator={"name": "runes/4", "fill_missing": True}),
        mock_profile("obs-openai", "openai", mock.url),
        mock_profile("off-openai", "openai", mock.url),
        mock_profile("off-anthropic", "anthropic", mock.url),
    ]
    with gateways("usage-edges", profiles=profiles, policy_extra=POLICY) as started:
        yield started


def _sid(mock: MockProviderServer, step: dict[str, Any]) -> str:
    sid = "u" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [step])
    return sid


def _record(env: Env, gateway: GatewayThread, request_id: str) -> dict[str, Any]:
    report = raw_client(gateway, env).get("/v1/usage/report", headers={"authorization": f"Bearer {env.gateway_key}"})
    found = [r for r in report.json()["recent"] if r["request_id"] == request_id]
    assert len(found) == 1
    return found[0]


def _event(name: str, obj: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **obj})}\n\n"


@pytest.mark.parametrize("profile", ["mock-anthropic", "est-anthropic"])
def test_a_stream_cut_before_its_closing_usage_has_no_known_output(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, profile: str
) -> None:
    """message_start's output_tokens is a starting value: without message_delta the output
    is unknown (estimated where the profile asks), never a known 1."""
    env, gateway = gw
    start = {
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-x",
            "content": [],
            "usage": {"input_tokens": 37, "cache_read_input_tokens": 500, "output_tokens": 1},
        }
    }
    events = [
        _event("message_start", start),
        _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hello there, an answer"}}),
    ]
    sid = _sid(mock, {"raw_events": events})
    body = {
        "model": "claude-x",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
    }
    answer = post_json(gateway, env, "/v1/messages", body, **{"x-wiregate-profile": profile})
    answer.read()
    record = _record(env, gateway, answer.headers["x-powercontext-request-id"])
    assert record["cache_read"] == {"value": 500, "provenance": "known"}
    assert record["output"]["provenance"] == ("estimated" if profile == "est-anthropic" else "unknown")


@pytest.mark.parametrize("profile", ["mock-anthropic", "off-anthropic"])
def test_a_stream_the_upstream_cuts_keeps_the_usage_it_reported(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, profile: str
) -> None:
    """Buffered strict (refused as incomplete) and off (passed through, cut): the input and
    cache figures of the first event are usage the provider bills, recorded as known."""
    env, gateway = gw
    sid = _sid(mock, {"text": "a fairly long answer " * 20, "chunk_size": 10, "fault": "reset_mid_stream"})
    body = {
        "model": "claude-x",
        "max_tokens": 50,
        "stream": True,
        "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
    }
    headers = {"authorization": f"Bearer {env.gateway_key}", "x-wiregate-profile": profile}
    with raw_client(gateway, env).stream("POST", "/v1/messages", json=body, headers=headers) as answer:
        with contextlib.suppress(httpx2.RemoteProtocolError):  # off mode: the client sees the stream cut
            answer.read()
        if profile == "mock-anthropic":
            assert answer.status_code == 503 and "response_incomplete" in answer.text
        request_id = answer.headers["x-powercontext-request-id"]
    record = _record(env, gateway, request_id)
    assert record["input_uncached"]["provenance"] == "known" and record["input_uncached"]["value"] > 0
    assert record["output"]["provenance"] == "unknown"


@pytest.mark.parametrize("profile", ["obs-openai", "off-openai"])
def test_a_passed_through_stream_is_what_the_client_asked_for_and_its_usage_is_recorded(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, profile: str
) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": "an answer in pieces", "chunk_size": 5})
    body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"go mock-scenario:{sid}"}]}
    answer = post_json(gateway, env, "/v1/chat/completions", body, **{"x-wiregate-profile": profile})
    events, _ = sse.parse_all(answer.content)
    chunks = [json.loads(e.data) for e in events if e.data != "[DONE]"]
    assert chunks and all(c["choices"] and "usage" not in c for c in chunks)  # no usage the client did not ask for
    sent = [r for r in mock.state.records() if r.scenario == sid]
    assert len(sent) == 1 and b"stream_options" not in sent[0].body
    # and with a non-streamed answer, off mode still records what the provider reported
    plain = _sid(mock, {"text": "plain"})
    answer = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"go mock-scenario:{plain}"}]},
        **{"x-wiregate-profile": profile},
    )
    reported = answer.json()["usage"]
    record = _record(env, gateway, answer.headers["x-powercontext-request-id"])
    assert record["output"] == {"value": reported["completion_tokens"], "provenance": "known"}
    assert record["input_total"] == {"value": reported["prompt_tokens"], "provenance": "known"}


def test_stream_options_null_is_filled_not_doubled(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": "answer"})
    raw = json.dumps(
        {
            "model": "gpt-4.1",
            "stream": True,
            "stream_options": None,
            "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
        }
    )
    answer = raw_client(gateway, env).post(
        "/v1/chat/completions",
        content=raw,
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"},
    )
    assert answer.status_code == 200, answer.text
    events, _ = sse.parse_all(answer.content)
    assert all("usage" not in json.loads(e.data) for e in events if e.data != "[DONE]")
    sent = [r for r in mock.state.records() if r.scenario == sid]
    assert len(sent) == 1 and json.loads(sent[0].body)["stream_options"] == {"include_usage": True}
    record = _record(env, gateway, answer.headers["x-powercontext-request-id"])
    assert record["output"]["provenance"] == "known"
