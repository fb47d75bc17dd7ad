"""Every response names the product and no version in `Server`: aiohttp's default
(`Python/3.11 aiohttp/3.x.y`) tells a scanner exactly which HTTP parser bugs to try. This
holds for released, refused, streamed, routed-nowhere and UI responses, and for the fixed
answers the connection layer writes itself (unparseable HTTP, too many connections)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.http.connections import _raw_response
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, openai_client, raw_client, raw_socket, read_until_closed


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("server-header", secrets_=["sk-server-header-secret-77"]) as started:
        yield started


def test_every_kind_of_response_says_only_wiregate(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    auth = {"authorization": f"Bearer {env.gateway_key}"}
    seen: dict[str, tuple[int, str | None]] = {}
    raw = openai_client(gateway, env).chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=[{"role": "user", "content": "hello"}]
    )
    seen["released"] = (raw.http_response.status_code, raw.headers.get("server"))
    for uds in (False, True):
        client = raw_client(gateway, env, uds=uds)
        refused = client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "sk-server-header-secret-77"}]},
            headers=auth,
        )
        seen[f"refused-uds={uds}"] = (refused.status_code, refused.headers.get("server"))
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            headers=auth,
        ) as stream:
            stream.read()
            seen[f"stream-uds={uds}"] = (stream.status_code, stream.headers.get("server"))
        for path in ("/healthz", "/no-such-route", "/ui/", "/v1/models"):
            response = client.get(path, headers=auth)
            seen[f"{path}-uds={uds}"] = (response.status_code, response.headers.get("server"))
    statuses = {name: status for name, (status, _) in seen.items()}
    assert statuses["released"] == 200 and statuses["refused-uds=False"] == 403, statuses
    assert statuses["/no-such-route-uds=True"] == 404 and statuses["stream-uds=True"] == 200, statuses
    assert {name: server for name, (_, server) in seen.items()} == {name: "wiregate" for name in seen}


def test_unparseable_http_is_answered_as_wiregate(gw: tuple[Env, GatewayThread]) -> None:
    _, gateway = gw
    with raw_socket(gateway) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n")
        answer = read_until_closed(sock)
    head = answer.split(b"\r\n\r\n", 1)[0].decode().lower().split("\r\n")
    assert head[0].endswith("400 bad request")
    assert [line for line in head if line.startswith("server:")] == ["server: wiregate"]


def test_the_connection_layers_own_answers_say_wiregate() -> None:
    head = _raw_response(503, "Service Unavailable", "too_many_connections", "m", "too_many_connections")
    lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert [line for line in lines if line.lower().startswith("server:")] == ["server: wiregate"]
