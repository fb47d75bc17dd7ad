"""The gateway's own small routes under hostile input: a sign-in (read before any
authentication) and the collection switches take a few kilobytes and never buffer or inflate
more (413 on the declared length, on the bytes as they come and on the inflated size); the
ops and attribution routes answer with `no-store` and `nosniff` (refusals too), the
provider routes as their provider does; the attribution report authenticates before it
judges its query."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.api.ui import SECURITY_HEADERS
from tests.conftest import GatewayFactory, LogCapture
from tests.harness import Env, GatewayThread, openai_client, raw_client, raw_socket, read_response

MiB = 1024 * 1024
KEYS: dict[str, str] = {}


def _principals(env: Env) -> None:
    KEYS["viewer"] = env.add_principal("hardening-viewer", ["observe"], [], ["team-*"])


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("api-hardening", prepare=_principals) as started:
        yield started


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _too_large(body: Any) -> bool:
    """The gateway's own refusal shape, with the reason code every over-limit body gets."""
    error = body["error"]
    return bool(error["code"] == "payload_too_large" and error["details"]["reason_codes"] == ["payload_too_large"])


# --- 1. the small routes' own body bound --------------------------------------------------


def test_sign_in_refuses_a_declared_length_past_4_kib_before_the_body(gw: tuple[Env, GatewayThread]) -> None:
    """A client that waits for `100 Continue` with 31 MiB declared is refused at once, and
    never invited to send the body."""
    _, gateway = gw
    with raw_socket(gateway) as sock:
        sock.sendall(
            b"POST /ui/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n" + f"Content-Length: {31 * MiB}\r\n\r\n".encode()
        )
        status, headers, body, _ = read_response(sock)
    assert status.split(" ", 2)[1] == "413", status  # not "100 Continue"
    assert _too_large(json.loads(body))
    assert headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]  # still under /ui/


@pytest.mark.parametrize("size", [4097, 64 * 1024])
def test_sign_in_refuses_a_body_past_4_kib_as_it_arrives(gw: tuple[Env, GatewayThread], size: int) -> None:
    """No declared length (chunked): the bytes are counted as they come."""
    env, gateway = gw
    body = b'{"key": "wrong", "pad": "' + b"a" * (size - 27) + b'"}'
    assert len(body) == size

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(body), 1000):
            yield body[at : at + 1000]

    answer = raw_client(gateway, env).post("/ui/login", content=chunks(), headers={"content-type": "application/json"})
    assert answer.status_code == 413 and _too_large(answer.json())


