"""Hop-by-hop headers (RFC 9110 §7.6.1) through the real gateway and the bundled mock: a
header that a message's Connection header lists is dropped in both directions (provider
response -> client, client request -> provider), across every Connection line and in any
case; a profile whose `passthrough_headers` names a framing or hop-by-hop header
(transfer-encoding, te, connection, upgrade, ...) is refused at load, and the upstream header
builder drops such names even from a profile that got past the model (defence in depth) —
with transfer-encoding passed through, a chunked client request reached the provider with
both Content-Length and Transfer-Encoding."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.config.load import ConfigError, load_runtime
from gateway.mockprovider import MockProviderServer
from gateway.profiles.model import UpstreamProfile
from gateway.proxy.release import released_headers
from gateway.proxy.upstream import ANTHROPIC_VERSION, upstream_headers
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, raw_client

PASSED = ["openai-beta", "openai-organization"]


@pytest.fixture(scope="module")
def gw(mock: MockProviderServer, gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url, passthrough_headers=PASSED),
        mock_profile("mock-anthropic", "anthropic", mock.url, passthrough_headers=["anthropic-beta"]),
    ]
    with gateways("hop-by-hop", profiles=profiles) as started:
        yield started


def _sid(mock: MockProviderServer, *steps: dict[str, Any]) -> str:
    sid = "h" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, list(steps))
    return sid


def _received(mock: MockProviderServer, sid: str) -> dict[str, str]:
    """The headers the provider received for the one request of scenario `sid`."""
    records = [r for r in mock.state.records() if r.scenario == sid]
    assert len(records) == 1, len(records)
    return records[0].headers


def _chat(sid: str, *, stream: bool = False) -> bytes:
    body = {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    return json.dumps(body).encode()


def _post(gw: tuple[Env, GatewayThread], path: str, body: Any, headers: list[tuple[str, str]]) -> Any:
    env, gateway = gw
    sent = [("authorization", f"Bearer {env.gateway_key}"), ("content-type", "application/json"), *headers]
    return raw_client(gateway, env).post(path, content=body, headers=sent)


# --- provider response -> client --------------------------------------------------------

LISTING = {
    # Both would be released (allow-listed names, plain values) were they not listed.
    "connection": "keep-alive, X-RateLimit-Limit-Requests ,x-request-id",
    "x-ratelimit-limit-requests": "77",
    "x-request-id": "req-hop-123",
    "x-ratelimit-remaining-requests": "76",  # not listed: released as before
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_response_headers_its_connection_header_lists_do_not_reach_the_client(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, stream: bool
) -> None:
    sid = _sid(mock, {"text": "fine", "headers": LISTING})
    response = _post(gw, "/v1/chat/completions", _chat(sid, stream=stream), [])
    assert response.status_code == 200, response.text
    assert _received(mock, sid)  # it went through the provider
    assert "x-ratelimit-limit-requests" not in response.headers
    assert "x-request-id" not in response.headers
    assert response.headers.get("x-ratelimit-remaining-requests") == "76"


def test_released_headers_read_every_connection_line() -> None:
    upstream = CIMultiDict(
        [
            ("Connection", "keep-alive"),
            ("x-ratelimit-limit-requests", "77"),
            ("CONNECTION", " , Retry-After,"),
            ("retry-after", "3"),
            ("x-ratelimit-remaining-requests", "76"),
        ]
    )
    assert released_headers(CIMultiDictProxy(upstream)) == {
        "x-ratelimit-limit-requests": "77",
        "x-ratelimit-remaining-requests": "76",
    }


# --- client request -> provider ----------------------------------------------------------


def test_a_client_header_its_connection_header_lists_does_not_reach_the_provider(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    sid = _sid(mock, {"text": "fine"})
    headers = [
        ("connection", "keep-alive"),
        ("Connection", "OpenAI-Beta"),  # a second line, another case
        ("openai-beta", "assistants=v2"),
        ("openai-organization", "org-hop"),  # on the profile's list, not in Connection
    ]
    response = _post(gw, "/v1/chat/completions", _chat(sid), headers)
    assert response.status_code == 200, response.text
    received = _received(mock, sid)
    assert "openai-beta" not in received
    assert received.get("openai-organization") == "org-hop"
    assert "openai-beta" not in received.get("connection", "").lower()


def test_an_anthropic_version_its_connection_header_lists_is_not_the_clients(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    sid = _sid(mock, {"text": "fine"})
    body = {
        "model": "claude-test-model",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
    }
    headers = [
        ("connection", "anthropic-version, anthropic-beta"),
        ("anthropic-version", "2099-01-01"),
        ("anthropic-beta", "tools-2024"),
    ]
    response = _post(gw, "/v1/messages", json.dumps(body).encode(), headers)
    assert response.status_code == 200, response.text
    received = _received(mock, sid)
    assert received.get("anthropic-version") == ANTHROPIC_VERSION
    assert "anthropic-beta" not in received


def test_a_chunked_client_request_reaches_the_provider_with_one_framing(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """A guard: the gateway frames what it sends itself (Content-Length), never both."""
    sid = _sid(mock, {"text": "fine"})
    body = _chat(sid)
    response = _post(gw, "/v1/chat/completions", iter([body[:20], body[20:]]), [("te", "trailers")])
    assert response.status_code == 200, response.text
    (record,) = [r for r in mock.state.records() if r.scenario == sid]
    received = record.headers
    assert received.get("content-length") == str(len(record.body))  # what the gateway sent, as sent
    assert "transfer-encoding" not in received and "te" not in received


# --- profiles ------------------------------------------------------------------------------

REFUSED = [
    "transfer-encoding",
    "te",
    "trailer",
    "connection",
    "keep-alive",
    "upgrade",
    "proxy-authorization",
    "proxy-connection",
    "content-encoding",
    "expect",
    "Transfer-Encoding",
    "Content-Type",
]


@pytest.mark.parametrize("name", REFUSED)
def test_a_profile_passing_a_framing_or_hop_by_hop_header_is_refused_at_load(
    make_env: Callable[..., Env], mock: MockProviderServer, name: str
) -> None:
    env = make_env(profiles=[mock_profile("pt", "openai", mock.url, passthrough_headers=["openai-beta", name])])
    with pytest.raises(ConfigError) as refused:
        load_runtime(env.config)
    message = str(refused.value)
    assert "profile pt.json: refused" in message and "passthrough_headers" in message
    assert "hop-by-hop" in message and name.lower() in message
    assert mock.url not in message  # content-free: nothing of the document but the name refused


def test_the_upstream_headers_drop_framing_and_hop_by_hop_names_a_profile_lists(mock: MockProviderServer) -> None:
    """Defence in depth: a profile that got past the model (built here without validation)
    still forwards none of them."""
    valid = UpstreamProfile.model_validate(mock_profile("pt", "openai", mock.url, passthrough_headers=["openai-beta"]))
    listed = (
        "openai-beta",
        "transfer-encoding",
        "te",
        "connection",
        "upgrade",
        "content-encoding",
        "expect",
        "content-type",
        "user-agent",
    )
    profile = valid.model_copy(update={"passthrough_headers": listed})
    client = {
        "openai-beta": "assistants=v2",
        "transfer-encoding": "chunked",
        "te": "trailers",
        "connection": "upgrade",
        "upgrade": "websocket",
        "content-encoding": "gzip",
        "expect": "100-continue",
        "content-type": "text/plain",
        "user-agent": "client-agent/1.0",
    }
    sent = upstream_headers(profile, "k", client)
    assert set(sent) == {"content-type", "user-agent", "authorization", "openai-beta"}
    # the body goes as the JSON the gateway checked, under the gateway's own user agent
    assert sent["content-type"] == "application/json" and sent["user-agent"] != "client-agent/1.0"
