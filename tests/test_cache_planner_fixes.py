"""Two cache-planner defects, pinned.

A client's own 5 min marker keeps every later breakpoint from 1 h; a paced 1 h candidate
after it is written for 5 min only where a 5 min write pays at the session's pace, else it
is not placed (`skipped_unprofitable`) and leaves its slot to the next candidate.

A request-level (automatic) `cache_control` puts the client's breakpoint on the last block
that can hold one; the planner puts none of its own there, whatever the candidate (a marker
of another TTL there is a 400 from the provider)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from bench import pace_policies
from gateway import caching
from gateway.admission import runes_div4
from gateway.cachepace import PaceEvent, SessionPace
from gateway.carriers import CARRIERS, jsonspan
from gateway.mockprovider import MockProviderServer
from gateway.mockprovider.prompt import anthropic_breakpoints
from gateway.profiles.model import DEFAULT_PRICES
from tests import replay
from tests.harness import (
    UPSTREAM_KEY,
    Env,
    GatewayThread,
    anthropic_client,
    direct_anthropic,
    raw_client,
)
from tests.test_caching import ANTHROPIC, CTX, LONG, _conversation
from tests.test_e2e_cache_pace import Clock, clocked_gateway

A = DEFAULT_PRICES["anthropic"]  # read 0.1, 5 min write 1.25, 1 h write 2
FIVE_MIN = {"type": "ephemeral"}
ONE_HOUR = {"type": "ephemeral", "ttl": "1h"}


def _every(gap: float, count: int, now: float = 100_000.0) -> SessionPace:
    """`count` earlier requests `gap` seconds apart, this one `gap` after the last."""
    return SessionPace(tuple(PaceEvent(now - gap * i) for i in range(count, 0, -1)), now)


SLOW = _every(400.0, 10)  # 1 h pays for both classes, 5 min for neither
ONE_SLOW_GAP = _every(400.0, 1)  # 1 h is best; 5 min still pays (tail: +0.031)


def _plan(doc: dict[str, Any], pace: SessionPace | None) -> tuple[dict[str, Any], caching.CachePlan]:
    text = json.dumps(doc)
    plan = caching.plan(CARRIERS["anthropic.messages"], text, doc, ANTHROPIC, CTX, runes_div4, pace=pace, prices=A)
    return json.loads(jsonspan.apply(text, plan.edits)), plan


# --- a client's 5 min marker at a slow pace ---------------------------------------------------


def test_paced_one_hour_candidates_after_a_client_five_minute_marker_become_five_minutes_only_if_that_pays() -> None:
    doc = _conversation(system=[{"type": "text", "text": LONG, "cache_control": FIVE_MIN}])
    _, slow = _plan(doc, SLOW)
    # The tools come before the client's marker: 1 h. The conversation comes after it: a
    # 5 min write there loses money at this pace, so none is placed.
    assert slow.breakpoints == (("tools", "1h"),)
    assert slow.evidence == ("client_markers", "ttl_1h", "skipped_unprofitable")
    _, young = _plan(doc, ONE_SLOW_GAP)
    assert young.breakpoints == (("tools", "1h"), ("last_turn", "5m"), ("tail", "5m"))
    assert "skipped_unprofitable" not in young.evidence


def test_a_dropped_candidate_leaves_its_slot_to_the_next() -> None:
    doc = _conversation()
    # Three client 5 min markers in the first user message: one slot left.
    doc["messages"][0]["content"] = [{"type": "text", "text": f"part {i}", "cache_control": FIVE_MIN} for i in range(3)]
    planned, plan = _plan(doc, SLOW)
    # The conversation's candidates come after a 5 min marker and 5 min loses: dropped,
    # and the one slot goes to the system prompt, before the client's markers, at 1 h.
    assert plan.breakpoints == (("system", "1h"),)
    assert plan.skipped == ("unprofitable", "unprofitable", "no_slots")
    anthropic_breakpoints(planned)  # valid for the provider: at most 4, 1 h before 5 min


# --- a request-level (automatic) marker -------------------------------------------------------


def _prepared_context_last(auto: dict[str, str]) -> dict[str, Any]:
    """The request's last block is the newest user message, a PowerContext prepared context
    and a question: the prepared-context candidate is the automatic marker's block."""
    context = replay._prepared_context(random.Random(1))
    return {
        "model": "claude-test-model",
        "max_tokens": 16,
        "cache_control": auto,
        "system": LONG,
        "messages": [
            {"role": "user", "content": "hi " * 200},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": context + "\n\nWhat does item 3 say?"},
        ],
    }


@pytest.mark.parametrize(
    ("auto", "pace", "expected"),
    [
        (FIVE_MIN, None, (("system", "5m"), ("last_turn", "5m"))),
        (FIVE_MIN, SLOW, (("system", "1h"), ("last_turn", "1h"))),
        (ONE_HOUR, None, ()),  # 5 min markers may not come before the client's 1 h
        (ONE_HOUR, SLOW, (("system", "1h"), ("last_turn", "1h"))),
    ],
    ids=["auto-5m", "auto-5m-slow", "auto-1h", "auto-1h-slow"],
)
def test_no_planner_marker_on_the_automatic_markers_block(
    auto: dict[str, str], pace: SessionPace | None, expected: tuple[tuple[str, str], ...]
) -> None:
    doc = _prepared_context_last(auto)
    planned, plan = _plan(doc, pace)
    assert plan.breakpoints == expected
    assert planned["messages"][-1] == doc["messages"][-1]  # the last block left to the client's marker
    anthropic_breakpoints(planned)  # no 400: no other TTL on the automatic marker's block


# --- end to end: the official SDK through the gateway to the mock, on a virtual clock ----------


