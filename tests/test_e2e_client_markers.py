"""The client's own cache markers, end to end: the official anthropic SDK through the real
gateway to the mock, which refuses what Anthropic refuses (more than four `cache_control`
blocks counting nested ones, a 1 h marker after a 5 min one, `cache_control` on a
`defer_loading` tool). Whatever the client marked — null included, on blocks nested in a
tool result — the gateway's own markers never turn a valid request into a refused one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, direct_anthropic
from tests.test_caching import every_marker, no_duplicate_keys

LONG = "Policy sentence that is long enough to matter. " * 200


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("client-markers") as pair:
        yield pair


def _conversation(result_content: Any) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [{"type": "text", "text": LONG}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result_content}]},
        {"role": "assistant", "content": [{"type": "text", "text": "noted"}]},
        {"role": "user", "content": [{"type": "text", "text": "and next? " * 40}]},
    ]


def _nested(count: int, ttl: str | None = None) -> list[dict[str, Any]]:
    marker = {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}
    return [{"type": "text", "text": f"result part {i} " * 40, "cache_control": marker} for i in range(count)]


TOOLS = [
    {"name": "lookup", "description": "Look things up. " * 400, "input_schema": {"type": "object"}},
    {"name": "later", "description": "Loaded on demand", "input_schema": {"type": "object"}, "defer_loading": True},
]


def _sent(mock: MockProviderServer, before: int) -> dict[str, Any]:
    records = mock.state.records()[before:]
    assert len(records) == 1
    no_duplicate_keys(records[0].body.decode())  # the gateway added no second member
    doc: dict[str, Any] = json.loads(records[0].body)
    return doc


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("four nested markers", {"messages": _conversation(_nested(4))}),
        ("a nested 1h marker", {"messages": _conversation(_nested(1, "1h"))}),
        ("a deferred tool", {"messages": _conversation("result " * 40), "tools": TOOLS}),
    ],
)
def test_the_mock_refuses_what_anthropic_refuses(mock: MockProviderServer, name: str, kwargs: dict[str, Any]) -> None:
    """Sent direct with the markers the gateway used to add, each of these is a 400."""
    body = json.loads(json.dumps(kwargs))
    if name == "four nested markers":
        body["messages"][4]["content"][0]["cache_control"] = {"type": "ephemeral"}
    elif name == "a nested 1h marker":
        body["messages"][4]["content"][0]["cache_control"] = {"type": "ephemeral"}
        body["messages"][0]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
        body["messages"][1]["content"][0]["cache_control"] = {"type": "ephemeral"}  # 5m, then the nested 1h
    else:
        body["tools"][1]["cache_control"] = {"type": "ephemeral"}
    with pytest.raises(anthropic.BadRequestError):
        direct_anthropic(mock.url).messages.create(model="claude-test", max_tokens=16, **body)


def test_a_null_marker_is_kept_and_the_call_goes_through(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    reply = anthropic_client(gateway, env).messages.create(
        model="claude-test",
        max_tokens=16,
        system=[{"type": "text", "text": LONG, "cache_control": None}],  # type: ignore[typeddict-item]
        messages=[{"role": "user", "content": "hello " * 40}],
    )
    assert reply.content
    sent = _sent(mock, before)
    assert "cache_control" in sent["system"][0] and sent["system"][0]["cache_control"] is None


@pytest.mark.parametrize("count", [1, 4])
def test_nested_client_markers_count_towards_four(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, count: int
) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    reply = anthropic_client(gateway, env, uds=True).messages.create(
        model="claude-test", max_tokens=16, system=LONG, messages=_conversation(_nested(count))
    )
    assert reply.content
    assert len(every_marker(_sent(mock, before))) == 4  # the gateway filled the slots the client left, no more


def test_nested_one_hour_marker_keeps_the_ttl_order(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    reply = anthropic_client(gateway, env).messages.create(
        model="claude-test", max_tokens=16, system=LONG, messages=_conversation(_nested(1, "1h"))
    )
    assert reply.content
    ttls = every_marker(_sent(mock, before))
    assert "1h" in ttls and ttls == sorted(ttls, key=lambda t: t != "1h")


def test_no_marker_on_a_deferred_tool(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    reply = anthropic_client(gateway, env).messages.create(
        model="claude-test",
        max_tokens=16,
        system=LONG,
        tools=TOOLS,  # type: ignore[arg-type]
        messages=_conversation("result " * 40),
    )
    assert reply.content
    sent = _sent(mock, before)
    assert "cache_control" not in sent["tools"][1] and "cache_control" in sent["tools"][0]
