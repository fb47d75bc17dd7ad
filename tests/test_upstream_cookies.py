"""The upstream client keeps no cookies: a provider's `Set-Cookie` (a CDN's bot-management
cookie, say) must not ride along on later calls, which belong to other callers and other
principals. One shared cookie jar would link every tenant's calls at the provider and carry
whatever the provider set into requests wiregate did not build. The client never sees a
provider's `Set-Cookie` either (response headers are allow-listed).

Profiles reach plain-HTTP providers only at loopback IP literals, whose cookies a jar refuses
anyway, so the first test drives the gateway's own upstream session (its cleanup context,
as the app builds it) against a provider reached by host name."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from aiohttp import web

from gateway.app import _upstream
from gateway.mockprovider import MockProviderServer
from gateway.proxy.upstream import UPSTREAM
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client


@pytest.mark.asyncio
async def test_the_upstream_session_sends_no_cookie_a_provider_set() -> None:
    seen: list[str | None] = []

    async def provider(request: web.Request) -> web.Response:
        seen.append(request.headers.get("cookie"))
        response = web.json_response({"ok": True})
        response.set_cookie("__cf_bm", "tenant-a-" + uuid.uuid4().hex, path="/", domain="localhost", httponly=True)
        return response

    site_app = web.Application()
    site_app.router.add_post("/v1/chat/completions", provider)
    runner = web.AppRunner(site_app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    app = web.Application()
    try:
        async with contextlib.asynccontextmanager(_upstream)(app):
            session = app[UPSTREAM].session
            for _ in range(2):
                async with session.post(f"http://localhost:{port}/v1/chat/completions", json={}) as response:
                    assert response.status == 200
                    assert "set-cookie" in response.headers  # the provider did set one
    finally:
        await runner.cleanup()
    assert seen == [None, None]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("cookies") as started:
        yield started


def test_a_providers_set_cookie_never_reaches_the_client(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    sid = "c" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"text": "hello", "headers": {"set-cookie": "__cf_bm=x; Path=/; HttpOnly"}}])
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    response = raw_client(gateway, env).post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert response.status_code == 200, response.text
    assert [r.status for r in mock.state.records() if r.scenario == sid] == [200]
    assert "set-cookie" not in response.headers
