"""Requests that cannot be read as HTTP (a scanner's garbage, a missing Host, smuggling
attempts) each get the fixed content-free 400, and the log gets a sampled `bad_http` line
with how many arrived, not one error line per request: garbage must not be able to fill
the error log."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator

import pytest

from gateway.config.model import Limits
from gateway.http.connections import BAD_HTTP_LOG_S, ConnectionGuard
from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, raw_socket, read_until_closed

GARBAGE = [
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"a" * 9000 + b"\r\n\r\n",
]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("bad-http") as started:
        yield started


def _exchange(gateway: GatewayThread, data: bytes) -> bytes:
    with raw_socket(gateway) as sock:
        sock.sendall(data)
        return read_until_closed(sock)


def test_garbage_is_answered_and_sampled_in_the_log(gw: tuple[Env, GatewayThread], captured_logs: LogCapture) -> None:
    _, gateway = gw
    mark = captured_logs.mark()
    for n in range(40):
        answer = _exchange(gateway, GARBAGE[n % len(GARBAGE)])
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.split(b" ")[1] == b"400", answer[:200]
        assert json.loads(body)["error"]["details"]["reason_codes"] == ["invalid_request"]
    lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.strip()]
    assert [line["event"] for line in lines] == ["bad_http"], lines  # the first; the rest wait a minute
    assert lines[0]["count"] == 1 and lines[0]["level"] == "warning"
    assert _exchange(gateway, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200"
    )


def test_the_sampled_line_counts_what_it_left_out(captured_logs: LogCapture) -> None:
    guard = ConnectionGuard(Limits())
    mark = captured_logs.mark()
    for n in range(10):
        guard.bad_http("BadHttpMessage", 100.0 + n)
    guard.bad_http("LineTooLong", 100.0 + BAD_HTTP_LOG_S + 1)
    lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.strip()]
    assert [(line["count"], line["error_class"]) for line in lines] == [(1, "BadHttpMessage"), (10, "LineTooLong")]
    assert guard.bad_requests == 11


CHAT = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _post(env: Env, extra: bytes, body: bytes | None) -> bytes:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + env.gateway_key.encode()
        + b"\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + extra
    )
    if body is None:  # chunked
        return head + b"\r\n" + b"%x\r\n" % len(CHAT) + CHAT + b"\r\n0\r\n\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@pytest.mark.parametrize(
    ("extra", "body"),
    [
        (b"Content-Encoding: identity, gzip\r\n", CHAT),
        (b"Content-Encoding: identity\r\nContent-Encoding: gzip\r\n", CHAT),  # a list over two lines
        (b"Content-Encoding: gzip\r\nContent-Encoding: br\r\n", gzip.compress(CHAT)),
        (b"Transfer-Encoding: gzip, chunked\r\n", None),  # a transfer coding the parser does not undo
    ],
)
def test_an_encoding_list_is_unsupported_however_it_is_written(
    gw: tuple[Env, GatewayThread], extra: bytes, body: bytes | None
) -> None:
    env, gateway = gw
    answer = _exchange(gateway, _post(env, extra, body))
    assert answer.startswith(b"HTTP/1.1 415") and b"unsupported_encoding" in answer, answer[:200]


def test_one_gzip_line_and_plain_chunks_are_read(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    assert _exchange(gateway, _post(env, b"Content-Encoding: gzip\r\n", gzip.compress(CHAT))).startswith(
        b"HTTP/1.1 200"
    )
    assert _exchange(gateway, _post(env, b"Transfer-Encoding: chunked\r\n", None)).startswith(b"HTTP/1.1 200")


def test_a_refusal_before_100_continue_closes_the_connection(gw: tuple[Env, GatewayThread]) -> None:
    """Refused before `100 Continue` (here: no key), the client may still send its body: the
    connection closes after the answer, so that body is never read as the next request."""
    _, gateway = gw
    with raw_socket(gateway) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(CHAT)
        )
        answer = read_until_closed(sock)  # closed by the server, not by our 10 s timeout
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"connection: close" in answer.lower()


@pytest.mark.parametrize(
    "rest",
    [
        b"ZZ\r\n" + b'"messages":[]}' + b"\r\n0\r\n\r\n",  # a size that is not hex
        b"5\r\n" + b'"mess' + b"XX" + b"0\r\n\r\n",  # no CRLF after a chunk
        b"5\r\n" + b'"messages":[]}' + b"\r\n0\r\n\r\n",  # a chunk longer than it said
    ],
)
@pytest.mark.parametrize("listener", ["uds", "tls"])
def test_framing_that_breaks_in_the_middle_of_a_body_gets_400_at_once(
    gw: tuple[Env, GatewayThread], rest: bytes, listener: str
) -> None:
    """Chunks that break after the body started to be read get the provider-shaped 400
    (`invalid_request`) then and there, one answer, and the connection closes: the body's
    reader once waited `body_idle_s` (30 s) for bytes that could never come and answered a
    retryable 408, which SDKs resend."""
    env, gateway = gw
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.gateway_key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    first = b'a\r\n{"model":"\r\n'
    with raw_socket(gateway, env, listener) as sock:
        sock.sendall(head + first)
        time.sleep(0.3)  # the handler is reading the body by now
        sock.sendall(rest)
        sock.settimeout(5)  # far below `body_idle_s`
        reply = read_until_closed(sock)
    assert reply.count(b"HTTP/1.1 ") == 1 and reply.startswith(b"HTTP/1.1 400"), reply[:200]
    assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "invalid_request"
