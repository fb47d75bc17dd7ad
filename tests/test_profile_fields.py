"""Signed profile fields that used to be validated and never read now do what their names
say: `usage_fields` (which usage figures are believed), `account` and `region` (they name
usage records and separate cache keys), `retention` (a policy can require a promise), and
the check API's typed `usage` joins the usage ledger."""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from gateway import caching
from gateway.config.load import ConfigError, load_runtime
from gateway.mockprovider import MockProviderServer
from gateway.profiles.model import RetryPolicy
from tests.harness import Env, mock_profile, raw_client


def _headers(env: Env) -> dict[str, str]:
    return {"authorization": f"Bearer {env.gateway_key}"}


def _records(env: Env, gateway: Any, request_id: str) -> list[dict[str, Any]]:
    report = raw_client(gateway, env).get("/v1/usage/report", headers=_headers(env)).json()
    return [r for r in report["recent"] if r["request_id"] == request_id]


def test_usage_fields_say_which_figures_are_believed(mock: MockProviderServer, make_env: Any, gateway_for: Any) -> None:
    env = make_env(
        profiles=[
            mock_profile("trusts-all", "openai", mock.url, usage_fields=[]),
            mock_profile(
                "no-cache-figures",
                "openai",
                mock.url,
                models=["other-*"],
                usage_fields=["prompt_tokens", "completion_tokens"],
            ),
        ]
    )
    gateway = gateway_for(env)
    for model, profile in (("gpt-4.1", "trusts-all"), ("other-model", "no-cache-figures")):
        r = raw_client(gateway, env).post(
            "/v1/chat/completions",
            headers=_headers(env),
            json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
        assert record["profile"] == profile
        assert record["input_total"]["provenance"] == "known"
        expected = "known" if profile == "trusts-all" else "unknown"  # a reported 0 is not believed
        assert record["cache_read"]["provenance"] == expected


def test_account_and_region_name_records_and_separate_cache_keys(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    env = make_env(profiles=[mock_profile("eu-account", "openai", mock.url, account="acct-7", region="eu-west-1")])
    gateway = gateway_for(env)
    r = raw_client(gateway, env).post(
        "/v1/chat/completions",
        headers=_headers(env),
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
    )
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert (record["account"], record["region"]) == ("acct-7", "eu-west-1")
    base = caching.CacheContext("p", "s", "profile")
    keys = {
        caching.cache_key(base, "principal"),
        caching.cache_key(caching.CacheContext("p", "s", "profile", account="a1"), "principal"),
        caching.cache_key(caching.CacheContext("p", "s", "profile", account="a2"), "principal"),
        caching.cache_key(caching.CacheContext("p", "s", "profile", account="a1", region="r"), "principal"),
    }
    assert len(keys) == 4


def test_a_call_in_flight_during_a_reload_is_recorded_under_the_configuration_it_was_decided_by(
    mock: MockProviderServer, make_env: Any, gateway_for: Any
) -> None:
    """The exchange pins the runtime for the whole call: a profile re-signed with another
    account and reloaded while the upstream is still answering changes the next call's usage
    record, not the one in flight."""
    patient = {"connect_s": 2, "read_s": 30, "total_s": 40}  # the slow answer is not a timeout
    env = make_env(profiles=[mock_profile("acct", "openai", mock.url, account="acct-before", timeouts=patient)])
    gateway = gateway_for(env)
    sid = "p" + uuid.uuid4().hex[:10]
    # Long enough that the reload (a re-sign and a worker recompile, seconds on a loaded
    # machine) lands while the upstream is still answering.
    mock.state.add_scenario(sid, [{"text": "slow", "delay_ms": 6000}, {"text": "quick"}])
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        slow = pool.submit(raw_client(gateway, env).post, "/v1/chat/completions", headers=_headers(env), json=body)
        assert mock.state.wait_for(lambda recs: any(r.scenario == sid for r in recs), timeout=5)
        env.write_profile(mock_profile("acct", "openai", mock.url, account="acct-after", timeouts=patient))
        assert gateway.reload()
        assert not slow.done()  # the reload landed while the upstream was still answering
        first = slow.result(timeout=30)
    second = raw_client(gateway, env).post("/v1/chat/completions", headers=_headers(env), json=body)
    assert first.status_code == second.status_code == 200
    [before] = _records(env, gateway, first.headers["x-powercontext-request-id"])
    [after] = _records(env, gateway, second.headers["x-powercontext-request-id"])
    assert (before["account"], after["account"]) == ("acct-before", "acct-after")


def test_a_policy_can_require_a_retention_promise(mock: MockProviderServer, make_env: Any, gateway_for: Any) -> None:
    env = make_env(
        profiles=[
            mock_profile("keeps-data", "openai", mock.url, retention="provider-default"),
            mock_profile("zdr", "openai", mock.url, models=["zdr-*"], retention="zero-data-retention"),
        ],
        policy_extra='retention_required = ["zero-data-retention"]\n',
    )
    gateway = gateway_for(env)
    client = raw_client(gateway, env)
    before = len(mock.state.records())
    r = client.post(
        "/v1/chat/completions",
        headers=_headers(env),
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 403 and r.json()["error"]["reason_codes"] == ["retention_not_allowed"]
    assert len(mock.state.records()) == before
    r = client.post(
        "/v1/chat/completions",
        headers={**_headers(env), "x-wiregate-profile": "keeps-data"},
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 403 and r.json()["error"]["reason_codes"] == ["retention_not_allowed"]
    r = client.post(
        "/v1/chat/completions",
        headers=_headers(env),
        json={"model": "zdr-model", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200


@pytest.mark.parametrize(
    "given",
    [
        {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 0},
        {"output_tokens": 3},
    ],
)
def test_the_check_apis_usage_is_recorded(
    mock: MockProviderServer, make_env: Any, gateway_for: Any, given: dict[str, int]
) -> None:
    env = make_env()
    gateway = gateway_for(env)
    client = raw_client(gateway, env)
    body = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}]})
    send = client.post(
        "/v1/context/check",
        headers=_headers(env),
        json={
            "scope_id": "default",
            "phase": "before_send",
            "target_profile": "mock-openai",
            "payload": {"schema": "powercontext.model-json-payload.v1", "headers": {}, "body": body},
        },
    ).json()
    reply = json.dumps(
        {
            "id": "c" + uuid.uuid4().hex,
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}],
        }
    )
    r = client.post(
        "/v1/context/check",
        headers=_headers(env),
        json={
            "scope_id": "default",
            "phase": "before_release",
            "target_profile": "mock-openai",
            "request_binding": send["binding"],
            "completion": "complete",
            "usage": given,
            "payload": {"schema": "powercontext.model-json-payload.v1", "headers": {}, "body": reply},
        },
    )
    assert r.json()["decision"] == "allow"
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert record["outcome"] == "released" and "openai.chat" in record["carrier"].split(",")
    assert record["output"] == {"value": given["output_tokens"], "provenance": "known"}
    if "input_tokens" in given:
        assert record["input_total"] == {"value": 100, "provenance": "known"}
    else:
        assert record["input_total"] == {"value": None, "provenance": "unknown"}


def test_resend_after_reset_is_off_unless_the_signed_profile_says_so(make_env: Any) -> None:
    """`retry.resend_after_reset` (behaviour: tests/test_e2e_faults.py) is part of the
    signed document: off by default, a boolean only, and not to be turned on unsigned."""
    assert RetryPolicy().resend_after_reset is False
    with pytest.raises(ValidationError):
        RetryPolicy.model_validate({"resend_after_reset": "sometimes"})
    env = make_env()
    path = env.dir / "profiles" / "mock-openai.json"
    doc = json.loads(path.read_text())
    doc["retry"]["resend_after_reset"] = True  # edited after signing
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        load_runtime(env.config)
    assert "mock-openai.json" in str(info.value) and "refused" in str(info.value)
