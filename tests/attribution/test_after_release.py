"""The attribution record of a call is made after its response is written (off the caller's
latency), and it is still made for plain and streamed calls: the report counts both."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from gateway.proxy import projections
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, openai_client, raw_client


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("attribution-after-release") as started:
        yield started


def _api(env: Env, gw: GatewayThread, method: str, path: str, body: Any = None) -> Any:
    response = raw_client(gw, env).request(
        method, path, json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_the_record_is_made_after_the_response_is_written(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    env, gateway = gw
    assert _api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True}) == {"collecting": True}
    events: list[str] = []
    lock = threading.Lock()
    write_eof = web.Response.write_eof
    record = projections.attribution_record

    async def noted_eof(self: web.Response, data: bytes = b"") -> None:
        await write_eof(self, data)
        if self.headers.get("content-type", "").startswith(("application/json", "text/event-stream")):
            with lock:
                events.append("written")

    def noted_record(*args: Any) -> Any:
        with lock:
            events.append("recorded")
        return record(*args)

    monkeypatch.setattr(web.Response, "write_eof", noted_eof)
    monkeypatch.setattr(projections, "attribution_record", noted_record)
    client = openai_client(gateway, env)
    for stream in (False, True):
        with lock:
            events.clear()
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model="gpt-4.1", messages=[{"role": "user", "content": "count to three"}], stream=True
                )
            )
            assert chunks
        else:
            client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hello"}])
        deadline = time.monotonic() + 5
        while "recorded" not in events and time.monotonic() < deadline:
            time.sleep(0.01)
        with lock:
            assert events == ["written", "recorded"], (stream, events)

    # and both calls are in the ledger once its batched write has run
    deadline = time.monotonic() + 10
    calls = 0
    while time.monotonic() < deadline:
        calls = _api(env, gateway, "GET", "/v1/attribution/report")["boundaries"]
        if calls >= 2:
            break
        time.sleep(0.2)
    assert calls == 2
