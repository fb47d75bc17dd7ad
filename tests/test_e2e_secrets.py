"""Configured secret values: never sent upstream, never released to the client.

Each request test proves the value never reached the mock provider (its record of every
request it received) and that the SDK raised a 403-class error naming the reason code and
not the value. Each response test proves the client never received it; observe mode lets
it through and records the decision as observed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, raw_client

SECRET = "sk-wiregate-TEST-7f3a9c1e55"
SECRET_2 = 'pa$$"wörd\\/{x}'  # quotes, backslash, slash, braces, non-ASCII


def _forms(value: str) -> list[bytes]:
    forms = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    return [f.encode() for f in forms]


def _never_reached(mock: MockProviderServer, since: int, *values: str) -> None:
    records = [r for r in mock.state.records() if r.seq > since]
    for record in records:
        for value in values:
            for form in _forms(value):
                assert form not in record.body


def _last_seq(mock: MockProviderServer) -> int:
    records = mock.state.records()
    return records[-1].seq if records else 0


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("secrets", secrets_=[SECRET, SECRET_2]) as started:
        yield started


def _tool_exchange(arguments: str, result: str) -> dict[str, Any]:
    """A chat body whose history holds one tool call (`arguments`) and its `result`."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": result},
        ]
    }


OPENAI_REQUESTS: dict[str, dict[str, Any]] = {
    "message_text": {"messages": [{"role": "user", "content": f"my key is {SECRET} ok"}]},
    "system_prompt": {
        "messages": [{"role": "system", "content": f"use {SECRET_2}"}, {"role": "user", "content": "hi"}]
    },
    "tool_call_arguments": _tool_exchange(json.dumps({"token": SECRET_2}), "done"),
    "tool_result": _tool_exchange("{}", json.dumps({"out": f"x{SECRET}y"})),
    # JSON held in a string: its values are read in order too
    "split_across_argument_values": _tool_exchange(json.dumps({"a": SECRET[:9], "b": SECRET[9:]}), "done"),
    "split_across_json_result_values": _tool_exchange("{}", json.dumps([SECRET_2[:4], 1, SECRET_2[4:]])),
    "split_across_parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": SECRET[:9]}, {"type": "text", "text": SECRET[9:]}]}
        ]
    },
}


@pytest.mark.parametrize("where", sorted(OPENAI_REQUESTS))
@pytest.mark.parametrize("transport", ["https", "uds"])
def test_openai_chat_request_secret_never_sent(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, where: str, transport: str
) -> None:
    env, gateway = gw
    since = _last_seq(mock)
    client = openai_client(gateway, env, uds=transport == "uds")
    with pytest.raises(openai.PermissionDeniedError) as info:
        client.chat.completions.create(model="gpt-4.1", **OPENAI_REQUESTS[where])
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "request_blocked"
    assert "secret_value" in body["reason_codes"]
    text = json.dumps(body) + str(info.value)
    assert SECRET not in text and "wörd" not in text
    _never_reached(mock, since, SECRET, SECRET_2)
    assert _last_seq(mock) == since  # nothing at all was sent


ANTHROPIC_REQUESTS: dict[str, dict[str, Any]] = {
    "system": {
        "system": [{"type": "text", "text": f"policy {SECRET}"}],
        "messages": [{"role": "user", "content": "hi"}],
    },
    "text": {"messages": [{"role": "user", "content": [{"type": "text", "text": f"{SECRET_2}"}]}]},
    "tool_use_input": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"k": SECRET}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        ]
    },
    "tool_result": {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": f"r={SECRET_2}"}]},
        ]
    },
}


@pytest.mark.parametrize("where", sorted(ANTHROPIC_REQUESTS))
def test_anthropic_request_secret_never_sent(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, where: str
) -> None:
    env, gateway = gw
    since = _last_seq(mock)
    with pytest.raises(anthropic.PermissionDeniedError) as info:
        anthropic_client(gateway, env).messages.create(
            model="claude-test-model", max_tokens=50, **ANTHROPIC_REQUESTS[where]
        )
    body = info.value.body
    assert isinstance(body, dict) and body["error"]["code"] == "request_blocked"
    assert body["error"]["reason_codes"] == ["secret_value"]
    assert SECRET not in json.dumps(body) and "wörd" not in json.dumps(body)
    assert _last_seq(mock) == since