@pytest.fixture(scope="module")
def clocked() -> Iterator[tuple[Env, GatewayThread, MockProviderServer, Clock]]:
    with clocked_gateway() as started:
        yield started


@pytest.mark.parametrize(("auto", "gaps"), [(ONE_HOUR, []), (FIVE_MIN, [400.0])], ids=["auto-1h", "auto-5m-slow"])
def test_a_request_level_marker_and_a_prepared_context_last_reach_the_provider(
    clocked: tuple[Env, GatewayThread, MockProviderServer, Clock], auto: dict[str, str], gaps: list[float]
) -> None:
    """1 h automatic, no history: today's 5 min candidate; 5 min automatic after a slow gap:
    the paced 1 h candidate. Either on the last block was the provider's 400."""
    env, gw, mock, clock = clocked
    client = anthropic_client(gw, env, uds=True)
    body = _prepared_context_last(auto)
    for turn in range(len(gaps) + 1):
        clock.t += gaps[turn - 1] if turn else 0.0
        reply = client.messages.create(**body, extra_headers={"x-wiregate-session": f"auto-{auto.get('ttl', '5m')}"})
        assert reply.usage.cache_creation_input_tokens + reply.usage.cache_read_input_tokens > 0
    sent = mock.state.records()[-1].json
    assert sent["messages"][-1] == body["messages"][-1] and sent["cache_control"] == auto


def _slow_session(client: Any, clock: Clock, turns: int) -> tuple[list[float], list[str]]:
    """A replayed session, 400 s between turns, whose client marks its system prompt 5 min:
    each turn's billed input and request id."""
    session = replay.build_session(turns, seed=5)
    billed, ids = [], []
    for turn in range(turns):
        clock.t += 400.0 if turn else 0.0
        body = replay.anthropic_request(session, turn)
        body["system"] = [{"type": "text", "text": body["system"], "cache_control": FIVE_MIN}]
        raw = client.messages.with_raw_response.create(**body, extra_headers={"x-wiregate-session": "slow-5m"})
        billed.append(pace_policies.billed(raw.parse().usage.model_dump()))  # base-rate input tokens
        ids.append(raw.headers.get("x-powercontext-request-id", ""))
    return billed, ids


def test_a_slow_session_with_a_client_five_minute_marker_bills_as_direct_once_paced(
    clocked: tuple[Env, GatewayThread, MockProviderServer, Clock],
) -> None:
    env, gw, _, clock = clocked
    via, ids = _slow_session(anthropic_client(gw, env, uds=True), clock, 10)
    with MockProviderServer(api_key=UPSTREAM_KEY) as mock:
        mock.state.clock = own = Clock()
        direct, _ = _slow_session(direct_anthropic(mock.url), own, 10)
    report = raw_client(gw, env).get("/v1/usage/report", headers={"authorization": f"Bearer {env.gateway_key}"})
    plans = {r["request_id"]: r["cache_plan"] for r in report.json()["recent"]}
    # Turn 1 plans without history (fixed TTLs) and turn 2 from one gap, where a 5 min write
    # still rates as paying; from turn 3 on it loses, so the gateway writes nothing the
    # client did not ask for and bills exactly what sending direct bills.
    assert via[2:] == direct[2:]
    assert [plans[i] for i in ids[2:]] == [["client_markers", "skipped_unprofitable"]] * 8
    assert sum(via) <= 1.01 * sum(direct)  # the two early turns' writes: 108.9 % before the fix


# --- client markers nested where a block holds an object, not a block list ---------------------


def _all_markers(doc: dict[str, Any]) -> list[str]:
    """Every `cache_control` TTL in the prompt, in prompt order, at any depth."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "cache_control" and isinstance(inner, dict):
                    found.append(str(inner.get("ttl", "5m")))
                else:
                    walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    for key in ("tools", "system", "messages"):
        walk(doc.get(key))
    return found


NESTED = {
    "a web fetch result's document": {
        "type": "web_fetch_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {
            "type": "web_fetch_result",
            "url": "https://example.com/",
            "content": {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": LONG},
                "cache_control": FIVE_MIN,
            },
        },
    },
    "a tool search result's reference": {
        "type": "tool_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {
            "type": "tool_search_tool_search_result",
            "tool_references": [{"type": "tool_reference", "tool_name": "t", "cache_control": FIVE_MIN}],
        },
    },
    "a tool added mid-conversation": {
        "type": "tool_addition",
        "tool": {"name": "late", "description": "d", "input_schema": {"type": "object"}, "cache_control": FIVE_MIN},
    },
}


@pytest.mark.parametrize("where", sorted(NESTED))
def test_a_client_marker_nested_in_an_object_counts(where: str) -> None:
    """A client's 5 min marker inside a block's object member (not a block list) counts
    toward the four and keeps every later breakpoint from 1 h: the body never carries five
    breakpoints or a 1 h one after a 5 min one (each a 400 from the provider). (The planner
    once read only block lists and `source.content`.)"""
    doc = {
        "model": "claude-x",
        "max_tokens": 10,
        "system": LONG,
        "tools": [{"name": "t", "description": LONG, "input_schema": {"type": "object"}}],
        "messages": [
            {"role": "user", "content": "q1 " + LONG},
            {
                "role": "assistant",
                "content": [{"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_fetch", "input": {}}]
                + [NESTED[where]],
            },
            {"role": "user", "content": "q2 " + LONG},
        ],
    }
    after, plan = _plan(doc, SLOW)
    ttls = _all_markers(after)
    assert len(ttls) <= 4 and "5m" in ttls, ttls
    assert "1h" not in ttls[ttls.index("5m") :], ttls
    assert "client_markers" in plan.evidence
    assert plan.breakpoints  # it still plans around the client's marker
