"""Holes an outside review found, closed at the mechanism: the provider credential is a
literal in both phases; released header names and content types are held to known forms;
a failure of ours after heartbeats is the protocol's error event with the type its reason
calls for; binding checks hold in every mode; a mistyped route in the policy is a load
error."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import sse
from gateway.config.load import ConfigError, load_runtime
from gateway.keyring import KeyRing, RingKey
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import UPSTREAM_KEY, Env, GatewayThread, chat_chunk_event, policy_text, raw_client

SECRET = "sk-hardening-SECRET-5150"
BEATS = "[streaming]\nheartbeat_after_s = 0.1\nheartbeat_every_s = 0.1\n"
CHAT = "/v1/chat/completions"
MSGS = "/v1/messages"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("hardening", secrets_=[SECRET], config_extra=BEATS) as started:
        yield started


def _scenario(mock: MockProviderServer, **step: Any) -> str:
    sid = "k" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [step])
    return sid


def _chat(sid: str, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}], **extra}


def _headers(env: Env) -> dict[str, str]:
    return {"authorization": f"Bearer {env.gateway_key}"}


# --- the provider credential ----------------------------------------------------------


def test_a_client_cannot_send_the_provider_credential(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    r = raw_client(gateway, env).post(CHAT, json=_chat("x", user=f"key {UPSTREAM_KEY}"), headers=_headers(env))
    assert r.status_code == 403 and r.json()["error"]["reason_codes"] == ["secret_value"]
    assert len(mock.state.records()) == before


@pytest.mark.parametrize("status", [200, 400, 500])
def test_an_echoed_provider_credential_is_never_released(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, status: int
) -> None:
    env, gateway = gw
    body = (
        json.dumps(
            {
                "id": "c",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": f"your key is {UPSTREAM_KEY}"},
                    }
                ],
            }
        )
        if status == 200
        else json.dumps(
            {"error": {"message": f"Incorrect API key provided: {UPSTREAM_KEY}", "type": "invalid_request_error"}}
        )
    )
    sid = _scenario(mock, status=status, raw_body=body, content_type="application/json")
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
    assert r.status_code == 403 and UPSTREAM_KEY not in r.text
    assert r.json()["error"]["code"] == "response_blocked"


# --- released headers ---------------------------------------------------------------------


def test_response_header_names_and_values_are_held_to_known_forms(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    sid = _scenario(
        mock,
        text="fine",
        headers={
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-reset-tokens": "6m0s",
            "x-ratelimit-Carries_Any.Text!": "1",  # a valid HTTP name, but not of that family's form
            "x-ratelimit-remaining-requests": 'value with "quotes" and {json}',  # not a value of that form
        },
    )
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
    assert r.status_code == 200
    assert r.headers["x-ratelimit-limit-requests"] == "500" and r.headers["x-ratelimit-reset-tokens"] == "6m0s"
    assert "x-ratelimit-remaining-requests" not in r.headers
    assert not any("carries" in name.lower() for name in r.headers)


def test_a_secret_in_a_released_header_name_or_value_is_refused(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    for headers in ({f"x-ratelimit-{SECRET.lower()}": "1"}, {"x-request-id": SECRET}):
        sid = _scenario(mock, text="fine", headers=headers)
        r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
        if headers.get("x-request-id"):
            assert r.status_code == 403 and SECRET not in r.text and SECRET not in str(r.headers)
        else:  # the lowercase form is not the configured value: released only in its known form
            assert SECRET not in str(r.headers)


def test_the_content_type_is_ours(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    body = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        }
    )
    sid = _scenario(mock, raw_body=body, content_type=f"application/json; profile={SECRET}")
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"


def _bom_stream(first: str) -> list[str]:
    """An OpenAI chat stream whose first bytes are UTF-8's byte order mark."""
    return [
        "\ufeff" + chat_chunk_event({"role": "assistant", "content": first}),
        chat_chunk_event({"content": " and more"}),
        chat_chunk_event({}, "stop"),
        "data: [DONE]\n\n",
    ]


@pytest.mark.parametrize("first", ["the first words", f"a {SECRET} first"], ids=["clean", "secret"])
def test_a_stream_opening_with_a_byte_order_mark_is_read_from_its_first_event(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, first: str
) -> None:
    """One leading byte order mark is ignored, as the event-stream standard says: the first
    event is released (it used to be dropped, its first field read as "\ufeffdata"), and a
    secret in it is found."""
    env, gateway = gw
    sid = _scenario(mock, raw_events=_bom_stream(first), split_bytes=1)
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid, stream=True), headers=_headers(env))
    events, clean = sse.parse_all(r.content)
    if SECRET in first:  # refused: a 403, or after heartbeats (this gateway sends them) its error event
        assert SECRET not in r.text
        blocked = r.json() if r.status_code == 403 else json.loads(events[-1].data)
        assert blocked["error"]["code"] == "response_blocked"
        return
    assert r.status_code == 200
    contents = [json.loads(e.data)["choices"][0]["delta"].get("content") for e in events if e.data != "[DONE]"]
    assert clean and contents[:2] == [first, " and more"]


