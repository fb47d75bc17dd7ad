"""Anthropic token counting through wiregate (`POST /v1/messages/count_tokens`) with the
official SDK: a proxied route with the same before_send checks as Messages, its
`{"input_tokens": N}` released only after before_release."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, direct_anthropic, raw_client, sensitive

SECRET = "count-tokens-secret-value-7731"
MESSAGES = [{"role": "user", "content": "How many tokens is this sentence, roughly?"}]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    sensitive(SECRET)
    with gateways("count_tokens", secrets_=[SECRET]) as started:
        yield started


@pytest.mark.parametrize("transport", ["https", "uds"])
def test_count_tokens_allowed(gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str) -> None:
    env, gateway = gw
    client = anthropic_client(gateway, env, uds=transport == "uds")
    via = client.messages.count_tokens(model="claude-sonnet-4-6", system="Be brief.", messages=MESSAGES)
    direct = direct_anthropic(mock.url).messages.count_tokens(
        model="claude-sonnet-4-6", system="Be brief.", messages=MESSAGES
    )
    assert via.input_tokens == direct.input_tokens > 0
    last = mock.state.records()[-1]
    assert last.path == "/v1/messages/count_tokens"
    assert "cache_control" not in last.body.decode()  # no cache markers planned: counting never caches


def test_count_tokens_with_a_secret_is_refused(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    client = anthropic_client(gateway, env)
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        client.messages.count_tokens(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": f"my key is {SECRET}"}]
        )
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "permission_error" and error["code"] == "request_blocked"
    assert error["reason_codes"] == ["secret_value"]
    assert SECRET not in str(caught.value.body)
    assert len(mock.state.records()) == before  # nothing was sent


def test_count_tokens_response_goes_through_before_release(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """An upstream answer holding a configured secret is not released."""
    env, gateway = gw
    sid = "ct-leak"
    mock.state.add_scenario(sid, [{"raw_body": '{"input_tokens": 12, "note": "' + SECRET + '"}'}])
    client = anthropic_client(gateway, env)
    with pytest.raises(anthropic.PermissionDeniedError) as caught:
        client.messages.count_tokens(
            model="claude-sonnet-4-6", messages=[{"role": "user", "content": f"count me mock-scenario:{sid}"}]
        )
    assert caught.value.body["error"]["code"] == "response_blocked"  # type: ignore[index]


def test_count_tokens_is_a_declared_route(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    caps = raw_client(gateway, env).get("/v1/capabilities", headers={"authorization": f"Bearer {env.gateway_key}"})
    assert "/v1/messages/count_tokens" in caps.json()["routes"]


@pytest.mark.parametrize("stream", [True, False, None])
def test_count_tokens_answers_one_body_whatever_the_stream_flag(gw: tuple[Env, GatewayThread], stream: object) -> None:
    """A Messages body reused for counting may say `"stream": true`: counting still answers
    with one JSON body, and it is delivered (not taken for a body sent to a stream)."""
    env, gateway = gw
    body = {"model": "claude-sonnet-4-6", "messages": MESSAGES, "stream": stream}
    r = raw_client(gateway, env).post(
        "/v1/messages/count_tokens",
        json=body,
        headers={"x-api-key": env.gateway_key, "anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["input_tokens"] > 0
