"""Exposure is `supported` only with evidence (SPEC §11; the attribution seed: when lifetime or
invocation coverage is incomplete, exposure is `limited`, never approximated).

* A continuation names its parent (a keyed digest of `previous_response_id`, made as the
  parent's invocation identity is, or of its `conversation`); it is complete only when that
  parent is its session's last correlated call. A regenerate or branch from an older
  response is `limited` and never counted against blocks the provider did not hold for it.
* Material of unknown lifetime (unattributed blocks, unregistered host labels, Responses
  items such as `mcp_list_tools`) is never carried, so a continuation in a session that holds
  it is incomplete, until a full-context request without it.
* Records a process dropped from its queue make exposure `limited`, not only the report.
* With `since`, a sighting before the window decides nothing about what the window counts.
* Records stored before parents were recorded still load (their parent is unknown).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from gateway.attribution import blocks, registry
from gateway.attribution.blocks import Block
from gateway.attribution.ledger import Aggregator, Record, aggregate
from gateway.ledgers.attribution import decode
from gateway.state import ATTRIBUTION
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, openai_client, raw_client

REG = registry.build()
SYS, TOOLS, PREP = "prompt.system_instructions", "prompt.tool_schemas", "wiregate.prepared_context"
CUR, HUSER = "prompt.current_user_turn", "prompt.history.user_turn"
UNATTRIBUTED = "unattributed.prompt_surface"


def b(block_id: str, instance: str, estimate: int) -> Block:
    return Block(block_id, instance, estimate)


def row(report: dict[str, Any], block_id: str) -> dict[str, Any]:
    return next(r for r in report["ledger"] if r["blockId"] == block_id)


def full(ts: float, blocks_: tuple[Block, ...], invocation: str, session: str = "h:s") -> Record:
    return Record(ts, blocks_, invocation=invocation, session=session)


def cont(
    ts: float, blocks_: tuple[Block, ...], invocation: str, parent: str | None = None, conversation: str | None = None
) -> Record:
    """A continuation of server-side state naming what it continues (naming nothing: the
    session's last call, as a record built by hand reads)."""
    names = {k: v for k, v in (("parent", parent), ("conversation", conversation)) if v is not None}
    return Record(ts, blocks_, invocation=invocation, session="h:s", full_context=False, **names)  # type: ignore[arg-type]


# --- 1. a continuation is complete only when its parent is the session's last call ----------


def test_a_branch_from_an_older_response_is_limited_and_never_exposed_to_the_newer_state() -> None:
    r1 = full(1.0, (b(SYS, "S", 100), b(PREP, "P1", 300), b(CUR, "U1", 10)), "h:r1")
    r2 = cont(2.0, (b(PREP, "P2", 900), b(CUR, "U2", 10)), "h:r2", parent="h:r1")
    # r3 regenerates from r1: the provider holds S, P1, U1 for it, never P2 or U2.
    r3 = cont(3.0, (b(CUR, "U3", 10),), "h:r3", parent="h:r1")
    report = aggregate([r1, r2, r3], REG)
    assert report["exposure"] == {"status": "limited", "correlatedInvocations": 3, "incompleteInvocations": 1}
    # r3 counts what it holds itself: never P2 (the wrong state), and P1 is not claimed either.
    assert row(report, PREP)["cumulativeExposureEstimate"] == 300 + 900
    assert row(report, PREP)["activeInvocations"] == 2
    assert row(report, SYS)["cumulativeExposureEstimate"] == 100 + 100
    assert row(report, CUR)["cumulativeExposureEstimate"] == 10 + (10 + 10) + 10
    # A continuation of the branch: its parent is the session's last call, but the chain is
    # no longer whole (r3's state was not seen): incomplete, exposed to what r3 brought only.
    r4 = cont(4.0, (b(CUR, "U4", 10),), "h:r4", parent="h:r3")
    after = aggregate([r1, r2, r3, r4], REG)
    assert after["exposure"]["incompleteInvocations"] == 2
    assert row(after, CUR)["cumulativeExposureEstimate"] == 10 + (10 + 10) + 10 + (10 + 10)
    assert row(after, PREP)["cumulativeExposureEstimate"] == 300 + 900
    # A full-context request starts a whole chain again.
    r5 = full(5.0, (b(SYS, "S", 100), b(CUR, "U5", 10)), "h:r5")
    r6 = cont(6.0, (b(CUR, "U6", 10),), "h:r6", parent="h:r5")
    again = aggregate([r1, r2, r3, r4, r5, r6], REG)
    assert again["exposure"]["incompleteInvocations"] == 2 and again["exposure"]["correlatedInvocations"] == 6


def test_a_linear_chain_of_named_parents_is_supported() -> None:
    records = [
        full(1.0, (b(SYS, "S", 100), b(PREP, "P1", 300), b(CUR, "U1", 10)), "h:r1"),
        cont(2.0, (b(PREP, "P2", 900), b(CUR, "U2", 10)), "h:r2", parent="h:r1"),
        cont(3.0, (b(CUR, "U3", 10),), "h:r3", parent="h:r2"),
        cont(3.5, (b(CUR, "U3", 10),), "h:r3", parent="h:r2"),  # a replay of the last call
    ]
    report = aggregate(records, REG)
    assert report["exposure"] == {"status": "supported", "correlatedInvocations": 3, "incompleteInvocations": 0}
    assert report["replaysDeduplicated"] == 1
    assert row(report, PREP)["cumulativeExposureEstimate"] == 300 + 900 + 900
    # A parent never recorded (collection was off for it) is not the session's last call.
    stray = cont(4.0, (b(CUR, "U4", 10),), "h:r4", parent="h:elsewhere")
    assert aggregate([*records, stray], REG)["exposure"]["incompleteInvocations"] == 1
    # ... and neither is a parent that is there but unreadable.
    odd = cont(4.0, (b(CUR, "U4", 10),), "h:r4", parent=blocks.UNKNOWN_PARENT)
    assert aggregate([*records, odd], REG)["exposure"]["incompleteInvocations"] == 1


def test_a_conversation_continuation_is_limited_and_carries_only_its_conversation() -> None:
    """The provider holds a conversation's opening items, which no record shows: a call in a
    conversation is never complete; the next call in it is exposed to what the first brought."""
    records = [
        full(1.0, (b(SYS, "S", 100), b(CUR, "U1", 10)), "h:r1"),
        cont(2.0, (b(CUR, "U2", 10),), "h:c1", conversation="h:conv"),
        cont(3.0, (b(CUR, "U3", 10),), "h:c2", conversation="h:conv"),
    ]
    report = aggregate(records, REG)
    assert report["exposure"] == {"status": "limited", "correlatedInvocations": 3, "incompleteInvocations": 2}
    assert row(report, SYS)["cumulativeExposureEstimate"] == 100  # r1's state is not the conversation's
    assert row(report, CUR)["cumulativeExposureEstimate"] == 10 + 10 + (10 + 10)
    other = cont(4.0, (b(CUR, "U4", 10),), "h:c3", conversation="h:another")
    assert row(aggregate([*records, other], REG), CUR)["cumulativeExposureEstimate"] == 10 + 10 + 20 + 10


# --- 2. unknown lifetime ---------------------------------------------------------------------


def test_unknown_lifetime_material_makes_continuations_incomplete_until_a_full_context_request_drops_it() -> None:
    reg = registry.build(
        [
            {
                "id": "host.scratch",
                "display_name": "Scratch",
                "type": "reference",
                "origin": "host_generated",
                "control": "assembly",
                "lifetime": "unknown",
                "action": "shorten",
                "validation": "evals",
            }
        ]
    )
    for opaque in (UNATTRIBUTED, "host.unregistered_label", "host.scratch"):
        # Each continuation continues the session's last call (named or not: the same here).
        records = [
            full(1.0, (b(SYS, "S", 100), b(opaque, "X", 500), b(CUR, "U1", 10)), "h:r1"),
            cont(2.0, (b(CUR, "U2", 10),), "h:r2"),
            cont(3.0, (b(CUR, "U3", 10),), "h:r3"),
            full(4.0, (b(SYS, "S", 100), b(HUSER, "U1", 10), b(CUR, "U4", 10)), "h:r4"),  # no such material
            cont(5.0, (b(CUR, "U5", 10),), "h:r5"),
        ]
        report = aggregate(records, reg)
        assert report["exposure"] == {"status": "limited", "correlatedInvocations": 5, "incompleteInvocations": 2}
        spec_id = reg.resolve(opaque).id
        assert row(report, spec_id)["cumulativeExposureEstimate"] == 500  # never carried: not approximated
        assert row(report, spec_id)["activeInvocations"] == 1
        assert row(report, SYS)["cumulativeExposureEstimate"] == 500  # the known-lifetime part still carries
    # Material of unknown lifetime a continuation brings makes the next one incomplete too.
    brought = [
        full(1.0, (b(SYS, "S", 100), b(CUR, "U1", 10)), "h:r1"),
        cont(2.0, (b(UNATTRIBUTED, "mcp", 40), b(CUR, "U2", 10)), "h:r2"),
        cont(3.0, (b(CUR, "U3", 10),), "h:r3"),
    ]
    assert aggregate(brought, REG)["exposure"]["incompleteInvocations"] == 1
    named = [
        brought[0],
        cont(2.0, brought[1].blocks, "h:r2", parent="h:r1"),
        cont(3.0, brought[2].blocks, "h:r3", parent="h:r2"),
    ]
    assert aggregate(named, REG)["exposure"] == aggregate(brought, REG)["exposure"]


# --- 3. dropped records ----------------------------------------------------------------------


def test_dropped_records_make_exposure_limited_with_the_reason() -> None:
    agg = Aggregator(REG)
    agg.add(full(1.0, (b(SYS, "S", 100),), "h:r1"))
    report = agg.report(dropped=True)
    assert report["limited"] is True and report["limitReasons"] == ["records_dropped"]
    assert report["exposure"]["status"] == "limited"
    assert agg.report()["exposure"]["status"] == "supported"
    empty = Aggregator(REG).report(dropped=True)
    assert empty["exposure"]["status"] == "unsupported"  # no evidence at all stays unsupported


# --- 4. the window ---------------------------------------------------------------------------


def test_a_sighting_before_the_window_decides_nothing_in_it() -> None:
    records = [
        Record(1.0, (b(SYS, "A", 100), b(TOOLS, "T", 50)), invocation="h:i1"),  # before the window
        Record(11.0, (b(SYS, "A", 100),), invocation="h:i1"),  # its first sighting in the window
        Record(12.0, (b(SYS, "A", 100), b(TOOLS, "T", 50)), invocation="h:i1"),  # a replay adding T
    ]
    windowed = aggregate(records, REG, since=10.0)
    alone = aggregate(records[1:], REG, since=10.0)
    assert windowed == alone
    assert windowed["boundaries"] == 1 and windowed["replaysDeduplicated"] == 1
    tools = row(windowed, TOOLS)
    assert tools["cumulativeMaterializedEstimate"] == 50 and tools["injectionCount"] == 1
    assert tools["cumulativeExposureEstimate"] == 50


# --- storage ---------------------------------------------------------------------------------


def _stored(record: Record) -> Record:
    return decode((record.ts, record.invocation, record.session, record.profile, record.as_text()))


def test_records_round_trip_with_their_parent_and_old_records_still_load() -> None:
    new = cont(2.0, (b(CUR, "x3b:00000000000000aa", 4),), "h:r2", parent="h:r1")
    assert _stored(new) == new
    in_conversation = cont(2.0, (b(CUR, "x3b:00000000000000aa", 4),), "h:r2", conversation="h:c")
    assert _stored(in_conversation) == in_conversation
    launch = full(1.0, (b(SYS, "x3b:00000000000000bb", 100),), "h:r1")
    assert set(launch.as_json()) == {"b", "f", "u", "t"}  # a full-context record is stored as before
    assert _stored(launch) == launch
    # A continuation stored before parents were recorded: it loads, its parent unknown.
    old = {"b": [[CUR, "x3b:00000000000000aa", 4]], "f": False, "u": {}, "t": False}
    loaded = decode((2.0, "h:r2", "h:s", "p", json.dumps(old)))
    assert not loaded.full_context and loaded.parent == blocks.UNKNOWN_PARENT and loaded.conversation is None
    report = aggregate([launch, loaded], REG)
    assert report["exposure"] == {"status": "limited", "correlatedInvocations": 2, "incompleteInvocations": 1}
    assert row(report, SYS)["cumulativeExposureEstimate"] == 100  # not claimed for an unknown parent


def test_the_continued_state_is_named_by_keyed_digests_only() -> None:
    def response(value: str) -> str:
        return "h:r(" + str(len(value)) + ")"

    def conversation(value: str) -> str:
        return "h:c(" + str(len(value)) + ")"

    named = blocks.continued_state
    assert named({"previous_response_id": "resp_12"}, response, conversation) == ("h:r(7)", None)
    assert named({"conversation": "conv_1"}, response, conversation) == (None, "h:c(6)")
    assert named({"conversation": {"id": "conv_12"}}, response, conversation) == (None, "h:c(7)")
    unknown = blocks.UNKNOWN_PARENT
    assert named({"previous_response_id": 7}, response, conversation) == (unknown, None)
    assert named({"conversation": {"id": ""}}, response, conversation) == (None, unknown)
    assert named({"input": "x"}, response, conversation) == (None, None)


# --- end to end: the official openai SDK through the gateway and the bundled mock -------------


def est(text: str) -> int:
    return math.ceil(len(text) / 4)


def _api(env: Env, gateway: GatewayThread, method: str, path: str, body: Any = None) -> Any:
    response = raw_client(gateway, env).request(
        method, path, json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert response.status_code == 200, response.text
    return response.json()


def _stored_records(gateway: GatewayThread) -> list[Record]:
    assert gateway.running is not None
    ledger = gateway.running.app[ATTRIBUTION]

    async def read() -> list[Record]:
        now = time.time() + 1
        records, _ = await ledger.records(None, now, now=now)
        return records

    return gateway.call(read())


def _collecting(env: Env, gateway: GatewayThread) -> Any:
    """Collection switched on; the official client for the calls it records."""
    _api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
    return openai_client(gateway, env)


def _prepared(fact: str, n: int) -> str:
    return f"{blocks.BEGIN_MARKER}\n" + (fact + " ") * n + f"\n{blocks.END_MARKER}"


def test_e2e_a_responses_branch_from_an_older_response_is_limited(gateways: GatewayFactory) -> None:
    with gateways("exposure-branch") as (env, gateway):
        client = _collecting(env, gateway)
        headers = {"x-wiregate-session": "branching"}
        tag = uuid.uuid4().hex[:8]
        p1, p2 = _prepared(f"old fact {tag}.", 40), _prepared(f"new fact {tag}.", 400)
        r1 = client.responses.create(model="gpt-4.1", input=p1 + "\nB1?", extra_headers=headers)
        r2 = client.responses.create(
            model="gpt-4.1", input=p2 + "\nB2?", previous_response_id=r1.id, extra_headers=headers
        )
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"]["status"] == "supported"  # a linear chain: r2 continues the last call
        r3 = client.responses.create(
            model="gpt-4.1", input=f"B3 {tag} (regenerate from r1)?", previous_response_id=r1.id, extra_headers=headers
        )
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"] == {"status": "limited", "correlatedInvocations": 3, "incompleteInvocations": 1}
        prepared = row(report, PREP)
        assert prepared["cumulativeMaterializedEstimate"] == est(p1) + est(p2)
        assert prepared["cumulativeExposureEstimate"] == est(p1) + est(p2)  # never P2 again for r3
        # Stored: each continuation names its parent as the parent's record names itself, a keyed digest.
        by_invocation = {r.invocation: r for r in _stored_records(gateway)}
        assert len(by_invocation) == 3
        first, second, third = sorted(by_invocation.values(), key=lambda r: r.ts)
        assert first.full_context and first.parent is None
        assert second.parent == first.invocation and third.parent == first.invocation
        for record in (first, second, third):
            text = record.as_text()
            assert all(raw.id not in text for raw in (r1, r2, r3)) and tag not in text


def test_e2e_unknown_lifetime_material_makes_a_responses_continuation_limited(gateways: GatewayFactory) -> None:
    with gateways("exposure-unknown") as (env, gateway):
        client = _collecting(env, gateway)
        tag = uuid.uuid4().hex[:8]
        # The README's own label example with an id nobody registered: unattributed, lifetime unknown.
        labelled = {
            "x-wiregate-session": "labelled",
            "x-wiregate-blocks": json.dumps({"/input/0": "host.coding_rules"}),
        }
        rules = f"Rule {tag}: " + "always lint. " * 100
        first = client.responses.create(
            model="gpt-4.1",
            instructions="Be brief. " * 10,
            input=[{"role": "user", "content": rules}, {"role": "user", "content": f"Q1 {tag}?"}],
            extra_headers=labelled,
        )
        client.responses.create(
            model="gpt-4.1",
            instructions="Be brief. " * 10,
            input=f"Q2 {tag}?",
            previous_response_id=first.id,
            extra_headers={"x-wiregate-session": "labelled"},
        )
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"] == {"status": "limited", "correlatedInvocations": 2, "incompleteInvocations": 1}
        unattributed = row(report, UNATTRIBUTED)
        assert (
            unattributed["cumulativeExposureEstimate"] == unattributed["cumulativeMaterializedEstimate"] == est(rules)
        )
        # A Responses item the split cannot attribute (mcp_list_tools), brought by a continuation.
        session = {"x-wiregate-session": "mcp"}
        listed = {
            "type": "mcp_list_tools",
            "id": f"mcpl_{tag}",
            "server_label": "docs",
            "tools": [{"name": "search", "input_schema": {"type": "object"}}],
        }
        one = client.responses.create(model="gpt-4.1", input=f"M1 {tag}?", extra_headers=session)
        two = client.responses.create(
            model="gpt-4.1",
            input=[listed, {"role": "user", "content": f"M2 {tag}?"}],  # type: ignore[list-item]
            previous_response_id=one.id,
            extra_headers=session,
        )
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"]["incompleteInvocations"] == 1  # two continues one, seen whole
        client.responses.create(model="gpt-4.1", input=f"M3 {tag}?", previous_response_id=two.id, extra_headers=session)
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"] == {"status": "limited", "correlatedInvocations": 5, "incompleteInvocations": 2}


def test_e2e_a_conversation_continuation_is_limited(gateways: GatewayFactory) -> None:
    with gateways("exposure-conversation") as (env, gateway):
        client = _collecting(env, gateway)
        headers = {"x-wiregate-session": "conversing"}
        tag = uuid.uuid4().hex[:8]
        client.responses.create(model="gpt-4.1", instructions="Be brief.", input=f"C1 {tag}?", extra_headers=headers)
        client.responses.create(model="gpt-4.1", input=f"C2 {tag}?", conversation=f"conv_{tag}", extra_headers=headers)
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["exposure"] == {"status": "limited", "correlatedInvocations": 2, "incompleteInvocations": 1}
        stored = sorted(_stored_records(gateway), key=lambda r: r.ts)
        assert stored[1].conversation is not None and stored[1].conversation.startswith("h:")
        assert stored[1].parent is None and tag not in stored[1].as_text()


def test_e2e_dropped_records_make_exposure_limited(gateways: GatewayFactory) -> None:
    with gateways("exposure-dropped") as (env, gateway):
        _collecting(env, gateway)
        body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"hello {uuid.uuid4().hex}"}]}
        answer = raw_client(gateway, env).post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
        )
        assert answer.status_code == 200
        assert _api(env, gateway, "GET", "/v1/attribution/report")["exposure"]["status"] == "supported"
        assert gateway.running is not None
        ledger = gateway.running.app[ATTRIBUTION]

        async def flood() -> int:
            now = time.time()
            # A database away too long looks like this to the queue: more records than it holds.
            for n in range(ledger._pending.max_pending + 1):
                ledger.add("h:elsewhere", Record(now, (b(CUR, f"x3b:{n:016x}", 1),), invocation=f"h:i{n}"))
            return ledger.dropped

        assert gateway.call(flood()) >= 1
        report = _api(env, gateway, "GET", "/v1/attribution/report")
        assert report["limited"] is True and "records_dropped" in report["limitReasons"]
        assert report["exposure"]["status"] == "limited"
