"""A client that keeps its connection open but stops reading: once the connection's send
buffer has stayed full for `[limits] write_stall_s`, the connection is cut as if the client
had gone — the call slot, the principal's slot and the buffered response are given back,
whether the gateway was writing heartbeats, a windowed stream or a released body. (It held
them until the client closed, so a few idle clients could take every strict call.)"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from gateway.state import CAPACITY, PRINCIPAL_CALLS
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, raw_client, raw_socket

FILL = " ".join(f"word{i:03d}" for i in range(60))
CONFIG = (
    "[streaming]\nheartbeat_after_s = 0.1\nheartbeat_every_s = 0.1\nheartbeat_stall_s = 5.0\n"
    "[limits]\nbuffer_seconds = 20.0\nconcurrent_buffered_responses = 1\nwrite_stall_s = 1.0\n"
)


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("win", "openai", mock.url, release="windowed"),
    ]
    with gateways("stalled-readers", profiles=profiles, config_extra=CONFIG) as started:
        yield started


def _held(gateway: GatewayThread) -> tuple[int, dict[str, int]]:
    assert gateway.running is not None
    app = gateway.running.app

    async def read() -> tuple[int, dict[str, int]]:
        return app[CAPACITY].in_use, dict(app[PRINCIPAL_CALLS]._in_flight)

    return gateway.call(read())


def _scenario(mock: MockProviderServer, **step: Any) -> str:
    sid = "st" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [step])
    return sid


def _small_call(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> int:
    env, gateway = gw
    sid = _scenario(mock, text="small")
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    answer = raw_client(gateway, env, uds=True).post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    return answer.status_code


@pytest.mark.parametrize(
    ("profile", "stream", "step"),
    [
        ("mock-openai", True, {"chunk_size": 500000, "drip_ms": 50}),  # heartbeats, then the body
        ("win", True, {"chunk_size": 100000}),  # a windowed stream
        ("mock-openai", False, {"chunk_size": 100000}),  # a released body
    ],
)
def test_a_client_that_stops_reading_gives_everything_back(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, profile: str, stream: bool, step: dict[str, Any]
) -> None:
    env, gateway = gw
    sid = _scenario(mock, text=FILL * 20000, **step)  # about 10 MB of answer
    body = json.dumps(
        {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.gateway_key}\r\n"
        f"x-wiregate-profile: {profile}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with raw_socket(gateway) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(head + body)
        assert sock.recv(64).startswith(b"HTTP/1.1 200")  # then it reads nothing more
        deadline = time.monotonic() + 30
        while _held(gateway) != (0, {}) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _held(gateway) == (0, {})
        assert _small_call(gw, mock) == 200  # the one call slot is free again
    assert gateway.running is not None and gateway.running.runner.guard.write_stalls >= 1


def test_a_slow_reader_that_keeps_reading_is_never_cut(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _scenario(mock, text=FILL * 2000, chunk_size=100000)  # about 1 MB
    body = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.gateway_key}\r\n"
        f"Connection: close\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    received = b""
    with raw_socket(gateway) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(head + body)
        while chunk := sock.recv(65536):
            received += chunk
            time.sleep(0.3)  # about 5 s in all: far past write_stall_s, never silent that long
    head_bytes, _, payload = received.partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200")
    assert json.loads(payload)["choices"][0]["message"]["content"] == FILL * 2000
