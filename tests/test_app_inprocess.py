"""The app in process (pytest-aiohttp's client): routes and envelope, and the order of the
wire path's steps as its trail records them."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.config.load import load_runtime
from gateway.config.runtime import RuntimeHolder
from gateway.mockprovider import MockProviderServer
from gateway.proxy import exchange as ev
from gateway.state import CALL
from gateway.vocab import Outcome, Phase
from tests.harness import Env

ClientMaker = Callable[[web.Application], Awaitable[TestClient]]  # type: ignore[type-arg]


@pytest.fixture
def app_and_trails(make_env: Callable[..., Env]) -> tuple[web.Application, list[Any], Env]:
    env = make_env(secrets_=["in-process-secret-123"])
    app = create_app(RuntimeHolder(load_runtime(env.config)))
    trails: list[Any] = []

    async def keep_trail(request: web.Request, response: web.StreamResponse) -> None:
        trails.append(request[CALL].trail)

    app.on_response_prepare.append(keep_trail)
    return app, trails, env


@pytest.mark.asyncio
async def test_ops_routes_and_the_envelope(aiohttp_client: ClientMaker, app_and_trails: Any) -> None:
    app, _, env = app_and_trails
    client = await aiohttp_client(app)
    r = await client.get("/healthz")
    assert r.status == 200 and len(r.headers["X-PowerContext-Request-ID"]) == 16
    r = await client.get("/readyz")
    assert r.status == 200
    r = await client.get("/v1/capabilities")
    assert r.status == 401 and (await r.json())["error"]["code"] == "authentication_error"
    r = await client.get("/v1/capabilities", headers={"authorization": f"Bearer {env.gateway_key}"})
    assert sorted((await r.json())["carriers"]) == ["chat", "embeddings", "messages", "responses"]


@pytest.mark.asyncio
async def test_the_steps_of_a_call_in_order(
    aiohttp_client: ClientMaker, app_and_trails: Any, mock: MockProviderServer
) -> None:
    app, trails, env = app_and_trails
    client = await aiohttp_client(app)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    r = await client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status == 200
    trail = trails[-1]
    kinds = [type(e) for e in trail.events]
    assert kinds == [
        ev.Planned,
        ev.Admitted,
        ev.Checked,
        ev.Attempted,
        ev.Buffered,
        ev.Decoded,
        ev.Checked,
        ev.Released,
    ]
    assert [c.phase for c in trail.checks] == [Phase.BEFORE_SEND, Phase.BEFORE_RELEASE]
    assert trail.final.outcome is Outcome.RELEASED

    sid = "t" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"text": "the model says in-process-secret-123"}])
    r = await client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]},
    )
    assert r.status == 403
    trail = trails[-1]
    assert [type(e) for e in trail.events][-3:] == [ev.Decoded, ev.Checked, ev.Refused]
    assert trail.final.outcome is Outcome.BLOCKED

    r = await client.post(
        "/v1/chat/completions",
        headers=headers,
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "in-process-secret-123"}]},
    )
    assert r.status == 403
    trail = trails[-1]
    assert [type(e) for e in trail.events] == [ev.Planned, ev.Admitted, ev.Checked, ev.Refused]
    assert trail.final.outcome is Outcome.REFUSED and not trail.attempts  # nothing was sent
