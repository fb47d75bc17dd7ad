"""`Expect` is the gateway's to answer, not aiohttp's: `100 Continue` only once the request
passed every check that comes before its body (authentication, route, media type, size), so
a refused client is never invited to send its body; any other expectation is a
provider-shaped 417 with a content-free reason and an access line (aiohttp's own answer is a
text page that echoes the header's value, written before any middleware or log); HTTP/1.0
requests keep ignoring the header, as RFC 9110 says."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, raw_socket, read_response

VALUE = "sk-expect-secret-5521"
CHAT = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]}).encode()


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("expect", secrets_=[VALUE]) as started:
        yield started


def _head(path: str, *lines: str, length: int = len(CHAT), version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: localhost", f"Content-Length: {length}", *lines]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


@pytest.mark.parametrize("value", ["100-continue", "100-Continue "])  # the token is case-insensitive
def test_continue_comes_only_after_the_checks_before_the_body(gw: tuple[Env, GatewayThread], value: str) -> None:
    env, gateway = gw
    auth = f"Authorization: Bearer {env.gateway_key}"
    with raw_socket(gateway) as sock:
        sock.sendall(_head("/v1/chat/completions", auth, "Content-Type: application/json", f"Expect: {value}"))
        status, _, body, rest = read_response(sock)
        assert status == "HTTP/1.1 100 Continue" and body == b"" and rest == b""
        sock.sendall(CHAT)
        status, headers, body, _ = read_response(sock)
        assert status == "HTTP/1.1 200 OK", body
        assert json.loads(body)["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("path", "lines", "want"),
    [
        ("/v1/chat/completions", ("Content-Type: application/json",), "401"),  # no key
        ("/v1/no-such-route", ("Content-Type: application/json", "AUTH"), "404"),
        ("/v1/chat/completions", ("Content-Type: text/plain", "AUTH"), "415"),
        ("/v1/messages", ("Content-Type: application/json", "anthropic-version: 2023-06-01"), "401"),
    ],
    ids=["unauthenticated", "unknown-route", "media-type", "anthropic-unauthenticated"],
)
def test_a_refused_request_is_never_invited_to_send_its_body(
    gw: tuple[Env, GatewayThread], path: str, lines: tuple[str, ...], want: str
) -> None:
    env, gateway = gw
    head = [f"Authorization: Bearer {env.gateway_key}" if line == "AUTH" else line for line in lines]
    with raw_socket(gateway) as sock:
        sock.sendall(_head(path, *head, "Expect: 100-continue"))
        status, _, body, _ = read_response(sock)
    assert status.split()[1] == want, (status, body)
    assert json.loads(body)  # the route's own error shape, not an interim response


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/no-such-route", "/healthz"])
def test_an_unknown_expectation_is_a_content_free_417(
    gw: tuple[Env, GatewayThread], captured_logs: LogCapture, path: str
) -> None:
    _, gateway = gw
    mark = captured_logs.mark()
    extra = ("anthropic-version: 2023-06-01",) if path == "/v1/messages" else ()
    with raw_socket(gateway) as sock:
        sock.sendall(_head(path, "Content-Type: application/json", f"Expect: {VALUE}", *extra) + CHAT)
        status, headers, body, _ = read_response(sock)
    assert status.startswith("HTTP/1.1 417"), (status, body)
    assert VALUE.encode() not in body and headers["content-type"].startswith("application/json")
    error = json.loads(body)
    if path == "/v1/messages":
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    else:
        assert error["error"]["code"] == "expectation_failed"
    lines = [json.loads(line) for line in captured_logs.since(mark).splitlines() if line.strip()]
    assert [(r["status"], r["reason_codes"]) for r in lines if r["event"] == "request"] == [(417, ["invalid_request"])]
    assert VALUE not in captured_logs.since(mark)


def test_http_1_0_ignores_the_header(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    auth = f"Authorization: Bearer {env.gateway_key}"
    with raw_socket(gateway) as sock:
        head = _head(
            "/v1/chat/completions", auth, "Content-Type: application/json", "Expect: 100-continue", version="1.0"
        )
        sock.sendall(head + CHAT)
        status, _, body, _ = read_response(sock)
    assert status.split()[1] == "200", body
    with raw_socket(gateway) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\nExpect: " + VALUE.encode() + b"\r\n\r\n")
        status, _, body, _ = read_response(sock)
    assert status.split()[1] == "200" and VALUE.encode() not in body
