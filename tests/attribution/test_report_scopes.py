"""Who sees which scope's attribution, and whose sessions carry into whose: a principal
that observes one scope never reads another's figures by leaving the scope out (the API or
the UI), only a principal that reaches every scope gets the view across scopes; and two
agents in different scopes that both name their session "main" never share carried
blocks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, openai_client, raw_client

KEYS: dict[str, str] = {}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_file", "description": "Read one file. " * 10, "parameters": {"type": "object"}},
    }
]


def _principals(env: Env) -> None:
    KEYS["viewer-a"] = env.add_principal("viewer-a", ["observe"], [], ["team-a"])
    KEYS["agent-a"] = env.add_principal("agent-a", ["proxy"], ["mock-openai"], ["team-a"])
    KEYS["agent-b"] = env.add_principal("agent-b", ["proxy"], ["mock-openai"], ["team-b"])
    KEYS["operator"] = env.add_principal("operator", ["observe"], [], ["*"])


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("attribution-scopes", prepare=_principals) as (env, gateway):
        http = raw_client(gateway, env)
        switched = http.post(
            "/v1/attribution/collection",
            json={"collecting": True},
            headers={"authorization": f"Bearer {env.gateway_key}"},
        )
        assert switched.status_code == 200
        session = {"x-wiregate-session": "main"}
        openai_client(gateway, env, key=KEYS["agent-a"]).chat.completions.create(
            model="gpt-4.1", tools=TOOLS, messages=[{"role": "user", "content": "hello from a"}], extra_headers=session
        )
        for n in range(3):
            openai_client(gateway, env, key=KEYS["agent-b"]).chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": f"hello from b {n}"}], extra_headers=session
            )
        yield env, gateway


def _report(gw: tuple[Env, GatewayThread], key: str, **params: str) -> tuple[int, Any]:
    env, gateway = gw
    headers = {"authorization": f"Bearer {KEYS[key]}"}
    if "header" in params:
        headers["x-wiregate-scope"] = params.pop("header")
    answer = raw_client(gateway, env).get("/v1/attribution/report", params=params or None, headers=headers)
    return answer.status_code, answer.json()


def test_a_scoped_observer_never_reads_another_scope(gw: tuple[Env, GatewayThread]) -> None:
    assert _report(gw, "viewer-a", scope="team-b")[0] == 403
    assert _report(gw, "viewer-a", header="team-b")[0] == 403
    status, own = _report(gw, "viewer-a")  # no scope: its own default scope, not every scope
    assert status == 200 and own["scope"] == "selected" and own["boundaries"] == 1
    status, named = _report(gw, "viewer-a", scope="team-a")
    assert status == 200 and named["boundaries"] == 1
    status, everything = _report(gw, "operator")
    assert status == 200 and everything["scope"] == "all" and everything["boundaries"] == 4


def test_the_ui_shows_a_scoped_observer_only_its_scope(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    for key, boundaries in (("viewer-a", 1), ("operator", 4)):
        http = raw_client(gateway, env)
        assert http.post("/ui/login", json={"key": KEYS[key]}).status_code == 200
        shown = http.get("/ui/api/attribution")
        assert shown.status_code == 200 and shown.json()["boundaries"] == boundaries, key
        assert http.get("/ui/api/attribution", params={"scope": "team-b"}).status_code == (
            403 if key == "viewer-a" else 200
        )


def test_sessions_of_the_same_name_in_two_scopes_carry_nothing_into_each_other(gw: tuple[Env, GatewayThread]) -> None:
    """Agent B's calls never held agent A's tool schemas: across scopes, the schemas were
    exposed once (A's one call), exactly what was materialised."""
    _, everything = _report(gw, "operator")
    tools = next(r for r in everything["ledger"] if r["blockId"] == "prompt.tool_schemas")
    assert everything["exposure"]["status"] == "supported"
    assert tools["cumulativeExposureEstimate"] == tools["cumulativeMaterializedEstimate"] > 0
    assert tools["activeInvocations"] == 1


def test_a_scope_longer_than_any_scope_is_refused_in_the_query_and_in_the_header(
    gw: tuple[Env, GatewayThread],
) -> None:
    assert _report(gw, "operator", scope="x" * 257)[0] == 422
    assert _report(gw, "operator", header="x" * 257)[0] == 422
    status, body = _report(gw, "operator", header="x" * 256)  # the longest a scope can be: an empty report
    assert status == 200 and body["scope"] == "selected"
