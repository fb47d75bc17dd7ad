"""`GET /v1/models` lists what the caller may use even where profiles name models by
pattern: each profile's upstream list (asked with the profile's credential), filtered by
its patterns, unioned over the caller's profiles, cached briefly; an unreachable upstream
contributes its profile's exact names and fails nothing. Official SDKs as clients."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, mock_profile, openai_client, sensitive

LISTED = {"gpt-4.1-mini", "gpt-5-mini", "text-embedding-3-small", "house-model-1", "claude-sonnet-4-6"}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = [
        # an exact name the upstream does not list is still one the caller may use
        mock_profile("mock-openai", "openai", mock.url, models=["gpt-*", "text-embedding-*", "house-model-1"]),
        mock_profile("mock-anthropic", "anthropic", mock.url),
        mock_profile(
            "gone",
            "openai",
            f"http://127.0.0.1:{_closed_port()}",
            models=["exact-model-1", "pattern-*"],
            retry={"attempts": 0},
            timeouts={"connect_s": 1, "read_s": 1, "total_s": 2},
        ),
    ]
    with gateways("models", profiles=profiles) as started:
        yield started


def _asked(mock: MockProviderServer) -> int:
    return sum(1 for r in mock.state.records() if r.path == "/v1/models")


@pytest.mark.parametrize("transport", ["https", "uds"])
def test_openai_sdk_lists_pattern_models_and_exact_names(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, transport: str
) -> None:
    env, gateway = gw
    models = list(openai_client(gateway, env, uds=transport == "uds").models.list())
    ids = [m.id for m in models]
    # the mock's list filtered by each profile's patterns, plus the unreachable profile's exact name
    assert set(ids) == LISTED | {"exact-model-1"}
    assert len(ids) == len(set(ids)) and "mock-gpt-1" not in ids and "pattern-*" not in ids
    assert all(m.object == "model" for m in models)
    assert {m.owned_by for m in models if m.id == "claude-sonnet-4-6"} == {"anthropic"}
    # Anthropic's created_at becomes OpenAI's created; a name known only exactly has no date
    assert {m.id: m.created for m in models}["claude-sonnet-4-6"] == 1735689600
    assert {m.id: m.created for m in models}["house-model-1"] == 0


def test_anthropic_sdk_gets_anthropic_shape(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    page = anthropic_client(gateway, env).models.list()
    ids = [m.id for m in page.data]
    assert set(ids) == LISTED | {"exact-model-1"}
    assert all(m.type == "model" and m.display_name for m in page.data)
    assert page.has_more is False and page.first_id == ids[0] and page.last_id == ids[-1]
    created = {m.id: m.created_at.year for m in page.data}  # OpenAI's created, as RFC 3339
    assert created["gpt-4.1-mini"] > 1970 and created["exact-model-1"] == 1970


def test_listing_is_cached(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    client = openai_client(gateway, env)
    list(client.models.list())
    before = _asked(mock)
    for _ in range(3):
        assert {m.id for m in client.models.list()} >= LISTED
    assert _asked(mock) == before  # answered from the cache


def test_upstream_is_asked_with_the_profile_credential(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    list(openai_client(gateway, env).models.list())  # asks upstream now, or already did (cached)
    asked = [r for r in mock.state.records() if r.path == "/v1/models"]
    assert asked, "the upstream list was never asked"
    for record in asked:
        assert env.gateway_key not in str(record.headers)  # the caller's key never leaves
        presented = record.headers.get("authorization", "") + record.headers.get("x-api-key", "")
        assert env.upstream_key in presented


def test_models_needs_a_key(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    from tests.harness import raw_client

    assert raw_client(gateway, env).get("/v1/models").status_code == 401


def test_an_upstream_list_is_inspected_and_filtered(make_env) -> None:  # type: ignore[no-untyped-def]
    """A model list holding a configured secret is not released (exact names instead of it);
    ids outside the profile's patterns or a conservative alphabet are dropped."""
    import json

    from gateway.config.load import load_runtime
    from gateway.proxy.models import read_list

    secret = "model-list-secret-5521"
    sensitive(secret)
    env = make_env(secrets_=[secret])
    runtime = load_runtime(env.config)
    loaded = runtime.profiles["mock-openai"]

    def listed(*ids: str) -> list[str] | None:
        got = read_list(runtime, loaded, json.dumps({"data": [{"id": i} for i in ids]}).encode())
        return None if got is None else [m.id for m in got]

    assert listed("gpt-4.1", "claude-3", "gpt-<script>", "gpt-4.1", "text-embedding-3-small") == [
        "gpt-4.1",
        "text-embedding-3-small",
    ]
    assert listed("gpt-4.1", f"gpt-{secret}") is None
    assert read_list(runtime, loaded, b'{"error": {"message": "nope"}}') is None
    assert read_list(runtime, loaded, b"<html>") is None
