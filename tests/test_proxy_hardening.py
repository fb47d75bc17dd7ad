"""The provider routes against what a fuzzer sent them: a value shadowed by a duplicate key
is inspected (and the duplicate reported) on every carrier, embeddings included — an
escaped secret in the first `user` of an embeddings call reached the provider; odd shapes
(a content part typed by an object, `tools` that is a number, a label header nested
thousands deep, a scope header that is not UTF-8) are a 4xx or change nothing, never a
500; a stream chunk whose `choices` is not a list makes the stream unreadable (503, nothing
released), not an internal error; a forwarded header value that is not printable ASCII is
refused (a byte that is not UTF-8 was checked as a lone surrogate and dropped on the wire,
so a secret it split left whole)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, mock_profile, raw_client, raw_socket, read_until_closed

SECRET = "zq-secret-VALUE-93817265"
ESCAPED = "\\u007a" + SECRET[1:]  # the raw bytes never hold the secret


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("proxy-hardening", secrets_=[SECRET]) as started:
        yield started


def _post(gw: tuple[Env, GatewayThread], path: str, body: bytes, **headers: Any) -> Any:
    env, gateway = gw
    sent = {"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json", **headers}
    return raw_client(gateway, env).post(path, content=body, headers=sent)


def _reached(mock: MockProviderServer, since: int) -> list[bytes]:
    return [r.body for r in mock.state.records() if r.seq > since]


def _last(mock: MockProviderServer) -> int:
    records = mock.state.records()
    return records[-1].seq if records else 0


SHADOWED = [
    ("/v1/embeddings", '{"model":"text-embedding-3-small","input":"ok","user":"%s","user":"x"}' % ESCAPED),
    ("/v1/embeddings", '{"model":"text-embedding-3-small","input":"%s","input":"ok"}' % ESCAPED),
    (
        "/v1/chat/completions",
        '{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}],"user":"%s","user":"x"}' % ESCAPED,
    ),
]


@pytest.mark.parametrize(("path", "body"), SHADOWED)
def test_a_value_shadowed_by_a_duplicate_key_never_leaves(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, path: str, body: str
) -> None:
    since = _last(mock)
    refused = _post(gw, path, body.encode())
    assert refused.status_code in (403, 422), refused.text
    assert _reached(mock, since) == []


def test_a_duplicate_key_is_reported_on_embeddings(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    since = _last(mock)
    refused = _post(gw, "/v1/embeddings", b'{"model":"text-embedding-3-small","input":"a","input":"b"}')
    assert refused.status_code == 422 and refused.json()["error"]["reason_codes"] == ["duplicate_key"]
    assert _reached(mock, since) == []
    assert _post(gw, "/v1/embeddings", b'{"model":"text-embedding-3-small","input":"a"}').status_code == 200


ODD = [
    ("/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": [{"type": {}}]}]}),
    ("/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": [{"type": ["x"]}]}]}),
    ("/v1/responses", {"model": "gpt-4.1", "input": [{"role": "user", "content": [{"type": []}]}]}),
    (
        "/v1/messages",
        {"model": "claude-test-model", "max_tokens": 20, "tools": 5, "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "/v1/messages",
        {
            "model": "claude-test-model",
            "max_tokens": 20,
            "tools": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    ("/v1/chat/completions", {"model": "gpt-4.1", "tools": {"a": 1}, "messages": [{"role": "user", "content": "hi"}]}),
]


@pytest.mark.parametrize(("path", "body"), ODD)
def test_odd_shapes_are_never_a_500(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture, path: str, body: dict[str, Any]
) -> None:
    mark = captured_logs.mark()
    answer = _post(gw, path, json.dumps(body).encode(), **{"anthropic-version": "2023-06-01"})
    assert answer.status_code < 500, answer.text
    assert '"internal_error"' not in captured_logs.since(mark)


def test_a_deep_label_header_is_ignored_even_on_an_offloaded_body(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture
) -> None:
    env, gateway = gw
    admin = {"authorization": f"Bearer {env.gateway_key}"}
    http = raw_client(gateway, env)
    assert http.post("/v1/attribution/collection", json={"collecting": True}, headers=admin).status_code == 200
    try:
        mark = captured_logs.mark()
        small = b'{"model":"claude-test-model","max_tokens":20,"messages":[{"role":"user","content":"hi"}]}'
        for body in (small, small + b" " * (1024 * 1024 + 10)):  # the second is parsed in a check worker
            sent = _post(gw, "/v1/messages", body, **{"x-wiregate-blocks": "[" * 4000 + "]" * 4000})
            assert sent.status_code == 200, sent.text
        assert "RecursionError" not in captured_logs.since(mark)
    finally:
        assert http.post("/v1/attribution/collection", json={"collecting": False}, headers=admin).status_code == 200


@pytest.mark.parametrize("scope", [b"a\xffb", b"\xed\xa0\x80", b"a\x01b"])
def test_a_scope_header_that_names_no_scope_is_refused(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture, scope: bytes
) -> None:
    env, gateway = gw
    body = b'{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]}'
    mark = captured_logs.mark()
    for path, method in ((b"/v1/chat/completions", b"POST"), (b"/v1/attribution/report", b"GET")):
        with raw_socket(gateway) as sock:
            sock.sendall(
                method + b" " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nAuthorization: Bearer " + env.gateway_key.encode() + b"\r\n"
                b"x-wiregate-scope: " + scope + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            answer = read_until_closed(sock)
        status = int(answer.split(b" ", 2)[1])
        assert status in (400, 403), answer[:300]
    assert '"internal_error"' not in captured_logs.since(mark)


def test_a_chunk_whose_choices_is_not_a_list_is_an_unreadable_stream(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    sid = "odd" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(
        sid,
        [{"raw_events": ['data: {"id":"c","object":"chat.completion.chunk","choices":1}\n\n', "data: [DONE]\n\n"]}],
    )
    body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    answer = _post(gw, "/v1/chat/completions", json.dumps(body).encode())
    assert answer.status_code == 503, answer.text  # like any stream that cannot be read: nothing released
    assert answer.json()["error"]["reason_codes"] == ["response_incomplete", "json_invalid"]


def test_a_response_value_shadowed_by_a_duplicate_key_is_read() -> None:
    limits = CarrierLimits(max_depth=64, embedded_json_depth=4)
    vector = "[0.1,0.2]"
    for raw in (
        '{"object":"list","note":"%s","note":"x","data":[{"index":0,"embedding":%s}]}' % (ESCAPED, vector),
        '{"object":"list","data":[{"index":0,"tag":"%s","tag":"x","embedding":%s}]}' % (ESCAPED, vector),
        '{"object":"list","data":[{"index":0,"embedding":"%s","embedding":%s}]}' % (ESCAPED, vector),
    ):
        folded = CARRIERS["openai.embeddings"].parse_response(raw.encode(), limits)
        assert folded.duplicate_keys, raw
        assert any(SECRET in unit.text for unit in folded.units), raw


def test_an_anthropic_event_whose_name_and_data_disagree_is_not_believed() -> None:
    """The SDK acts on the event's name: an `error` name with other data is an error, and a
    `ping` whose data says `message_stop` does not end the stream."""
    limits = CarrierLimits(max_depth=64, embedded_json_depth=4)
    start = 'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{}}}\n\n'
    text = (
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"text","text":""}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"hi"}}\n\n'
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    )
    stop = 'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    carrier = CARRIERS["anthropic.messages"]
    for middle in (
        'event: error\ndata: {"type":"ping","error":{"type":"overloaded_error"}}\n\n',
        'event: ping\ndata: {"type":"message_stop"}\n\n',
    ):
        events, _ = sse.parse_all((start + text + middle + stop).encode())
        folded = carrier.fold_stream(events, limits)
        assert not folded.complete, middle
    events, _ = sse.parse_all((start + text + stop).encode())
    assert carrier.fold_stream(events, limits).complete


@pytest.fixture(scope="module")
def beta(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [mock_profile("mock-anthropic", "anthropic", mock.url, passthrough_headers=["anthropic-beta"])]
    with gateways("proxy-hardening-headers", profiles=profiles, secrets_=[SECRET]) as started:
        yield started


FORWARDED_HEADERS = {
    "a value split by a byte that is not UTF-8": b"anthropic-version: zq-secret-\xffVALUE-93817265",
    "a pass-through value split by two such bytes": b"anthropic-beta: zq-secret-\xff\xfeVALUE-93817265",
    "a credential split by such a byte": b"anthropic-version: AKIA\xffIOSFODNN7EXAMPLQ",
    "a character outside ASCII": b"anthropic-beta: tools-\xc3\xa9-2024",
}


@pytest.mark.parametrize("case", sorted(FORWARDED_HEADERS))
def test_a_forwarded_header_value_must_be_printable_ascii(
    beta: tuple[Env, GatewayThread], mock: MockProviderServer, case: str
) -> None:
    """The server reads such a byte as a lone surrogate and the check reads that text; the
    client writer drops it on the wire, so the halves checked apart would leave joined."""
    env, gateway = beta
    since = _last(mock)
    body = json.dumps(
        {"model": "claude-test-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    with raw_socket(gateway) as sock:
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
            + env.gateway_key.encode()
            + b"\r\n"
            + FORWARDED_HEADERS[case]
            + b"\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
            + body
        )
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"invalid_request" in answer and b"VALUE" not in answer and b"AKIA" not in answer
    assert _reached(mock, since) == []
    with raw_socket(gateway) as sock:  # the control: printable values leave as they came
        sock.sendall(
            b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nx-api-key: "
            + env.gateway_key.encode()
            + b"\r\nanthropic-beta: tools-2024-04-04\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        assert read_until_closed(sock).startswith(b"HTTP/1.1 200")
    sent = [r for r in mock.state.records() if r.seq > since]
    assert len(sent) == 1 and sent[0].headers.get("anthropic-beta") == "tools-2024-04-04"