# --- failures after heartbeats ----------------------------------------------------------------


class _BreaksOnOpen(KeyRing):
    """A key ring that seals but raises a TypeError when a binding is opened: a bug of
    ours in the middle of a release, after heartbeats went out."""

    def usable(self, key_id: str) -> RingKey | None:
        raise TypeError("a bug")


@pytest.mark.parametrize("route", [CHAT, MSGS])
def test_any_failure_after_heartbeats_is_the_protocols_error_event(
    mock: MockProviderServer, make_env: Any, gateway_for: Any, route: str
) -> None:
    env = make_env(config_extra=BEATS)
    gateway = gateway_for(env)
    holder = gateway.running.holder
    ring = holder.current.keyring
    holder.swap(dataclasses.replace(holder.current, keyring=_BreaksOnOpen(ring.active, ring.keys)))
    sid = _scenario(mock, text="a fine answer, slowly", chunk_size=2, drip_ms=30)
    body = (
        _chat(sid, stream=True)
        if route == CHAT
        else {
            "model": "claude-test-model",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
        }
    )
    r = raw_client(gateway, env).post(route, json=body, headers=_headers(env))
    assert r.status_code == 200 and r.content.startswith(sse.HEARTBEAT)
    assert b"HTTP/1.1" not in r.content and b"a fine answer" not in r.content
    events, clean = sse.parse_all(r.content)
    assert clean and len(events) == 1
    error = json.loads(events[0].data)["error"]
    assert error["code"] == "internal_error"
    assert error["type"] == ("server_error" if route == CHAT else "api_error")


@pytest.mark.parametrize("route,expected", [(CHAT, "server_error"), (MSGS, "api_error")])
def test_an_incomplete_stream_event_is_not_a_permission_error(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, expected: str
) -> None:
    env, gateway = gw
    sid = _scenario(mock, text="x" * 40, chunk_size=2, drip_ms=30, fault="reset_mid_stream")
    body = (
        _chat(sid, stream=True)
        if route == CHAT
        else {
            "model": "claude-test-model",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
        }
    )
    r = raw_client(gateway, env).post(route, json=body, headers=_headers(env))
    events, _ = sse.parse_all(r.content)
    error = json.loads(events[0].data)["error"]
    assert error["code"] == "response_incomplete" and error["type"] == expected


# --- bindings in every mode; the policy's routes ----------------------------------------------


class _GrantsNothing(KeyRing):
    """Seals, but no key is usable to open: every binding is invalid on release."""

    def usable(self, key_id: str) -> RingKey | None:
        return None


@pytest.mark.parametrize("mode", ["off", "observe"])
def test_the_send_binding_is_verified_whatever_the_release_mode(
    mock: MockProviderServer, make_env: Any, gateway_for: Any, mode: str
) -> None:
    env = make_env(policy_extra=f'[modes]\nbefore_release = "{mode}"\n')
    gateway = gateway_for(env)
    holder = gateway.running.holder
    sid = _scenario(mock, text="hello")
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
    assert r.status_code == 200  # the mode lets the response through ...
    ring = holder.current.keyring
    holder.swap(dataclasses.replace(holder.current, keyring=_GrantsNothing(ring.active, ring.keys)))
    sid = _scenario(mock, text="hello")
    r = raw_client(gateway, env).post(CHAT, json=_chat(sid), headers=_headers(env))
    assert r.status_code == 403 and r.json()["error"]["reason_codes"] == ["binding_invalid"]  # ... never a bad binding
    assert "hello" not in r.text


def test_a_mistyped_route_in_the_policy_is_a_load_error(mock: MockProviderServer, make_env: Any) -> None:
    env = make_env()
    env.write_policy(policy_text(extra='[route_modes."/v1/chat/completion"]\nbefore_send = "observe"\n'))
    with pytest.raises(ConfigError, match="route_modes"):
        load_runtime(env.config)
    env.write_policy(policy_text(extra='[route_modes."/v1/chat/completions"]\nbefore_send = "observe"\n'))
    assert load_runtime(env.config).policy.route_modes
