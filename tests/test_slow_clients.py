"""Hostile clients on both listeners, with raw sockets: a head that trickles, a TLS
handshake that never starts, a body that stalls or trickles past its deadline, and more
connections than one client (or all clients) may hold."""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_socket, read_response, read_until_closed

LIMITS = (
    "[limits]\nrequest_head_s = 0.5\nbody_idle_s = 0.5\nbody_total_s = 1.5\n"
    "max_connections_per_client = 3\nmax_connections = 1000\n"
)


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("slow", config_extra=LIMITS) as started:
        yield started


@pytest.mark.parametrize("listener", ["tls", "uds"])
def test_a_trickling_head_is_cut_off(gw: tuple[Env, GatewayThread], listener: str) -> None:
    env, gateway = gw
    sock = raw_socket(gateway, env, listener)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
    sock.close()


def test_a_tls_handshake_that_never_starts_is_cut_off(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    raw = socket.create_connection(("127.0.0.1", gateway.port))
    raw.settimeout(10)
    started = time.monotonic()
    assert raw.recv(1) == b""  # closed by the server, not by our 10 s timeout
    assert time.monotonic() - started < 9
    raw.close()


@pytest.mark.parametrize("listener", ["tls", "uds"])
@pytest.mark.parametrize("pace", ["stall", "trickle"])
def test_a_body_that_stalls_or_trickles_gets_408(gw: tuple[Env, GatewayThread], listener: str, pace: str) -> None:
    env, gateway = gw
    sock = raw_socket(gateway, env, listener)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.gateway_key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 400\r\n\r\n"
    ).encode()
    sock.sendall(head + b'{"model":')
    if pace == "trickle":  # a byte every 0.2 s: never idle long, but never done in time
        try:
            for _ in range(40):
                time.sleep(0.2)
                sock.sendall(b" ")
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass
    reply = read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408") and b"request_timeout" in reply
    sock.close()


@pytest.mark.parametrize("listener", ["tls", "uds"])
def test_connections_per_client_are_capped(gw: tuple[Env, GatewayThread], listener: str) -> None:
    env, gateway = gw
    held = [raw_socket(gateway, env, listener) for _ in range(3)]
    try:
        extra = raw_socket(gateway, env, listener)
        reply = read_until_closed(extra)
        assert reply.startswith(b"HTTP/1.1 503") and b"too_many_connections" in reply
        extra.close()
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)  # let the server see the closes
    ok = raw_socket(gateway, env, listener)
    ok.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert read_until_closed(ok).startswith(b"HTTP/1.1 200")
    ok.close()


def test_connections_in_all_are_capped(mock: MockProviderServer, make_env: Any, gateway_for: Any) -> None:
    env = make_env(config_extra="[limits]\nmax_connections = 2\n")
    gateway = gateway_for(env)
    held = [raw_socket(gateway, env, "uds"), raw_socket(gateway, env, "tls")]
    try:
        extra = raw_socket(gateway, env, "uds")
        assert read_until_closed(extra).startswith(b"HTTP/1.1 503")
        extra.close()
    finally:
        for sock in held:
            sock.close()


def test_a_closed_tls_connection_frees_its_slot_though_the_client_never_answers(
    gw: tuple[Env, GatewayThread],
) -> None:
    """After the gateway closes a TLS connection (here: a head past its deadline) it waits
    for the client's close_notify only briefly: a client that never sends one held its
    connection slot for 30 s, which made a slow-header flood four times cheaper."""
    env, gateway = gw
    held = [raw_socket(gateway, env, "tls") for _ in range(3)]  # the per-client cap
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the rest, never a read
        admitted_after = None
        started = time.monotonic()
        while time.monotonic() - started < 20:
            time.sleep(0.5)
            probe = raw_socket(gateway, env, "tls")
            probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = read_until_closed(probe)
            probe.close()
            if reply.startswith(b"HTTP/1.1 200"):
                admitted_after = time.monotonic() - started
                break
            assert reply.startswith(b"HTTP/1.1 503"), reply[:100]
        assert admitted_after is not None and admitted_after < 15, admitted_after
    finally:
        for sock in held:
            sock.close()


def _chat_request(env: Env, body: bytes, key: str | None = None) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key or env.gateway_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


def _scenario_body(mock: MockProviderServer, step: dict[str, Any]) -> bytes:
    sid = "hd" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [step])
    return json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}).encode()


@pytest.mark.parametrize("listener", ["tls", "uds"])
def test_a_pipelined_request_is_not_cut_by_a_head_deadline(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, listener: str
) -> None:
    """Request 2's head arrives (pipelined) while request 1 runs; its body comes after
    answer 1. Those body bytes are not a head: no head deadline starts, and request 2's
    answer, slower than `request_head_s`, arrives whole (it was once cut by a raw 408
    `request_head_s` after its body came, and logged as a client that left)."""
    env, gateway = gw
    first = _scenario_body(mock, {"text": "first", "delay_ms": 200})
    second = _scenario_body(mock, {"text": "second answer", "delay_ms": 1200})
    sock = raw_socket(gateway, env, listener)
    sock.settimeout(15)
    sock.sendall(_chat_request(env, first) + first + _chat_request(env, second))
    status, _, body, rest = read_response(sock)
    assert " 200 " in status and b"first" in body
    time.sleep(0.1)
    sock.sendall(second)
    status, _, body, _ = _after(sock, rest)
    assert " 200 " in status and b"second answer" in body, (status, body)
    sock.close()


@pytest.mark.parametrize("listener", ["tls", "uds"])
def test_the_rest_of_a_refused_body_starts_no_head_deadline(gw: tuple[Env, GatewayThread], listener: str) -> None:
    """A request refused before its body was read (a wrong key) whose body's last bytes
    come after the answer: the connection stays open for the next request past
    `request_head_s` (it was once closed with an unasked-for raw 408)."""
    env, gateway = gw
    body = b'{"model":"gpt-4.1","messages":[{"role":"user","content":"hello there"}]}'
    sock = raw_socket(gateway, env, listener)
    sock.settimeout(15)
    sock.sendall(_chat_request(env, body, key="wrong-key") + body[:10])
    status, _, _, rest = read_response(sock)
    assert " 401 " in status
    time.sleep(0.1)
    sock.sendall(body[10:])
    time.sleep(1.0)  # twice `request_head_s`
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, _, _ = _after(sock, rest)
    assert " 200 " in status, status
    sock.close()


def _after(sock: socket.socket, rest: bytes) -> tuple[str, dict[str, str], bytes, bytes]:
    """The next response on `sock`, whose first bytes may already be in `rest`."""

    class Prefixed:
        def __init__(self) -> None:
            self.pending = rest

        def recv(self, n: int) -> bytes:
            if self.pending:
                data, self.pending = self.pending, b""
                return data
            return sock.recv(n)

    return read_response(Prefixed())  # type: ignore[arg-type]
