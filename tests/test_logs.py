"""Nothing sensitive reaches a log line even where it hides: in object keys along a
finding's location, in header names, in the trace id, in a wildcard principal's scope, in
the HTTP method. Each test checks the lines written while it ran; the session-wide check in
conftest covers every line of every test."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory, LogCapture, assert_nothing_sensitive
from tests.harness import Env, GatewayThread, build_env, raw_client, sensitive

KEY_SECRET = "key-is-a-secret-Quokka-9081"
VALUE_SECRET = "value-is-a-secret-Wombat-5527"
HEX_SECRET = "4bf92f3577b34da6a3ce929d0e0e4736"  # a 32-hex value, as a trace id would be
SCOPE_SECRET = "scope-named-after-a-Secret-Numbat-61"
sensitive(HEX_SECRET, SCOPE_SECRET)


@pytest.fixture(scope="module")
def gw(
    mock: MockProviderServer, shared_tls: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Env, GatewayThread, str]]:
    env = build_env(tmp_path_factory.mktemp("logs"), mock.url, tls_dir=shared_tls, secrets_=[KEY_SECRET, VALUE_SECRET])
    wildcard = env.add_principal("wildcard", ["proxy", "context.check"], ["mock-openai", "mock-anthropic"], ["*"])
    with GatewayThread(env.config) as gateway:
        yield env, gateway, wildcard


def _lines(captured: LogCapture, mark: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in captured.since(mark).splitlines() if line.strip()]


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}], **extra}


@pytest.mark.parametrize(
    "body",
    [
        _chat(metadata={KEY_SECRET: VALUE_SECRET}),  # the finding sits under a secret key
        _chat(metadata={KEY_SECRET: {"inner": VALUE_SECRET}}),
        _chat(metadata={"fine": {KEY_SECRET: "harmless"}}),  # the secret is itself a key
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {KEY_SECRET: {"type": "string", "description": VALUE_SECRET}},
                        },
                    },
                }
            ]
        ),
        _chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": json.dumps({KEY_SECRET: {"x": VALUE_SECRET}})},
                        }
                    ],
                }
            ]
        ),
    ],
    ids=["under_secret_key", "deeper_under_secret_key", "secret_as_key", "tool_schema", "tool_args"],
)
def test_locations_never_carry_object_keys(
    gw: tuple[Env, GatewayThread, str], captured_logs: LogCapture, body: dict[str, Any]
) -> None:
    env, gateway, _ = gw
    mark = captured_logs.mark()
    r = raw_client(gateway, env, uds=True).post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert r.status_code == 403
    lines = _lines(captured_logs, mark)
    decisions = [line for line in lines if line["event"] == "decision"]
    assert decisions and all(line["locations"] for line in decisions)
    for line in decisions:
        for location in line["locations"]:
            assert all(
                seg == "*"
                or seg.isdigit()
                or seg
                in {
                    "metadata",
                    "tools",
                    "function",
                    "parameters",
                    "properties",
                    "description",
                    "messages",
                    "tool_calls",
                    "arguments",
                    "inner",
                    "x",
                    "fine",
                }
                or seg == ""
                for seg in location.split("/")
            ), location
    assert_nothing_sensitive(captured_logs.since(mark))


def test_header_names_are_inspected_and_never_logged(
    gw: tuple[Env, GatewayThread, str], captured_logs: LogCapture
) -> None:
    env, gateway, _ = gw
    mark = captured_logs.mark()
    body = json.dumps(_chat())
    check = {
        "scope_id": "default",
        "phase": "before_send",
        "target_profile": "mock-openai",
        "payload": {
            "schema": "powercontext.model-json-payload.v1",
            "headers": {"content-type": "application/json", KEY_SECRET: "v"},
            "body": body,
        },
    }
    r = raw_client(gateway, env).post(
        "/v1/context/check", json=check, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert r.status_code == 200 and r.json()["decision"] == "block"
    assert_nothing_sensitive(captured_logs.since(mark))


def test_trace_id_is_a_digest(gw: tuple[Env, GatewayThread, str], captured_logs: LogCapture) -> None:
    env, gateway, _ = gw
    mark = captured_logs.mark()
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        json=_chat(),
        headers={"authorization": f"Bearer {env.gateway_key}", "traceparent": f"00-{HEX_SECRET}-00f067aa0ba902b7-01"},
    )
    assert r.status_code == 200
    access = [line for line in _lines(captured_logs, mark) if line["event"] == "request"]
    assert len(access) == 1 and access[0]["trace_id"].startswith("h:")
    assert HEX_SECRET not in captured_logs.since(mark)


def test_wildcard_scope_is_a_digest(gw: tuple[Env, GatewayThread, str], captured_logs: LogCapture) -> None:
    env, gateway, wildcard = gw
    mark = captured_logs.mark()
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        json=_chat(),
        headers={"authorization": f"Bearer {wildcard}", "x-wiregate-scope": SCOPE_SECRET},
    )
    assert r.status_code == 200
    access = [line for line in _lines(captured_logs, mark) if line["event"] == "request"]
    assert access[0]["scope"].startswith("h:") and SCOPE_SECRET not in captured_logs.since(mark)
    # a scope the principal's configuration names is logged as written
    mark = captured_logs.mark()
    r = raw_client(gateway, env).post(
        "/v1/chat/completions", json=_chat(), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert [line["scope"] for line in _lines(captured_logs, mark) if line["event"] == "request"] == ["default"]


def test_methods_are_not_logged_or_echoed_as_text(
    gw: tuple[Env, GatewayThread, str], captured_logs: LogCapture
) -> None:
    env, gateway, _ = gw
    mark = captured_logs.mark()
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(gateway.uds)), base_url="http://localhost") as client:
        # a method HTTP knows but wiregate does not serve: answered, logged as "other"
        r = client.request("PROPFIND", "/v1/chat/completions")
        assert r.status_code == 405
        # not an HTTP method at all: refused by the parser with a fixed body, never echoed
        r = client.request("WOMBATSECRET", "/v1/chat/completions")
        assert r.status_code == 400 and "WOMBATSECRET" not in r.text
        assert r.json()["error"]["details"]["reason_codes"] == ["invalid_request"]
    access = [line for line in _lines(captured_logs, mark) if line["event"] == "request"]
    assert [line["method"] for line in access] == ["other"]
    assert "WOMBATSECRET" not in captured_logs.since(mark) and "PROPFIND" not in captured_logs.since(mark)


def test_the_model_name_is_logged_only_once_a_send_check_inspected_it(
    gw: tuple[Env, GatewayThread, str], gateways: GatewayFactory, captured_logs: LogCapture
) -> None:
    """The model name is client text: logged when the send checks inspected and allowed the
    request, never when they are off (an allow that inspected nothing)."""
    env, gateway, _ = gw
    mark = captured_logs.mark()
    r = raw_client(gateway, env).post(
        "/v1/chat/completions", json=_chat(), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert r.status_code == 200
    logged = [line.get("model") for line in _lines(captured_logs, mark) if line["event"] == "request"]
    assert len(logged) == 1 and isinstance(logged[0], str) and logged[0]  # as written or as its digest
    with gateways("logs-send-off", secrets_=[VALUE_SECRET], policy_extra='[modes]\nbefore_send = "off"\n') as (
        off_env,
        off_gw,
    ):
        mark = captured_logs.mark()
        r = raw_client(off_gw, off_env).post(
            "/v1/chat/completions",
            json=_chat(model="gpt-" + VALUE_SECRET),
            headers={"authorization": f"Bearer {off_env.gateway_key}"},
        )
        assert r.status_code in (200, 403)
        access = [line for line in _lines(captured_logs, mark) if line["event"] == "request"]
        assert len(access) == 1 and access[0].get("model") is None
        assert VALUE_SECRET not in captured_logs.since(mark)


def test_a_model_name_is_logged_only_when_it_is_a_model_id_the_upstream_served(
    gw: tuple[Env, GatewayThread, str], mock: MockProviderServer, captured_logs: LogCapture
) -> None:
    """A profile's pattern admits any text after its prefix, and an upstream may answer any
    name (the mock does), so a model name is logged as written only in a model id's shape,
    once the upstream answered it with a success, and when the gateway can vouch for the
    name: its upstream listed it (or the signed profile names it exactly). Otherwise as a
    keyed digest (the same name, the same digest)."""
    env, gateway, _ = gw
    client = raw_client(gateway, env)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    prose = "gpt-patient Jane Roe diagnosis Wombat"
    words = "gpt-patient-JaneRoe-diagnosis-Wombat"  # a model id's shape, answered 200, never listed
    sid = "logmodel" + uuid.uuid4().hex[:8]
    mock.state.add_scenario(sid, [{"status": 404, "error_message": "no such model"}])
    listing = client.get("/v1/models", headers=headers)
    assert listing.status_code == 200 and "gpt-4.1-mini" in {m["id"] for m in listing.json()["data"]}
    mark = captured_logs.mark()
    calls = ((prose, {}), (prose, {}), ("gpt-4.1-mini", {"user": f"mock-scenario:{sid}"}), (words, {}))
    for model, extra in calls:
        r = client.post("/v1/chat/completions", json=_chat(model=model, **extra), headers=headers)
        assert r.status_code == (404 if extra else 200), r.text
    r = client.post("/v1/chat/completions", json=_chat(model="gpt-4.1-mini"), headers=headers)
    assert r.status_code == 200, r.text
    models = [line.get("model") for line in _lines(captured_logs, mark) if line["event"] == "request"]
    assert len(models) == 5 and all(isinstance(m, str) and m.startswith("h:") for m in models[:4]), models
    assert models[0] == models[1] != models[2] and models[3] not in models[:3]
    assert models[4] == "gpt-4.1-mini"  # listed by the upstream and answered: written as is
    logged = captured_logs.since(mark)
    assert "Jane Roe" not in logged and "JaneRoe" not in logged


def test_the_log_digest_is_hmac_sha256_for_every_key_length() -> None:
    import hmac as std_hmac

    from gateway.obs.logging import digest, hmac_sha256

    for key_len in (0, 1, 16, 32, 63, 64, 65, 200):
        key = bytes((7 * n + key_len) % 256 for n in range(key_len))
        for message in (b"", b"scope\x00default", "trace \u00e9\ud800".encode("utf-8", "surrogatepass"), b"x" * 1000):
            assert hmac_sha256(key, message) == std_hmac.digest(key, message, "sha256")
        assert digest("a-trace-id", key) == "h:" + std_hmac.digest(key, b"a-trace-id", "sha256")[:8].hex()
    assert hmac_sha256(b"k" * 32, b"one") != hmac_sha256(b"j" * 32, b"one")  # the key matters, per key state