def test_sign_in_still_reads_a_body_of_4_kib(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    body = b'{"key": "wrong", "pad": "' + b"a" * (4096 - 27) + b'"}'
    assert len(body) == 4096
    answer = raw_client(gateway, env).post("/ui/login", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 401  # read, and refused for its key


def _bomb(inflated: int) -> bytes:
    """A valid JSON sign-in, `inflated` bytes once inflated, within 4 KiB compressed."""
    bomb = gzip.compress(b'{"key": "wrong"' + b" " * (inflated - 16) + b"}", 9)
    assert len(bomb) <= 4096
    return bomb


def test_sign_in_stops_inflating_at_4_kib(gw: tuple[Env, GatewayThread]) -> None:
    """A gzip body within the raw bound that inflates to 3 MiB is refused once the inflater
    passes 4 KiB: the process never holds the inflated megabytes (its traced peak, the
    gateway's thread included, stays far below them; over the Unix socket, which has no TLS
    buffers to count)."""
    env, gateway = gw
    inflated = 3 * MiB
    bomb = _bomb(inflated)
    http = raw_client(gateway, env, uds=True)
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    http.post("/ui/login", content=_bomb(8192), headers=headers)  # connection and first-call costs out of the way
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        answer = http.post("/ui/login", content=bomb, headers=headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < inflated // 2, f"traced peak {peak} bytes while refusing a {inflated}-byte inflation"
    assert answer.status_code == 413 and _too_large(answer.json())


def test_the_api_switch_reads_at_most_a_kilobyte(gw: tuple[Env, GatewayThread], captured_logs: LogCapture) -> None:
    """The collection switch (admin) bounds its body at 1 KiB: a longer one, or a smaller
    gzip that inflates past it, is 413 and switches nothing."""
    env, gateway = gw
    http = raw_client(gateway, env)
    admin = {**_bearer(env.gateway_key), "content-type": "application/json"}
    before = http.get("/v1/attribution/collection", headers=admin).json()["collecting"]
    mark = captured_logs.mark()
    padded = json.dumps({"collecting": not before}).encode()[:-1] + b" " * 1100 + b"}"
    long = http.post("/v1/attribution/collection", content=padded, headers=admin)
    assert long.status_code == 413 and _too_large(long.json())
    inflating = http.post(
        "/v1/attribution/collection", content=gzip.compress(padded), headers={**admin, "content-encoding": "gzip"}
    )
    assert inflating.status_code == 413 and _too_large(inflating.json())
    assert http.get("/v1/attribution/collection", headers=admin).json()["collecting"] == before
    assert "attribution_collection_switched" not in captured_logs.since(mark)
    exact = json.dumps({"collecting": before}).encode()[:-1] + b" " * 1000 + b"}"
    assert len(exact) <= 1024
    assert http.post("/v1/attribution/collection", content=exact, headers=admin).status_code == 200


def test_the_ui_switch_reads_at_most_4_kib(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    assert http.post("/ui/login", json={"key": env.gateway_key}).status_code == 200
    csrf = str(http.get("/ui/api/session").json()["csrf"])
    padded = b'{"collecting": true' + b" " * 4096 + b"}"
    answer = http.post(
        "/ui/api/collection", content=padded, headers={"content-type": "application/json", "x-wiregate-csrf": csrf}
    )
    assert answer.status_code == 413 and _too_large(answer.json())


# --- 2. no-store and nosniff on the gateway's own routes ----------------------------------

OWN_GETS = [
    "/v1/attribution/report",
    "/v1/attribution/collection",
    "/v1/attribution/registry",
    "/v1/usage/report",
    "/v1/capabilities",
    "/v1/models",
    "/metrics",
    "/healthz",
    "/readyz",
]


def _no_store(headers: Any) -> bool:
    return bool(headers.get("cache-control") == "no-store" and headers.get("x-content-type-options") == "nosniff")


@pytest.mark.parametrize("path", OWN_GETS)
def test_own_routes_answer_no_store_and_nosniff(gw: tuple[Env, GatewayThread], path: str) -> None:
    env, gateway = gw
    answer = raw_client(gateway, env).get(path, headers=_bearer(env.gateway_key))
    assert answer.status_code == 200, answer.text
    assert _no_store(answer.headers), dict(answer.headers)


def test_own_routes_refusals_and_posts_carry_them_too(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    for path in ("/v1/attribution/report", "/v1/usage/report", "/metrics", "/v1/capabilities"):
        refused = http.get(path)
        assert refused.status_code == 401 and _no_store(refused.headers), path
    forbidden = http.get("/v1/attribution/report", params={"scope": "elsewhere"}, headers=_bearer(KEYS["viewer"]))
    assert forbidden.status_code == 403 and _no_store(forbidden.headers)
    current = http.get("/v1/attribution/collection", headers=_bearer(env.gateway_key)).json()["collecting"]
    switched = http.post("/v1/attribution/collection", json={"collecting": current}, headers=_bearer(env.gateway_key))
    assert switched.status_code == 200 and _no_store(switched.headers)


def test_context_and_check_routes_carry_them_too(gw: tuple[Env, GatewayThread]) -> None:
    """Stored memories, prepared context and verdicts are per caller as well."""
    env, gateway = gw
    http = raw_client(gateway, env)
    scopes = http.get("/v1/scopes", headers=_bearer(env.gateway_key))
    assert scopes.status_code == 200 and _no_store(scopes.headers), scopes.text
    check = http.post(
        "/v1/context/check",
        json={"phase": "before_send", "payload": {"messages": [{"role": "user", "content": "hello"}]}},
        headers=_bearer(env.gateway_key),
    )
    assert check.status_code < 500 and _no_store(check.headers), check.text
    assert _no_store(http.get("/v1/scopes").headers)  # the 401 too


def test_provider_routes_and_ui_keep_their_own_headers(gw: tuple[Env, GatewayThread]) -> None:
    """A provider route mirrors its provider (nothing added); /ui/ keeps its own set."""
    env, gateway = gw
    reply = openai_client(gateway, env).chat.completions.with_raw_response.create(
        model="gpt-4.1", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.http_response.status_code == 200
    assert "x-content-type-options" not in reply.headers
    assert reply.headers.get("cache-control") != "no-store"
    refused = raw_client(gateway, env).post("/v1/chat/completions", json={})
    assert refused.status_code == 401 and "x-content-type-options" not in refused.headers
    page = raw_client(gateway, env).get("/ui/")
    for name, value in SECURITY_HEADERS.items():
        assert page.headers[name] == value, name


# --- 3. the report authenticates before it judges its query --------------------------------


def test_report_without_a_key_is_401_whatever_its_scope(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    for params in ({"scope": "a" * 257}, {"scope": "a" * 5000}, {"top": "999"}, {"scope": "team-a"}):
        assert http.get("/v1/attribution/report", params=params).status_code == 401, params
        wrong = http.get("/v1/attribution/report", params=params, headers=_bearer("wg-not-a-key"))
        assert wrong.status_code == 401, params


def test_report_with_a_key_still_refuses_a_long_scope(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    http = raw_client(gateway, env)
    for key in (env.gateway_key, KEYS["viewer"]):
        long = http.get("/v1/attribution/report", params={"scope": "team-" + "a" * 252}, headers=_bearer(key))
        assert long.status_code == 422, long.text
    ok = http.get("/v1/attribution/report", params={"scope": "team-" + "a" * 251}, headers=_bearer(KEYS["viewer"]))
    assert ok.status_code == 200, ok.text
