"""Usage records per attempt, stream usage the client did not ask for, window admission,
and planning on the real wire path (planned bodies are checked; fallbacks re-plan)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, post_json, raw_client

SECRET = "sk-usage-SECRET-value-31"
SYSTEM = "You are a careful assistant who follows the policy below. " * 120  # > 1024 tokens


@pytest.fixture(scope="module")
def gw(mock: MockProviderServer, gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("mock-anthropic", "anthropic", mock.url, fallbacks=["anthropic-backup"]),
        mock_profile(
            "anthropic-backup",
            "anthropic",
            mock.url,
            cache={"mode": "anthropic-cache-control", "min_prefix_tokens": 1024, "ttl": "5m", "stable_ttl": "1h"},
        ),
        mock_profile("estimating", "openai", mock.url, estimator={"name": "runes/4", "fill_missing": True}),
        mock_profile("small-window", "openai", mock.url, context_window=300, max_output_tokens=100),
    ]
    with gateways("usage", profiles=profiles, secrets_=[SECRET]) as started:
        yield started


def _sid(mock: MockProviderServer, *steps: dict[str, Any]) -> str:
    sid = "u" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, list(steps) or [{}])
    return sid


def _records(env: Env, gateway: GatewayThread, request_id: str) -> list[dict[str, Any]]:
    report = (
        raw_client(gateway, env).get("/v1/usage/report", headers={"authorization": f"Bearer {env.gateway_key}"}).json()
    )
    return [r for r in report["recent"] if r["request_id"] == request_id]


def _values(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v["value"] for k, v in record.items() if isinstance(v, dict) and "value" in v}


def _client_usage(route: str, stream: bool, r: Any) -> dict[str, Any]:
    if not stream:
        return dict(r.json()["usage"])
    events, _ = sse.parse_all(r.content)
    usage: dict[str, Any] = {}
    for ev in events:
        if ev.data == "[DONE]":
            continue
        obj = json.loads(ev.data)
        if route == "/v1/messages":
            part = obj.get("message", {}).get("usage") if obj.get("type") == "message_start" else obj.get("usage")
            usage.update({k: v for k, v in (part or {}).items() if v is not None})
        elif route == "/v1/responses":
            if obj.get("type") == "response.completed":
                usage = obj["response"]["usage"]
        elif obj.get("usage"):
            usage = obj["usage"]
    return usage


CASES = [
    (
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": "count the words here please"}]},
    ),
    ("/v1/responses", {"model": "gpt-5", "input": "count the words here please"}),
    (
        "/v1/messages",
        {
            "model": "claude-test-model",
            "max_tokens": 50,
            "messages": [{"role": "user", "content": "count the words here please"}],
        },
    ),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route,body", CASES, ids=["chat", "responses", "messages"])
def test_records_match_the_providers_figures(
    gw: tuple[Env, GatewayThread], route: str, body: dict[str, Any], stream: bool
) -> None:
    env, gateway = gw
    payload = {**body, "stream": stream}
    if route == "/v1/chat/completions" and stream:
        payload["stream_options"] = {"include_usage": True}  # the client asks: it sees the same figures
    r = post_json(gateway, env, route, payload)
    assert r.status_code == 200
    seen = _client_usage(route, stream, r)
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    got = _values(record)
    assert record["outcome"] == "released" and record["status"] == 200
    if route == "/v1/messages":
        assert got["input_uncached"] == seen["input_tokens"] and got["output"] == seen["output_tokens"]
        assert (
            got["cache_read"] == seen["cache_read_input_tokens"]
            and got["cache_write"] == seen["cache_creation_input_tokens"]
        )
        assert (
            got["input_total"]
            == seen["input_tokens"] + seen["cache_read_input_tokens"] + seen["cache_creation_input_tokens"]
        )
    elif route == "/v1/responses":
        assert got["input_total"] == seen["input_tokens"] and got["output"] == seen["output_tokens"]
        assert got["cache_read"] == seen["input_tokens_details"]["cached_tokens"]
        assert got["reasoning"] == seen["output_tokens_details"]["reasoning_tokens"]
    else:
        assert got["input_total"] == seen["prompt_tokens"] and got["output"] == seen["completion_tokens"]
        assert got["cache_read"] == seen["prompt_tokens_details"]["cached_tokens"]
        assert (
            got["input_uncached"]
            == seen["prompt_tokens"]
            - seen["prompt_tokens_details"]["cached_tokens"]
            - seen["prompt_tokens_details"]["cache_write_tokens"]
        )
    assert all(
        v["provenance"] == "known" for k, v in record.items() if isinstance(v, dict) and v.get("value") is not None
    )


def test_embeddings_record(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    r = post_json(gateway, env, "/v1/embeddings", {"model": "text-embedding-3-small", "input": ["a b c", "d e"]})
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert _values(record)["input_total"] == r.json()["usage"]["prompt_tokens"]


def test_chat_stream_usage_the_client_did_not_ask_for(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": "an answer in pieces", "chunk_size": 3})
    body = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"go mock-scenario:{sid}"}]}
    r = post_json(gateway, env, "/v1/chat/completions", body)
    upstream = [x for x in mock.state.records() if x.scenario == sid][-1].json
    assert upstream["stream_options"] == {"include_usage": True}  # asked for upstream...
    events, _ = sse.parse_all(r.content)
    assert all('"usage"' not in e.data for e in events)  # ...and not shown to the client
    import httpx2

    from tests.harness import UPSTREAM_KEY

    direct = httpx2.post(
        mock.url + "/v1/chat/completions",
        json={**body, "prompt_cache_key": upstream["prompt_cache_key"]},
        headers={"authorization": f"Bearer {UPSTREAM_KEY}"},
    )
    direct_events, _ = sse.parse_all(direct.content)
    assert [e.data for e in events] == [e.data for e in direct_events]  # byte for byte what it asked for
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert _values(record)["output"] is not None and record["output"]["provenance"] == "known"


def test_missing_usage_is_unknown_never_zero(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    for profile, expected in (("mock-openai", "unknown"), ("estimating", "estimated")):
        sid = _sid(mock, {"text": "no usage reported here", "omit_usage": True})
        r = post_json(
            gateway,
            env,
            "/v1/chat/completions",
            {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
            **{"x-wiregate-profile": profile},
        )
        assert r.status_code == 200 and "usage" not in r.json()
        [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
        assert record["input_total"]["provenance"] == expected and record["output"]["provenance"] == expected
        if expected == "unknown":
            assert record["input_total"]["value"] is None and record["output"]["value"] is None
            assert record["estimator"] is None
        else:
            assert record["input_total"]["value"] > 0 and record["estimator"] == "runes/4@1"
        assert record["cache_read"]["value"] is None  # never summed as zero


def test_retry_yields_two_attempt_records(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"status": 429, "headers": {"retry-after-ms": "10"}}, {"text": "ok"})
    r = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
    )
    assert r.status_code == 200
    first, second = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert (first["attempt"], first["outcome"], first["status"]) == (0, "retry", 429)
    assert first["input_total"]["provenance"] == "unknown"
    assert (second["attempt"], second["outcome"]) == (1, "released") and second["input_total"]["provenance"] == "known"


def test_withheld_response_is_recorded(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"text": f"leak {SECRET}"})
    r = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
    )
    assert r.status_code == 403
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert record["outcome"] == "blocked" and record["output"]["provenance"] == "known"  # the provider billed it


def test_window_exceeded_reaches_no_upstream(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    r = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "messages": [{"role": "user", "content": "word " * 400}]},
        **{"x-wiregate-profile": "small-window"},
    )
    assert r.status_code == 422 and r.json()["error"]["reason_codes"] == ["window_exceeded"]
    assert len(mock.state.records()) == before
    r = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "max_completion_tokens": 280, "messages": [{"role": "user", "content": "short"}]},
        **{"x-wiregate-profile": "small-window"},
    )
    assert r.status_code == 422  # the requested output counts too
    r = post_json(
        gateway,
        env,
        "/v1/chat/completions",
        {"model": "gpt-4.1", "max_completion_tokens": 50, "messages": [{"role": "user", "content": "short"}]},
        **{"x-wiregate-profile": "small-window"},
    )
    assert r.status_code == 200


def test_planned_body_is_what_gets_checked(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    body = {
        "model": "claude-test-model",
        "max_tokens": 20,
        "system": SYSTEM + SECRET,
        "messages": [{"role": "user", "content": "hi"}],
    }
    r = post_json(gateway, env, "/v1/messages", body)
    assert r.status_code == 403 and len(mock.state.records()) == before
    ok = post_json(gateway, env, "/v1/messages", {**body, "system": SYSTEM})
    assert ok.status_code == 200
    sent = mock.state.records()[-1].json
    assert sent["system"][0]["cache_control"] == {"type": "ephemeral"}  # planned and sent


def test_fallback_is_replanned_for_its_profile(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    sid = _sid(mock, {"status": 500}, {"status": 500}, {"status": 500}, {"text": "from backup"})
    body = {
        "model": "claude-test-model",
        "max_tokens": 20,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": f"hi mock-scenario:{sid}"}],
    }
    r = post_json(gateway, env, "/v1/messages", body)
    assert r.status_code == 200
    sent = [x.json for x in mock.state.records() if x.scenario == sid]
    assert [s["system"][0]["cache_control"] for s in sent] == [{"type": "ephemeral"}] * 3 + [
        {"type": "ephemeral", "ttl": "1h"}
    ]
    records = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert [x["profile"] for x in records] == ["mock-anthropic"] * 3 + ["anthropic-backup"]


def test_client_markers_are_forwarded_exactly(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """Four client markers: the upstream body is byte-for-byte what the client sent. Two:
    wiregate adds at most two more, and never touches the client's."""
    env, gateway = gw
    marker = {"type": "ephemeral"}
    blocks = [{"type": "text", "text": SYSTEM[:2000] + str(i), "cache_control": marker} for i in range(4)]
    body = {
        "model": "claude-test-model",
        "max_tokens": 20,
        "system": blocks,
        "messages": [{"role": "user", "content": "hi"}],
    }
    raw = json.dumps(body, indent=2).encode()  # the client's own formatting
    r = raw_client(gateway, env).post(
        "/v1/messages",
        content=raw,
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"},
    )
    assert r.status_code == 200
    assert mock.state.records()[-1].body == raw
    two = {
        **body,
        "system": blocks[:2] + [{"type": "text", "text": SYSTEM}],
        "messages": [
            {"role": "user", "content": "first " * 50},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ],
    }
    r = post_json(gateway, env, "/v1/messages", two)
    assert r.status_code == 200
    sent = mock.state.records()[-1].json
    count = sum(1 for b in sent["system"] if "cache_control" in b) + sum(
        1 for m in sent["messages"] if isinstance(m["content"], list) for b in m["content"] if "cache_control" in b
    )
    assert count == 4
    assert sent["system"][0]["cache_control"] == marker and sent["system"][1]["cache_control"] == marker
