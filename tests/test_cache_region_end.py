"""The end of tools and the end of system, when the client (or wiregate's own earlier plan)
already marked it: that end is already a breakpoint, so the planner adds nothing inside the
region, and a planned body plans to itself (SPEC §8) even when slots are left free."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import caching
from gateway.admission import runes_div4
from gateway.cachepace import PaceChoice
from gateway.carriers import CARRIERS, jsonspan
from gateway.mockprovider import MockProviderServer
from gateway.profiles.model import CacheSettings
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client
from tests.test_caching import every_marker, no_duplicate_keys

ANTHROPIC = CacheSettings(mode="anthropic-cache-control", max_breakpoints=4, min_prefix_tokens=100, ttl="5m")
CTX = caching.CacheContext("alice", "team-a", "prof-1")
CARRIER = CARRIERS["anthropic.messages"]
LONG = "Policy sentence that is long enough to matter. " * 40  # ~470 tokens
FIVE_MIN = {"type": "ephemeral"}
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}


def _request(*, tools: bool = True, system: bool = False) -> dict[str, Any]:
    """One user question: no stable turn yet, so tools, system and the tail leave a slot free."""
    doc: dict[str, Any] = {
        "model": "claude-test-model",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "question: " + "words " * 30}],
    }
    if tools:
        doc["tools"] = [
            {"name": "lookup", "description": LONG, "input_schema": {"type": "object"}},
            {"name": "other", "description": "Another tool", "input_schema": {"type": "object"}},
        ]
    if system:
        doc["system"] = [{"type": "text", "text": LONG}, {"type": "text", "text": "Be brief."}]
    return doc


def _plan(text: str, profile: CacheSettings = ANTHROPIC) -> tuple[str, caching.CachePlan]:
    plan = caching.plan(CARRIER, text, json.loads(text), profile, CTX, runes_div4)
    return jsonspan.apply(text, plan.edits), plan


def _marked(blocks: list[dict[str, Any]]) -> list[int]:
    return [i for i, block in enumerate(blocks) if isinstance(block.get("cache_control"), dict)]


@pytest.mark.parametrize(
    ("tools", "system", "names"),
    [
        (True, False, ["tools", "tail"]),
        (False, True, ["system", "tail"]),
        (True, True, ["tools", "system", "tail"]),
    ],
)
def test_a_planned_body_plans_to_itself_with_a_free_slot(tools: bool, system: bool, names: list[str]) -> None:
    text = json.dumps(_request(tools=tools, system=system), indent=1)
    once, first = _plan(text)
    assert [name for name, _ in first.breakpoints] == names  # fewer than four: a slot is left
    twice, second = _plan(once)
    assert second.edits == () and twice == once  # SPEC §8: planning twice yields identical bytes
    after = json.loads(once)
    if tools:
        assert _marked(after["tools"]) == [1]  # the end of tools, nothing before it
    if system:
        assert _marked(after["system"]) == [1]


@pytest.mark.parametrize("marker", [FIVE_MIN, ONE_HOUR])
def test_a_client_marker_on_the_last_tool_is_the_end_of_tools(marker: dict[str, str]) -> None:
    doc = _request()
    doc["tools"][1]["cache_control"] = marker
    text = json.dumps(doc)
    planned, plan = _plan(text)
    after = json.loads(planned)
    assert _marked(after["tools"]) == [1] and after["tools"][1]["cache_control"] == marker  # the client's, untouched
    assert [name for name, _ in plan.breakpoints] == ["tail"]  # no second breakpoint inside the tool list
    assert "client_markers" in plan.evidence
    assert _plan(planned)[1].edits == ()


def test_a_client_marker_before_a_deferred_tool_is_the_end_of_tools() -> None:
    doc = _request()
    doc["tools"][1]["cache_control"] = FIVE_MIN
    doc["tools"].append(
        {"name": "later", "description": "d", "input_schema": {"type": "object"}, "defer_loading": True}
    )
    planned, plan = _plan(json.dumps(doc))
    after = json.loads(planned)
    assert _marked(after["tools"]) == [1] and "cache_control" not in after["tools"][2]
    assert [name for name, _ in plan.breakpoints] == ["tail"]


@pytest.mark.parametrize("marker", [FIVE_MIN, ONE_HOUR])
def test_a_client_marker_on_the_last_system_block_is_the_end_of_system(marker: dict[str, str]) -> None:
    doc = _request(tools=False, system=True)
    doc["system"][1]["cache_control"] = marker
    text = json.dumps(doc)
    planned, plan = _plan(text)
    after = json.loads(planned)
    assert _marked(after["system"]) == [1] and after["system"][1]["cache_control"] == marker
    assert [name for name, _ in plan.breakpoints] == ["tail"]  # no second breakpoint inside the system prompt
    assert _plan(planned)[1].edits == ()


@pytest.mark.parametrize("marker", [FIVE_MIN, ONE_HOUR])
def test_both_ends_marked_by_the_client_take_no_slot_of_ours(marker: dict[str, str]) -> None:
    doc = _request(system=True)
    doc["tools"][1]["cache_control"] = marker
    doc["system"][1]["cache_control"] = marker
    planned, plan = _plan(json.dumps(doc))
    after = json.loads(planned)
    assert _marked(after["tools"]) == [1] and _marked(after["system"]) == [1]
    assert plan.breakpoints == (("tail", "5m"),)  # the one free slot stays free
    assert len(every_marker(after)) == 3 and _plan(planned)[1].edits == ()


# End to end: the official SDK through the gateway to the mock provider.

LONG_E2E = "Policy sentence that is long enough to matter. " * 200


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("cache-region-end") as pair:
        yield pair


def test_client_marked_region_ends_get_no_second_marker_end_to_end(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer
) -> None:
    env, gateway = gw
    before = len(mock.state.records())
    reply = anthropic_client(gateway, env).messages.create(
        model="claude-test",
        max_tokens=16,
        system=[
            {"type": "text", "text": LONG_E2E},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        tools=[
            {"name": "lookup", "description": LONG_E2E, "input_schema": {"type": "object"}},
            {"name": "other", "description": "d", "input_schema": {"type": "object"}, "cache_control": FIVE_MIN},
        ],
        messages=[{"role": "user", "content": "hello " * 40}],
    )
    assert reply.content
    records = mock.state.records()[before:]
    assert len(records) == 1
    no_duplicate_keys(records[0].body.decode())
    sent = json.loads(records[0].body)
    assert _marked(sent["tools"]) == [1] and _marked(sent["system"]) == [1]
    assert len(every_marker(sent)) == 3  # the client's two and the tail: nothing inside tools or system


# Property: a planned body plans to itself, whatever the client marked.

_MARKERS = st.sampled_from(["absent", "absent", "absent", None, FIVE_MIN, ONE_HOUR])
_WORDS = st.integers(min_value=0, max_value=300).map(lambda n: "word " * n)


@st.composite
def _block(draw: st.DrawFn, kind: str = "text") -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": draw(_WORDS) or "x"}
    if kind == "tool":
        block = {"name": f"t{draw(st.integers(0, 99))}", "description": block["text"], "input_schema": {}}
        if draw(st.booleans()) and draw(st.booleans()):
            block["defer_loading"] = True
    marker = draw(_MARKERS)
    if marker != "absent" and not block.get("defer_loading"):
        block["cache_control"] = marker
    return block


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": "m", "max_tokens": 10}
    if draw(st.booleans()):
        doc["tools"] = draw(st.lists(_block("tool"), min_size=1, max_size=4))
    system = draw(st.sampled_from(["none", "string", "blocks"]))
    if system == "string":
        doc["system"] = draw(_WORDS) or "x"
    elif system == "blocks":
        doc["system"] = draw(st.lists(_block(), min_size=1, max_size=3))
    messages = []
    for m in range(draw(st.integers(min_value=0, max_value=2)) * 2 + 1):
        role = "user" if m % 2 == 0 else "assistant"
        if draw(st.booleans()):
            messages.append({"role": role, "content": draw(_WORDS) or "q"})
        else:
            messages.append({"role": role, "content": draw(st.lists(_block(), min_size=1, max_size=3))})
    doc["messages"] = messages
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc=_requests(),
    indent=st.sampled_from([None, 1]),
    min_prefix=st.sampled_from([0, 50, 300]),
    ttl=st.sampled_from(["5m", "1h"]),
    stable_ttl=st.sampled_from([None, "5m", "1h"]),
    choice=st.sampled_from([None, PaceChoice("1h", "5m"), PaceChoice("5m", "5m"), PaceChoice("1h", None)]),
)
def test_planning_twice_yields_identical_bytes(
    doc: dict[str, Any],
    indent: int | None,
    min_prefix: int,
    ttl: str,
    stable_ttl: str | None,
    choice: PaceChoice | None,
) -> None:
    profile = CacheSettings(
        mode="anthropic-cache-control", max_breakpoints=4, min_prefix_tokens=min_prefix, ttl=ttl, stable_ttl=stable_ttl
    )
    text = json.dumps(doc, indent=indent)
    first = caching.plan_markers(CARRIER, text, CARRIER.prompt_layout(json.loads(text)), profile, runes_div4, choice)
    once = jsonspan.apply(text, first.edits)
    second = caching.plan_markers(CARRIER, once, CARRIER.prompt_layout(json.loads(once)), profile, runes_div4, choice)
    assert second.edits == () and jsonspan.apply(once, second.edits) == once
    clients = len(every_marker(doc))
    assert len(every_marker(json.loads(once))) <= max(4, clients)
