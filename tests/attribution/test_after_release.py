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
from gateway.state import METRICS
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


@pytest.fixture(scope="module")
def offloading(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    """Bodies past 1 KiB are parsed (and split) in a check worker."""
    with gateways(
        "attribution-offloaded", config_extra="[server]\ncheck_workers = 1\n[limits]\noffload_bytes = 1024\n"
    ) as started:
        yield started


@pytest.mark.parametrize("large", [False, True])
def test_an_unreadable_label_header_is_ignored_and_counted(
    gw: tuple[Env, GatewayThread], offloading: tuple[Env, GatewayThread], large: bool
) -> None:
    """A host's unreadable `x-wiregate-blocks` never fails its call; the metrics say its
    labels were ignored (once per call, whether the body was split on the loop or by the
    check worker that parsed it), and a readable one is not counted."""
    env, gateway = offloading if large else gw
    assert gateway.running is not None
    _api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
    ignored = gateway.running.app[METRICS].attribution_records.labels("labels_ignored")
    queued = gateway.running.app[METRICS].attribution_records.labels("queued")
    client = openai_client(gateway, env)
    turns = [{"role": "user", "content": f"turn {n}: " + "padding words " * 50} for n in range(4 if large else 1)]
    for header, counted in (('{"/messages/0":', 1), ('{"/messages/0": "host.task"}', 0), ('["x"]', 1)):
        before, made = ignored._value.get(), queued._value.get()
        client.chat.completions.create(
            model="gpt-4.1",
            messages=turns,  # type: ignore[arg-type]
            extra_headers={"x-wiregate-blocks": header},
        )
        for _ in range(100):  # the record is made with the ledger's next batched write
            if queued._value.get() > made:
                break
            time.sleep(0.05)
        assert queued._value.get() == made + 1
        assert ignored._value.get() == before + counted, header
