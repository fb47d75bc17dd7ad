"""Limits are explicit, provider-shaped refusals — never truncation — and bad input is
refused before anything is sent."""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client, raw_socket, read_response, read_until_closed

LIMITS = """
[limits]
request_bytes = 4096
decompressed_request_bytes = 8192
response_bytes = 3000
buffer_seconds = 1.0
json_depth = 16
"""


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("limits", config_extra=LIMITS) as started:
        yield started


def _headers(env: Env, **extra: str) -> dict[str, str]:
    return {"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json", **extra}


def _chat(text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "messages": [{"role": "user", "content": text}], **extra}


def _sent_nothing(mock: MockProviderServer, before: int) -> bool:
    return len(mock.state.records()) == before


def test_request_too_large(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    client = raw_client(gateway, env)
    big = json.dumps(_chat("x" * 5000)).encode()
    r = client.post("/v1/chat/completions", content=big, headers=_headers(env))
    assert r.status_code == 413 and r.json()["error"]["reason_codes"] == ["payload_too_large"]

    def chunks() -> Iterator[bytes]:  # no content-length: chunked transfer
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    r = client.post("/v1/chat/completions", content=chunks(), headers=_headers(env))
    assert r.status_code == 413
    assert _sent_nothing(mock, before)


def test_gzip_bodies(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    client = raw_client(gateway, env)
    ok = gzip.compress(json.dumps(_chat("compressed hello")).encode())
    r = client.post("/v1/chat/completions", content=ok, headers=_headers(env, **{"content-encoding": "gzip"}))
    assert r.status_code == 200, r.text
    before = len(mock.state.records())
    bomb = gzip.compress(json.dumps(_chat("a" * 100_000)).encode())  # ~300 bytes → 100 KB
    assert len(bomb) < 4096
    r = client.post("/v1/chat/completions", content=bomb, headers=_headers(env, **{"content-encoding": "gzip"}))
    assert r.status_code == 413
    r = client.post(
        "/v1/chat/completions", content=b"\x1f\x8b not gzip", headers=_headers(env, **{"content-encoding": "gzip"})
    )
    assert r.status_code == 400
    r = client.post("/v1/chat/completions", content=b"{}", headers=_headers(env, **{"content-encoding": "br"}))
    assert r.status_code == 415 and r.json()["error"]["reason_codes"] == ["unsupported_encoding"]
    r = client.post("/v1/chat/completions", content=b"{}", headers=_headers(env, **{"content-type": "text/plain"}))
    assert r.status_code == 415
    assert _sent_nothing(mock, before)


@pytest.mark.parametrize(
    "body,status,reason",
    [
        (b'{"model":"gpt-4.1","messages":[' * 1 + b"[" * 40 + b"]" * 40 + b"]}", 422, "too_deep"),
        (b'{"model":"gpt-4.1","messages":[{"role":"user","content":"hi"}]', 400, "json_invalid"),
        (b'{"model":"gpt-4.1","temperature":NaN,"messages":[]}', 400, "json_invalid"),
        (b'{"model":"gpt-4.1","messages":[{"role":"user","content":"\\ud800"}]}', 400, "json_invalid"),
        (b'{"model":"gpt-4.1","messages":[{"role":"user","content":"\xff\xfe"}]}', 400, "json_invalid"),
        (b'["not an object"]', 422, "unsupported_carrier"),
        (b'{"messages":[]}', 422, "unsupported_carrier"),
        (b'{"model":"gpt-4.1","messages":"nope"}', 422, "unsupported_carrier"),
    ],
)
def test_malformed_requests_are_not_sent(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, body: bytes, status: int, reason: str
) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    r = raw_client(gateway, env).post("/v1/chat/completions", content=body, headers=_headers(env))
    assert r.status_code == status, r.text
    assert r.json()["error"]["reason_codes"] == [reason]
    assert _sent_nothing(mock, before)


def test_duplicate_keys_withheld(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    body = b'{"model":"gpt-4.1","messages":[{"role":"user","content":"a","content":"b"}]}'
    r = raw_client(gateway, env).post("/v1/chat/completions", content=body, headers=_headers(env))
    assert r.status_code == 422 and r.json()["error"]["reason_codes"] == ["duplicate_key"]
    assert _sent_nothing(mock, before)


def test_response_too_large_is_withheld(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = "big" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"text": "y" * 5000}])
    r = raw_client(gateway, env).post("/v1/chat/completions", json=_chat(f"mock-scenario:{sid}"), headers=_headers(env))
    assert r.status_code == 503 and r.json()["error"]["reason_codes"] == ["response_too_large"]
    assert "yyyy" not in r.text


def test_buffer_time_limit(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = "slow" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"text": "slowly", "chunk_size": 1, "drip_ms": 300}])
    r = raw_client(gateway, env).post(
        "/v1/chat/completions", json=_chat(f"mock-scenario:{sid}", stream=True), headers=_headers(env)
    )
    assert r.status_code == 503 and r.json()["error"]["code"] == "upstream_timeout"
    assert "slowly" not in r.text


def test_unknown_route_and_method(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    client = raw_client(gateway, env)
    r = client.get("/v1/chat/completions", headers=_headers(env))
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"  # RFC 9110: a 405 says what the route allows
    r = client.put("/healthz", headers=_headers(env))
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
    r = client.post("/v1/unknown", headers=_headers(env), content=b"{}")
    assert r.status_code == 404 and r.json()["error"]["details"]["reason_codes"] == ["not_found"]


def test_a_relayed_413_keeps_the_connection_and_the_gateways_own_closes_it(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """A provider's 413, relayed after the whole request was read, leaves the keep-alive
    connection open (the next request on it is answered); the gateway's own 413 to a body it
    did not read says `Connection: close` and closes it."""
    env, gateway = gw
    sid = "limits413" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"status": 413, "error_message": "too large upstream"}])

    def request(body: bytes) -> bytes:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {env.gateway_key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    with raw_socket(gateway) as sock:
        sock.sendall(request(json.dumps(_chat(f"mock-scenario:{sid}")).encode()))
        status, headers, _, rest = read_response(sock)
        assert status.split()[1] == "413" and headers.get("connection", "").lower() != "close"
        assert rest == b""
        sock.sendall(request(json.dumps(_chat("hello again")).encode()))
        status, _, _, _ = read_response(sock)
        assert status.split()[1] == "200", status
    with raw_socket(gateway) as sock:
        sock.sendall(request(json.dumps(_chat("x" * 5000)).encode()))
        status, headers, _, rest = read_response(sock)
        assert status.split()[1] == "413" and headers.get("connection", "").lower() == "close"
        assert rest + read_until_closed(sock) == b""
