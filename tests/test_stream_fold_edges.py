"""Streams whose events a client and the fold could read differently, or that the fold must
not crash on, through a real gateway and the bundled mock provider:

* an index written as 1.0, 1e0 or "1" (a JavaScript client reads each as 1, the fold would
  file the text elsewhere): the stream is refused as `upstream_invalid_response`, so a
  credential split over two deltas of one tool call or content part never gets out;
* a Responses stream that carried an error and then says `response.completed` stays an
  error (never released as complete);
* a `type` or `finish_reason` that is an array or an object, and an event nested past the
  decoding budget that names `usage`, are refused as the provider's invalid output, never
  a 500;
* with heartbeats on, provider headers that do not pass inspection are not committed with
  the first heartbeat.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.mockprovider import MockProviderServer
from gateway.vocab import ReasonCode
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json, raw_client, windowed_profiles

AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"  # a catalogue format, never configured
HEAD, TAIL = AWS_KEY[:9], AWS_KEY[9:]
RESP = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "gpt-5",
    "output": [],
    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
}
GW = tuple[Env, GatewayThread]


@pytest.fixture(scope="module")
def buffered(gateways: GatewayFactory) -> Iterator[GW]:
    with gateways("fold-edges-b") as started:
        yield started


@pytest.fixture(scope="module")
def windowed(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[GW]:
    with gateways("fold-edges-w", profiles=windowed_profiles(mock.url)) as started:
        yield started


def _through(gw: GW, mock: MockProviderServer, route: str, events: list[str]) -> Any:
    env, gateway = gw
    sid = "fe" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events}])
    prompt = f"mock-scenario:{sid}"
    if route == "/v1/responses":
        body: dict[str, Any] = {"model": "gpt-5", "stream": True, "input": prompt}
    elif route == "/v1/messages":
        body = {"model": "claude-test-model", "max_tokens": 20, "stream": True}
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    r = post_json(gateway, env, route, body)
    assert [x for x in mock.state.records() if x.scenario == sid]  # the provider answered: what it sent was judged
    return r


def _chunk(delta: dict[str, Any], finish: str | None = None, index: str = "0") -> str:
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1"}
    text = json.dumps({**body, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    return "data: " + text.replace('"index": 0,', f'"index": {index},', 1) + "\n\n"


def _tool_events(second: str) -> list[str]:
    first = {"index": 1, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"k":"' + HEAD}}
    rest = json.dumps({"index": 1, "function": {"arguments": TAIL + '"}'}}).replace('"index": 1', f'"index": {second}')
    later = _chunk({"tool_calls": ["REST"]}).replace('"REST"', rest)
    return [_chunk({"tool_calls": [first]}), later, _chunk({}, "tool_calls"), "data: [DONE]\n\n"]


@pytest.mark.parametrize("mode", ["buffered", "windowed"])
def test_a_tool_call_split_under_one_index_is_read_whole(
    buffered: GW, windowed: GW, mock: MockProviderServer, mode: str
) -> None:
    r = _through(buffered if mode == "buffered" else windowed, mock, "/v1/chat/completions", _tool_events("1"))
    assert AWS_KEY[4:] not in r.text and "secret_format" in r.text, (r.status_code, r.text[:400])


@pytest.mark.parametrize("second", ["1.0", "1e0", '"1"'])
@pytest.mark.parametrize("mode", ["buffered", "windowed"])
def test_a_tool_call_index_a_client_reads_as_1_is_refused(
    buffered: GW, windowed: GW, mock: MockProviderServer, mode: str, second: str
) -> None:
    r = _through(buffered if mode == "buffered" else windowed, mock, "/v1/chat/completions", _tool_events(second))
    assert TAIL not in r.text and ReasonCode.UPSTREAM_INVALID_RESPONSE in r.text, (r.status_code, r.text[:400])


def test_a_choice_index_that_is_not_an_integer_is_refused(buffered: GW, mock: MockProviderServer) -> None:
    events = [_chunk({"content": "key " + HEAD}), _chunk({"content": TAIL}, index="0.0"), "data: [DONE]\n\n"]
    r = _through(buffered, mock, "/v1/chat/completions", events)
    assert r.status_code == 503 and ReasonCode.UPSTREAM_INVALID_RESPONSE in r.text, (r.status_code, r.text[:400])
    assert TAIL not in r.text


def _responses_delta(text: str, content_index: str = "0") -> str:
    body = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0, "delta": text}
    data = json.dumps(body).replace('"content_index": 0', f'"content_index": {content_index}')
    return f"event: response.output_text.delta\ndata: {data}\n\n"


def _completed() -> str:
    return "event: response.completed\ndata: " + json.dumps({"type": "response.completed", "response": RESP}) + "\n\n"


@pytest.mark.parametrize("content_index", ["0", "0.0"])
def test_a_responses_part_index_a_client_reads_as_0_is_not_a_way_round(
    buffered: GW, mock: MockProviderServer, content_index: str
) -> None:
    events = [_responses_delta("key " + HEAD), _responses_delta(TAIL + " end", content_index), _completed()]
    r = _through(buffered, mock, "/v1/responses", events)
    assert r.status_code in (403, 503) and TAIL not in r.text, (r.status_code, r.text[:400])
    expected = "secret_format" if content_index == "0" else ReasonCode.UPSTREAM_INVALID_RESPONSE
    assert expected in r.text


ERRORS = {
    "error": {"type": "error", "code": "server_error", "message": "boom", "param": None},
    "response.failed": {"type": "response.failed", "response": {**RESP, "status": "failed"}},
}


def _error_then_completed(kind: str) -> list[str]:
    return [_responses_delta("the first half of an ans"), f"event: {kind}\ndata: {json.dumps(ERRORS[kind])}\n\n"] + [
        _completed()
    ]


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_a_completed_event_after_an_error_does_not_make_the_stream_complete(kind: str) -> None:
    events = [sse.SSEEvent(None, e.split("data: ", 1)[1].strip()) for e in _error_then_completed(kind)]
    folded = CARRIERS["openai.responses"].fold_stream(events, CarrierLimits())
    assert folded.is_error and not folded.complete


@pytest.mark.parametrize("kind", sorted(ERRORS))
@pytest.mark.parametrize("mode", ["buffered", "windowed"])
def test_a_completed_event_after_an_error_is_not_released_as_an_answer(
    buffered: GW, windowed: GW, mock: MockProviderServer, kind: str, mode: str
) -> None:
    r = _through(buffered if mode == "buffered" else windowed, mock, "/v1/responses", _error_then_completed(kind))
    assert r.status_code != 200 or ReasonCode.RESPONSE_INCOMPLETE in r.text, (r.status_code, r.text[:400])


UNHASHABLE = {
    "chat": (
        "/v1/chat/completions",
        "openai.chat",
        [
            'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
            '[{"index":0,"delta":{"content":"hi"},"finish_reason":["stop"]}]}\n\n',
            "data: [DONE]\n\n",
        ],
    ),
    "messages": ("/v1/messages", "anthropic.messages", ['event: ping\ndata: {"type":["ping"]}\n\n']),
    "messages-delta": (
        "/v1/messages",
        "anthropic.messages",
        ['event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":{}}}\n\n'],
    ),
    "responses": ("/v1/responses", "openai.responses", ['data: {"type":{"a":1},"delta":"x"}\n\n']),
}


@pytest.mark.parametrize("case", sorted(UNHASHABLE))
def test_an_array_or_object_where_a_name_goes_folds_without_raising(case: str) -> None:
    _, carrier, events = UNHASHABLE[case]
    folded = CARRIERS[carrier].fold_stream(
        [sse.SSEEvent(None, e.split("data: ", 1)[1].rstrip("\n")) for e in events], CarrierLimits()
    )
    # The chat chunk is read in full (it is no delta the fast path knows) and [DONE] ends it.
    assert folded.complete is (case == "chat")


@pytest.mark.parametrize("case", sorted(UNHASHABLE))
@pytest.mark.parametrize("mode", ["buffered", "windowed"])
def test_an_array_or_object_where_a_name_goes_is_refused_not_a_500(
    buffered: GW, windowed: GW, mock: MockProviderServer, case: str, mode: str
) -> None:
    route, _, events = UNHASHABLE[case]
    r = _through(buffered if mode == "buffered" else windowed, mock, route, events)
    assert r.status_code != 500 and "internal_error" not in r.text, (r.status_code, r.text[:300])
    if case == "chat":
        assert r.status_code == 200 and '"content":"hi"' in r.text and "[DONE]" in r.text
    else:
        assert r.status_code != 200 or "response_incomplete" in r.text or "upstream_invalid" in r.text


DEEP = '{"usage":' + "[" * 5000 + "]" * 5000 + "}"


def test_released_events_reads_a_deep_event_without_raising() -> None:
    events = [sse.SSEEvent(None, DEEP), sse.SSEEvent(None, "[DONE]")]
    assert CARRIERS["openai.chat"].released_events(events, True) == events


@pytest.mark.parametrize("mode", ["buffered", "windowed"])
def test_a_deep_event_naming_usage_is_refused_not_a_500(
    buffered: GW, windowed: GW, mock: MockProviderServer, mode: str
) -> None:
    events = ["data: " + DEEP + "\n\n", "data: [DONE]\n\n"]
    r = _through(buffered if mode == "buffered" else windowed, mock, "/v1/chat/completions", events)
    assert r.status_code != 500 and "internal_error" not in r.text, (r.status_code, r.text[:300])
    assert r.status_code != 200


SECRET = "sk-heartbeat-HDR-SECRET-913"
BEATS = "[streaming]\nheartbeat_after_s = 0.1\nheartbeat_every_s = 0.1\nheartbeat_stall_s = 1.0\n"


@pytest.fixture(scope="module")
def beats(gateways: GatewayFactory) -> Iterator[GW]:
    with gateways("fold-edges-beats", secrets_=[SECRET], config_extra=BEATS) as started:
        yield started


def _slow_answer(gw: GW, mock: MockProviderServer, request_id: str) -> Any:
    env, gateway = gw
    sid = "hb" + uuid.uuid4().hex[:10]
    step = {"text": "a harmless answer " * 8, "chunk_size": 2, "drip_ms": 30, "headers": {"x-request-id": request_id}}
    mock.state.add_scenario(sid, [step])
    body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    return raw_client(gateway, env).post("/v1/chat/completions", json=body, headers=headers)


def test_heartbeats_never_commit_a_header_that_does_not_pass(beats: GW, mock: MockProviderServer) -> None:
    r = _slow_answer(beats, mock, SECRET)
    assert r.status_code == 200 and r.text.startswith(":")  # heartbeats went out first
    assert "secret_value" in r.text, r.text[:300]  # refused on the open stream
    assert SECRET not in str(r.headers) and SECRET not in r.text, dict(r.headers)


def test_heartbeats_still_carry_the_headers_that_pass(beats: GW, mock: MockProviderServer) -> None:
    r = _slow_answer(beats, mock, "req_harmless_1")
    assert r.status_code == 200 and r.text.startswith(":") and "[DONE]" in r.text
    assert r.headers.get("x-request-id") == "req_harmless_1"