def test_responses_and_embeddings_request_secret_never_sent(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    since = _last_seq(mock)
    client = openai_client(gateway, env)
    with pytest.raises(openai.PermissionDeniedError):
        client.responses.create(model="gpt-5", instructions=f"keep {SECRET}", input="hi")
    with pytest.raises(openai.PermissionDeniedError):
        client.responses.create(
            model="gpt-5", input=[{"type": "function_call_output", "call_id": "c", "output": SECRET_2}]
        )
    with pytest.raises(openai.PermissionDeniedError):
        client.embeddings.create(model="text-embedding-3-small", input=["fine", f"not {SECRET}"])
    assert _last_seq(mock) == since


def test_a_value_split_across_the_instructions_and_the_first_turn_is_read_whole(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    """The SDKs write the turns before the instructions; the provider reads the instructions
    first. A value whose first half ends the instructions and second half starts the first
    turn is read as the provider reads it."""
    env, gateway = gw
    since = _last_seq(mock)
    head, tail = SECRET[:11], SECRET[11:]
    with pytest.raises(openai.PermissionDeniedError) as caught:
        openai_client(gateway, env).responses.create(
            model="gpt-5", instructions=f"it begins {head}", input=f"{tail} ends"
        )
    assert caught.value.body["reason_codes"] == ["secret_value"]  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError) as refused:
        anthropic_client(gateway, env).messages.create(
            model="claude-test-model",
            max_tokens=20,
            system=f"it begins {head}",
            messages=[{"role": "user", "content": f"{tail} ends"}],
        )
    assert refused.value.body["error"]["reason_codes"] == ["secret_value"]  # type: ignore[index]
    assert _last_seq(mock) == since
    # the control: the halves apart, each beside other text, are sent
    openai_client(gateway, env).responses.create(model="gpt-5", instructions=f"it begins {head}.", input=f"then {tail}")


def _scenario(mock: MockProviderServer, **step: Any) -> str:
    sid = "r" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [step])
    return sid


RESPONSE_STEPS: dict[str, dict[str, Any]] = {
    "text": {"text": f"Sure, the key is {SECRET}."},
    "tool_arguments": {"tool_calls": [{"name": "send", "arguments": json.dumps({"value": SECRET_2})}]},
    "split_across_events": {"text": f"here: {SECRET} done", "chunk_size": 2},
    "split_tool_args_events": {
        "tool_calls": [{"name": "send", "arguments": json.dumps({"v": SECRET})}],
        "chunk_size": 1,
    },
    "split_tcp_reads": {"text": f"bytes {SECRET_2}", "chunk_size": 3, "split_bytes": 5},
}


def _client_saw(text: str) -> bool:
    return SECRET in text or "wörd" in text or json.dumps(SECRET_2)[1:-1] in text


