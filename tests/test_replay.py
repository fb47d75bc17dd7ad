"""The replayed 30-turn agent session through wiregate to the caching mock provider: from
turn 2 on every turn reads the previous turn's prefix, and the overall cached-read share
is within 10 % of the optimum the session allows. Sent directly without markers, the
Anthropic session caches nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from gateway.mockprovider import MockProviderServer
from tests import replay
from tests.conftest import GatewayFactory
from tests.harness import UPSTREAM_KEY, Env, GatewayThread, raw_client

TURNS = 30


@pytest.fixture(scope="module")
def caching_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockProviderServer]:
    server = MockProviderServer(api_key=UPSTREAM_KEY).start()  # its own cache store
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gw(caching_mock: MockProviderServer, gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("replay", mock_url=caching_mock.url) as started:
        yield started


def run_session(post: Any, provider: str, session: replay.Session) -> list[dict[str, Any]]:
    usages = []
    for turn in range(TURNS):
        body = (
            replay.anthropic_request(session, turn) if provider == "anthropic" else replay.openai_request(session, turn)
        )
        r = post("/v1/messages" if provider == "anthropic" else "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        usages.append(r.json()["usage"])
    return usages


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_replayed_session_reads_each_previous_turn(gw: tuple[Env, GatewayThread], provider: str) -> None:
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    session = replay.build_session(TURNS, seed=11 if provider == "anthropic" else 12)
    usages = run_session(
        lambda path, body: client.post(path, json=body, headers={"authorization": f"Bearer {env.gateway_key}"}),
        provider,
        session,
    )
    rows = replay.figures(provider, usages)
    for row in rows[1:]:
        assert row.optimum_read > 0
        assert row.cache_read >= row.optimum_read, (provider, row)  # the whole previous prompt
    summary = replay.summarise(rows, read_rate=0.1)
    assert summary.of_optimum >= 0.9
    assert summary.billed < summary.billed_uncached


def test_direct_without_markers_caches_nothing_on_anthropic(caching_mock: MockProviderServer) -> None:
    session = replay.build_session(TURNS, seed=13)
    with httpx2.Client(base_url=caching_mock.url, timeout=30) as client:
        usages = run_session(
            lambda path, body: client.post(path, json=body, headers={"x-api-key": UPSTREAM_KEY}), "anthropic", session
        )
    rows = replay.figures("anthropic", usages)
    assert sum(r.cache_read for r in rows) == 0 and sum(r.cache_write_5m + r.cache_write_1h for r in rows) == 0
