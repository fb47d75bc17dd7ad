"""Identity and authorisation on both listeners, and what reaches the upstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from gateway.auth import presented_key
from gateway.mockprovider import MockProviderServer
from tests.harness import (
    UPSTREAM_KEY,
    Env,
    GatewayThread,
    anthropic_client,
    build_env,
    mock_profile,
    openai_client,
    raw_client,
    raw_socket,
    read_response,
)


@pytest.fixture(scope="module")
def gw(
    mock: MockProviderServer, shared_tls: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Env, GatewayThread, dict[str, str]]]:
    profiles = [
        mock_profile("mock-openai", "openai", mock.url),
        mock_profile("mock-anthropic", "anthropic", mock.url),
        mock_profile("other-openai", "openai", mock.url),
    ]
    env = build_env(
        tmp_path_factory.mktemp("auth"),
        mock.url,
        tls_dir=shared_tls,
        profiles=profiles,
        principal_profiles=["mock-openai", "mock-anthropic"],
    )
    keys = {
        "no_proxy": env.add_principal("observer", ["observe"], []),
        "openai_only": env.add_principal("narrow", ["proxy"], ["mock-openai"]),
    }
    with GatewayThread(env.config) as gateway:
        yield env, gateway, keys


@pytest.mark.parametrize("transport", ["https", "uds"])
def test_401_in_each_dialect(gw: tuple[Env, GatewayThread, dict[str, str]], transport: str) -> None:
    env, gateway, _ = gw
    uds = transport == "uds"
    with pytest.raises(openai.AuthenticationError) as oa:
        openai_client(gateway, env, uds=uds, key="wg-not-a-real-key").chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hi"}]
        )
    assert oa.value.body["reason_codes"] == ["unauthenticated"]  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as an:
        anthropic_client(gateway, env, uds=uds, key="wg-not-a-real-key").messages.create(
            model="claude-test-model", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert an.value.body["type"] == "error"  # type: ignore[index]
    assert an.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    r = raw_client(gateway, env, uds=uds).post("/v1/chat/completions", json={"model": "gpt-4.1", "messages": []})
    assert r.status_code == 401  # no key at all


def test_403_paths(gw: tuple[Env, GatewayThread, dict[str, str]]) -> None:
    env, gateway, keys = gw
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.PermissionDeniedError) as e1:
        openai_client(gateway, env, key=keys["no_proxy"]).chat.completions.create(model="gpt-4.1", messages=msgs)
    assert e1.value.body["reason_codes"] == ["forbidden_action"]  # type: ignore[index]
    with pytest.raises(anthropic.PermissionDeniedError) as e2:
        anthropic_client(gateway, env, key=keys["openai_only"]).messages.create(
            model="claude-test-model", max_tokens=5, messages=msgs
        )
    assert e2.value.body["error"]["reason_codes"] == ["forbidden_model"]  # type: ignore[index]
    with pytest.raises(openai.PermissionDeniedError) as e3:
        openai_client(gateway, env, default_headers={"x-wiregate-profile": "other-openai"}).chat.completions.create(
            model="gpt-4.1", messages=msgs
        )
    assert e3.value.body["reason_codes"] == ["forbidden_profile"]  # type: ignore[index]
    with pytest.raises(openai.PermissionDeniedError) as e4:
        openai_client(gateway, env, default_headers={"x-wiregate-scope": "someone-elses"}).chat.completions.create(
            model="gpt-4.1", messages=msgs
        )
    assert e4.value.body["reason_codes"] == ["forbidden_action"]  # type: ignore[index]


def test_upstream_sees_profile_credential_never_gateway_key(
    gw: tuple[Env, GatewayThread, dict[str, str]], mock: MockProviderServer
) -> None:
    env, gateway, _ = gw
    since = mock.state.records()[-1].seq if mock.state.records() else 0
    openai_client(
        gateway, env, default_headers={"x-api-key": env.gateway_key, "openai-organization": "org-client"}
    ).chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "hi"}])
    anthropic_client(
        gateway, env, default_headers={"authorization": f"Bearer {env.gateway_key}", "anthropic-beta": "x-test-beta"}
    ).messages.create(model="claude-test-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    records = [r for r in mock.state.records() if r.seq > since]
    assert [r.path for r in records] == ["/v1/chat/completions", "/v1/messages"]
    oa, an = records
    assert oa.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "x-api-key" not in oa.headers and "openai-organization" not in oa.headers
    assert an.headers["x-api-key"] == UPSTREAM_KEY and "authorization" not in an.headers
    assert an.headers["anthropic-version"]  # the client's API version is forwarded as sent
    assert an.headers["anthropic-beta"] == "x-test-beta"  # on the profile's passthrough list
    for record in records:
        blob = repr(record.headers).encode() + record.body
        assert env.gateway_key.encode() not in blob


def test_either_key_header_works_on_either_route(gw: tuple[Env, GatewayThread, dict[str, str]]) -> None:
    env, gateway, _ = gw
    client = raw_client(gateway, env)
    r = client.post(
        "/v1/chat/completions",
        headers={"x-api-key": env.gateway_key},
        json={"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200
    r = client.post(
        "/v1/messages",
        headers={"authorization": f"Bearer {env.gateway_key}"},
        json={"model": "claude-test-model", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 200


def test_ops_routes_need_their_actions(gw: tuple[Env, GatewayThread, dict[str, str]]) -> None:
    env, gateway, keys = gw
    client = raw_client(gateway, env)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"authorization": f"Bearer {keys['openai_only']}"}).status_code == 403
    assert client.get("/metrics", headers={"authorization": f"Bearer {keys['no_proxy']}"}).status_code == 200
    models = client.get("/v1/models", headers={"authorization": f"Bearer {env.gateway_key}"})
    assert models.status_code == 200 and models.json()["object"] == "list"
    caps = client.get("/v1/capabilities", headers={"authorization": f"Bearer {env.gateway_key}"}).json()
    assert caps["inspection_engine"] == "hyperscan" and "chat" in caps["carriers"]


@pytest.mark.parametrize(
    "headers",
    [
        [("authorization", "Bearer KEY"), ("authorization", "Bearer wg-junk")],
        [("authorization", "Bearer wg-junk"), ("authorization", "Bearer KEY")],
        [("authorization", "Bearer KEY"), ("authorization", "Bearer KEY")],
        [("x-api-key", "KEY"), ("x-api-key", "wg-junk")],
    ],
    ids=["key-then-junk", "junk-then-key", "key-twice", "x-api-key-twice"],
)
def test_a_key_header_given_twice_is_refused(
    gw: tuple[Env, GatewayThread, dict[str, str]], headers: list[tuple[str, str]]
) -> None:
    """Which of two copies counts is where intermediaries disagree: neither does."""
    env, gateway, _ = gw
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    client = raw_client(gateway, env, uds=True)
    given = [(name, value.replace("KEY", env.gateway_key)) for name, value in headers]
    refused = client.post("/v1/chat/completions", json=body, headers=given)
    assert refused.status_code == 401, refused.text
    assert refused.json()["error"]["reason_codes"] == ["unauthenticated"]
    once = client.post("/v1/chat/completions", json=body, headers=given[:1] if "KEY" in headers[0][1] else given[1:])
    assert once.status_code == 200, once.text


@pytest.mark.parametrize("space", ["\u00a0", "\u3000", "\u2003", "\u0085"])
@pytest.mark.parametrize("header", ["authorization", "x-api-key"])
def test_a_key_is_read_through_http_whitespace_only(
    gw: tuple[Env, GatewayThread, dict[str, str]], header: str, space: str
) -> None:
    """Spaces and tabs around a key are HTTP's own; any other whitespace is part of what was
    presented, which is then not the key."""
    env, gateway, _ = gw
    value = ("Bearer " if header == "authorization" else "") + env.gateway_key
    assert presented_key({header: f" {value}\t"}) == env.gateway_key
    assert presented_key({header: value + space}) == env.gateway_key + space
    with raw_socket(gateway) as sock:
        sock.sendall(
            f"GET /v1/models HTTP/1.1\r\nHost: gw\r\n{header}: {value}{space}\r\nConnection: close\r\n\r\n".encode()
        )
        status, _, body, _ = read_response(sock)
    assert status.split()[1] == "401", (status, body[:200])