@pytest.mark.parametrize("where", sorted(RESPONSE_STEPS))
@pytest.mark.parametrize("stream", [False, True])
def test_openai_chat_response_secret_never_released(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, where: str, stream: bool
) -> None:
    env, gateway = gw
    sid = _scenario(mock, **RESPONSE_STEPS[where])
    client = raw_client(gateway, env)
    body = {"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"go mock-scenario:{sid}"}]}
    r = client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "response_blocked"
    assert r.json()["error"]["reason_codes"] == ["secret_value"]
    assert not _client_saw(r.text)
    # The upstream did answer (the mock finished its response); we withheld it.
    rec = [x for x in mock.state.records() if x.scenario == sid]
    assert rec and rec[-1].status == 200


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_sees_response_blocked(gw: tuple[Env, GatewayThread], mock: MockProviderServer, stream: bool) -> None:
    env, gateway = gw
    sid = _scenario(mock, text=f"leak {SECRET}", chunk_size=4)
    with pytest.raises(openai.PermissionDeniedError) as info:
        result = openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1", stream=stream, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        )
        if stream:
            list(result)
    assert info.value.body["code"] == "response_blocked"  # type: ignore[index]
    sid = _scenario(mock, tool_calls=[{"name": "f", "arguments": json.dumps({"k": SECRET})}], chunk_size=2)
    with (
        pytest.raises(anthropic.PermissionDeniedError) as ainfo,
        anthropic_client(gateway, env).messages.stream(
            model="claude-test-model", max_tokens=50, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        ) as s,
    ):
        s.get_final_message()
    assert ainfo.value.body["error"]["code"] == "response_blocked"  # type: ignore[index]


@pytest.mark.parametrize(
    "route,payload",
    [
        ("/v1/responses", {"model": "gpt-5", "input": "x"}),
        (
            "/v1/messages",
            {"model": "claude-test-model", "max_tokens": 20, "messages": [{"role": "user", "content": "x"}]},
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_other_carriers_response_secret_never_released(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, payload: dict[str, Any], stream: bool
) -> None:
    env, gateway = gw
    for step in (
        {"text": f"a {SECRET} b", "chunk_size": 3},
        {"tool_calls": [{"name": "f", "arguments": json.dumps({"k": SECRET_2})}], "chunk_size": 2},
    ):
        sid = _scenario(mock, **step)
        body = json.loads(json.dumps(payload))
        body["stream"] = stream
        if "input" in body:
            body["input"] = f"mock-scenario:{sid}"
        else:
            body["messages"][0]["content"] = f"mock-scenario:{sid}"
        headers = {"authorization": f"Bearer {env.gateway_key}"}
        r = raw_client(gateway, env).post(route, json=body, headers=headers)
        assert r.status_code == 403, r.text
        assert "response_blocked" in r.text and not _client_saw(r.text)


def test_error_body_from_provider_is_inspected(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _scenario(mock, status=400, error_message=f"bad input near {SECRET}")
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
        headers={"authorization": f"Bearer {env.gateway_key}"},
    )
    assert r.status_code == 403 and not _client_saw(r.text)
    sid = _scenario(mock, status=400, error_message="plain provider complaint")
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
        headers={"authorization": f"Bearer {env.gateway_key}"},
    )
    assert r.status_code == 400 and "plain provider complaint" in r.text  # released as the provider sent it


@pytest.fixture(scope="module")
def observe_gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways(
        "observe", secrets_=[SECRET], policy_extra='[modes]\nbefore_send = "enforce"\nbefore_release = "observe"\n'
    ) as started:
        yield started


@pytest.mark.parametrize("stream", [False, True])
def test_observe_mode_passes_and_records(
    observe_gw: tuple[Env, GatewayThread], mock: MockProviderServer, captured_logs: Any, stream: bool
) -> None:
    env, gateway = observe_gw
    sid = _scenario(mock, text=f"observed {SECRET} here", chunk_size=5)
    client = raw_client(gateway, env)
    r = client.post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {env.gateway_key}"},
        json={"model": "gpt-4.1", "stream": stream, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
    )
    assert r.status_code == 200
    assert SECRET in (
        r.text
        if not stream
        else "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            for line in r.text.splitlines()
            if line.startswith("data: {") and json.loads(line[6:])["choices"]
        )
    )
    rid = r.headers["x-powercontext-request-id"]
    decisions = [
        rec for rec in captured_logs.records() if rec.get("event") == "decision" and rec.get("request_id") == rid
    ]
    assert decisions and decisions[-1]["mode"] == "observe" and decisions[-1]["decision"] == "block"
    assert decisions[-1]["observed"] is True and decisions[-1]["reason_codes"] == ["secret_value"]
    metrics = client.get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
    assert (
        'wiregate_decisions_total{decision="block",mode="observe",phase="before_release",reason="secret_value"}'
        in metrics
    )
    # before_send stays enforced in this policy
    with pytest.raises(openai.PermissionDeniedError):
        openai_client(gateway, env).chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": SECRET}]
        )


def test_a_secret_in_the_model_field_is_not_logged(gw: tuple[Env, GatewayThread], captured_logs: Any) -> None:
    env, gateway = gw
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        headers={"authorization": f"Bearer {env.gateway_key}"},
        json={"model": f"gpt-{SECRET}", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code in (403, 422)
    assert SECRET not in captured_logs.text()


def test_observe_per_profile_and_per_route(mock: MockProviderServer, make_env: Any, gateway_for: Any) -> None:
    from tests.harness import mock_profile

    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("watched", "openai", mock.url),
        mock_profile("mock-anthropic", "anthropic", mock.url),
    ]
    env = make_env(
        secrets_=[SECRET],
        profiles=profiles,
        policy_extra=(
            '[profile_modes.watched]\nbefore_send = "observe"\n[route_modes."/v1/messages"]\nbefore_send = "observe"\n'
        ),
    )
    gateway = gateway_for(env)
    client = raw_client(gateway, env)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    chat = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"x {SECRET}"}]}
    assert client.post("/v1/chat/completions", json=chat, headers=headers).status_code == 403  # enforced
    watched = client.post("/v1/chat/completions", json=chat, headers={**headers, "x-wiregate-profile": "watched"})
    assert watched.status_code == 200  # observed on this profile: sent, and recorded
    messages = {"model": "claude-test-model", "max_tokens": 9, "messages": [{"role": "user", "content": SECRET}]}
    assert client.post("/v1/messages", json=messages, headers=headers).status_code == 200  # observed on this route
