"""A twenty-turn agent session through the proxy with the official openai and anthropic SDKs
against the bundled mock: tool schemas, prepared context from the context layer, tool calls and tool
results, a client retry, a compaction labelled by the host. The attribution report equals
the figures computed here by hand from what was sent; nothing of the prompt or any raw id
is stored; collection is off by default and switching it on does not back-fill; a failing
attribution sink never affects a call."""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.context import builder
from gateway.state import ATTRIBUTION
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, raw_client

SENTINEL = "QUOKKA"  # only ever in prompt text
SESSION = "agent-session-7f3a"
SYSTEM = "You are a careful coding agent. Follow the repository rules exactly.\n\n"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read one file of the repository",
            "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        },
    }
]
TURNS = 20
COMPACT_AT = 13  # the host compacts its history before this turn
RETRY_AT = 7  # the client sends this turn twice (same invocation)
TARGET = 256  # wiregate.prepared_context's registered per-injection target


def est(text: str) -> int:
    return math.ceil(len(text) / 4)


def compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def api(env: Env, gw: GatewayThread, method: str, path: str, body: Any = None, **params: Any) -> Any:
    client = raw_client(gw, env)
    response = client.request(
        method, path, json=body, params=params or None, headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert response.status_code in (200, 201), response.text
    return response.json()


OPERATOR: dict[str, str] = {}  # the key of a principal that observes every scope


def _operator(env: Env) -> None:
    OPERATOR[str(env.dir)] = env.add_principal("operator", ["observe"], [], ["*"])


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("attribution-e2e", prepare=_operator) as started:
        yield started


def _prepare(env: Env, gw: GatewayThread) -> tuple[str, str]:
    scope = api(env, gw, "POST", "/v1/scopes", {"title": "a", "summary": "a", "idempotency_key": uuid.uuid4().hex})[
        "scope_id"
    ]
    api(
        env,
        gw,
        "POST",
        f"/v1/scopes/{scope}/artifacts",
        {"family": "atomic-memory", "content": {"kind": "decision", "text": "Modules are tested before merge."}},
    )
    prepared = api(env, gw, "POST", "/v1/context/prepare", {"scope_id": scope, "query": "how are modules tested"})
    content = prepared["content"]
    assert content.startswith(builder.TRUST_POLICY) and content.endswith(builder.END_MARKER)
    return scope, content


class Expected:
    """The report, by hand: per block id, what each call sent."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, int]] = {}
        self.calls = 0

    def call(self, blocks: list[tuple[str, str]]) -> None:
        self.calls += 1
        seen: set[str] = set()
        for block_id, text in blocks:
            row = self.rows.setdefault(block_id, {"materialized": 0, "injections": 0})
            row["materialized"] += est(text)
            if block_id not in seen:
                seen.add(block_id)
                row["injections"] += 1


class Session:
    """One twenty-turn session as the host holds it (history after the system prompt, the
    host's labels) beside what it sent, by hand: the blocks of the history in order, the
    expected report rows, the provider's usage and the response ids. Each SDK test sends
    the turns in its own wire format; the bookkeeping is the same."""

    def __init__(self, tools: list[dict[str, Any]], prepared: str, compaction_pointer: str) -> None:
        self.tools, self.prepared, self.compaction_pointer = tools, prepared, compaction_pointer
        self.history: list[dict[str, Any]] = []
        self.hand: list[tuple[str, str]] = []  # (block id, text) of the history, in order
        self.labels: dict[str, str] = {}
        self.expected = Expected()
        self.usage = {"input_total": 0, "output": 0, "cache_read": 0}
        self.response_ids: set[str] = set()

    def begin(self, turn: int) -> str:
        """The turn's user text; before COMPACT_AT the host compacts its history."""
        if turn == COMPACT_AT:
            summary = f"Summary of turns 1-{turn - 1}: modules checked, two files read. {SENTINEL}"
            self.history = [{"role": "user", "content": summary}]
            self.hand = [("host.compaction_summary", summary)]
            self.labels = {self.compaction_pointer: "host.compaction_summary"}
        return f"Turn {turn}: check module {turn} and report. {SENTINEL}"

    def headers(self, base: dict[str, str]) -> dict[str, str]:
        return {**base, "x-wiregate-blocks": json.dumps(self.labels)} if self.labels else base

    def answered(self, user: str, response_id: str, input_total: int, output: int, cache_read: int) -> None:
        """A turn's reply: one new invocation, its usage, and the blocks its request held."""
        assert response_id not in self.response_ids
        self.response_ids.add(response_id)
        for kind, tokens in (("input_total", input_total), ("output", output), ("cache_read", cache_read)):
            self.usage[kind] += tokens
        self.expected.call(
            [
                ("prompt.tool_schemas", "".join(compact(t) for t in self.tools)),
                ("prompt.system_instructions", SYSTEM),
                ("wiregate.prepared_context", self.prepared),
                *self.hand,
                ("prompt.current_user_turn", user),
            ]
        )
        self.add([{"role": "user", "content": user}], [("prompt.history.user_turn", user)])

    def add(self, messages: list[dict[str, Any]], blocks: list[tuple[str, str]]) -> None:
        self.history += messages
        self.hand += blocks


def test_a_twenty_turn_session_reports_what_was_computed_by_hand(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    scope, prepared = _prepare(env, gateway)
    client = openai_client(gateway, env)
    headers = {"x-wiregate-scope": scope, "x-wiregate-session": SESSION}

    # Collection is off by default: this call is never recorded, and switching on does not back-fill it.
    assert api(env, gateway, "GET", "/v1/attribution/collection") == {"collecting": False}
    client.chat.completions.create(
        model="gpt-4.1", messages=[{"role": "user", "content": f"{SENTINEL} before"}], extra_headers=headers
    )
    assert api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True}) == {"collecting": True}

    system = {"role": "system", "content": SYSTEM + prepared}
    session = Session(TOOLS, prepared, "/messages/1")  # the system message is /messages/0
    for turn in range(1, TURNS + 1):
        user = session.begin(turn)
        messages = [system, *session.history, {"role": "user", "content": user}]
        extra = session.headers(headers)
        reply = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS, extra_headers=extra)
        if turn == RETRY_AT:  # the client retries: the same invocation again
            again = client.chat.completions.create(model="gpt-4.1", messages=messages, tools=TOOLS, extra_headers=extra)
            assert again.id == reply.id
        assert reply.usage is not None
        details = reply.usage.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        session.answered(user, reply.id, reply.usage.prompt_tokens, reply.usage.completion_tokens, cached)
        if turn % 4 == 0:  # the agent calls a tool; its result joins the history
            call_id = f"call_{turn}"
            calls = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": json.dumps({"name": f"m{turn}.txt"})},
                }
            ]
            result = f"contents of module {turn}: " + "x = 1\n" * (40 + turn)
            session.add(
                [
                    {"role": "assistant", "tool_calls": calls},
                    {"role": "tool", "tool_call_id": call_id, "content": result},
                ],
                [
                    ("prompt.history.assistant_turn", compact({"tool_calls": calls})),
                    ("prompt.tool_result", result + compact({"tool_call_id": call_id})),
                ],
            )
        else:
            text = reply.choices[0].message.content or ""
            session.add([{"role": "assistant", "content": text}], [("prompt.history.assistant_turn", text)])

    _verify(env, gateway, scope, session)


ANTHROPIC_TOOLS = [
    {
        "name": "read_file",
        "description": "Read one file of the repository",
        "input_schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    }
]


def test_the_same_session_through_the_anthropic_sdk_reports_what_was_computed_by_hand(
    gateways: GatewayFactory,
) -> None:
    """The twenty turns again with the official anthropic SDK: the system prompt (with the
    prepared context) is top-level, tool calls are `tool_use` blocks of the assistant and
    their results `tool_result` blocks of a user message, and wiregate puts its own cache
    markers on the request, which the report must not count as prompt text."""
    with gateways("attribution-e2e-anthropic", prepare=_operator) as (env, gateway):
        scope, prepared = _prepare(env, gateway)
        client = anthropic_client(gateway, env)
        headers = {"x-wiregate-scope": scope, "x-wiregate-session": SESSION}

        assert api(env, gateway, "GET", "/v1/attribution/collection") == {"collecting": False}
        client.messages.create(
            model="claude-sonnet-4-6",
            max_tokens=64,
            messages=[{"role": "user", "content": f"{SENTINEL} before"}],
            extra_headers=headers,
        )
        assert api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True}) == {"collecting": True}

        session = Session(ANTHROPIC_TOOLS, prepared, "/messages/0")  # the system prompt is top-level
        for turn in range(1, TURNS + 1):
            user = session.begin(turn)
            request = {
                "model": "claude-sonnet-4-6",
                "max_tokens": 256,
                "system": SYSTEM + prepared,
                "tools": ANTHROPIC_TOOLS,
                "messages": [*session.history, {"role": "user", "content": user}],
                "extra_headers": session.headers(headers),
            }
            reply = client.messages.create(**request)
            if turn == RETRY_AT:
                assert client.messages.create(**request).id == reply.id
            read = reply.usage.cache_read_input_tokens or 0
            written = reply.usage.cache_creation_input_tokens or 0
            session.answered(user, reply.id, reply.usage.input_tokens + read + written, reply.usage.output_tokens, read)
            if turn % 4 == 0:
                use = {
                    "type": "tool_use",
                    "id": f"toolu_{turn}",
                    "name": "read_file",
                    "input": {"name": f"m{turn}.txt"},
                }
                result = {
                    "type": "tool_result",
                    "tool_use_id": f"toolu_{turn}",
                    "content": f"contents of module {turn}: " + "x = 1\n" * (40 + turn),
                }
                session.add(
                    [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}],
                    [("prompt.history.assistant_turn", compact(use)), ("prompt.tool_result", compact(result))],
                )
            else:
                text = "".join(block.text for block in reply.content if block.type == "text")
                session.add([{"role": "assistant", "content": text}], [("prompt.history.assistant_turn", text)])
        _verify(env, gateway, scope, session)


ELIGIBLE = {
    "prompt.tool_schemas",
    "prompt.system_instructions",
    "wiregate.prepared_context",
    "prompt.history.assistant_turn",
    "prompt.tool_result",
    "host.compaction_summary",
}


def _verify(
    env: Env,
    gateway: GatewayThread,
    scope: str,
    session: Session,
) -> None:
    """The report of one twenty-turn session equals the figures computed by hand, and
    nothing of its prompt, session, scope or response ids is stored."""
    expected, usage = session.expected, session.usage
    report = api(env, gateway, "GET", "/v1/attribution/report", scope=scope)
    assert report["estimator"] == {"name": "runes/4@1", "kind": "relative_attribution_only"}
    assert report["boundaries"] == TURNS == expected.calls
    assert report["replaysDeduplicated"] == 1
    assert report["exposure"] == {"status": "supported", "correlatedInvocations": TURNS, "incompleteInvocations": 0}
    assert report["limited"] is False

    got = {r["blockId"]: r for r in report["ledger"]}
    assert set(got) == set(expected.rows)
    eligible = ELIGIBLE
    for block_id, want in expected.rows.items():
        row = got[block_id]
        materialized, injections = want["materialized"], want["injections"]
        assert row["cumulativeMaterializedEstimate"] == materialized, block_id
        assert row["injectionCount"] == injections, block_id
        assert row["injectionCoverage"] == round(injections / TURNS, 6)
        assert row["meanTokensWhenInjected"] == round(materialized / injections, 2)
        # Every call carries its whole context: what is active is exactly what was sent.
        assert row["cumulativeExposureEstimate"] == materialized, block_id
        assert row["activeInvocations"] == injections, block_id
        controllable = materialized if block_id in eligible else 0
        assert row["cumulativeControllableExposureEstimate"] == controllable, block_id
        if block_id == "wiregate.prepared_context":
            assert row["cumulativeTargetExposureEstimate"] == TARGET * TURNS
            assert row["cumulativeAddressableExposureEstimate"] == max(controllable - TARGET * TURNS, 0)
            assert row["estimator"] == "addressable_exposure_target"
        else:
            assert "cumulativeAddressableExposureEstimate" not in row and "cumulativeTargetExposureEstimate" not in row
            assert row["estimator"] == "exposure_contribution"

    total = sum(w["materialized"] for w in expected.rows.values())
    user_payload = sum(
        expected.rows[b]["materialized"] for b in ("prompt.current_user_turn", "prompt.history.user_turn")
    )
    assert report["partition"] == {
        "compiledMaterialized": total,
        "owned": total - user_payload,
        "workspaceConfiguration": 0,
        "userTaskPayload": user_payload,
        "unknown": 0,
    }
    assert report["controllableMaterialized"] == total - user_payload

    def value(block_id: str) -> int:
        row = got[block_id]
        return row.get("cumulativeAddressableExposureEstimate", row["cumulativeExposureEstimate"])

    ranked = sorted((b for b in eligible if value(b) > 0), key=lambda b: (-value(b), -got[b]["injectionCount"], b))
    assert [o["blockId"] for o in report["opportunities"]] == ranked
    assert all(
        o["blockId"] not in ("prompt.current_user_turn", "prompt.history.user_turn") for o in report["opportunities"]
    )

    kinds = report["providerUsage"]["kinds"]
    for kind, total_tokens in usage.items():
        assert kinds[kind]["known"] == total_tokens, kind
    assert report["providerUsage"]["invocations"] == TURNS

    # Without a scope: every scope for a principal that reaches them all (the same here);
    # the principal's own default scope (where this session did not run) for any other.
    everything = raw_client(gateway, env).get(
        "/v1/attribution/report", headers={"authorization": f"Bearer {OPERATOR[str(env.dir)]}"}
    )
    assert everything.status_code == 200 and everything.json()["scope"] == "all"
    assert everything.json()["boundaries"] >= TURNS
    own = api(env, gateway, "GET", "/v1/attribution/report")
    assert own["scope"] == "selected" and own["boundaries"] == 0
    # A window that ends before the session holds nothing.
    assert api(env, gateway, "GET", "/v1/attribution/report", until=str(time.time() - 3600))["boundaries"] == 0

    # Nothing of the prompt, the session, the scope or a response id is stored.
    db = sqlite3.connect(env.dir / "data" / "wiregate.db")
    try:
        rows = db.execute("SELECT ts, scope, session, invocation, profile, record FROM wg_attr_records").fetchall()
    finally:
        db.close()
    assert len(rows) == TURNS + 1  # the retry is stored, and counted once
    stored = json.dumps(rows)
    for raw in (SENTINEL, SESSION, scope, "read_file", "module", *session.response_ids):
        assert raw not in stored


def test_switching_needs_admin_and_reading_needs_observe(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    client = raw_client(gateway, env)
    viewer = env.add_principal("viewer", ["observe"], [])
    caller = env.add_principal("caller", ["proxy"], ["mock-openai"])
    assert gateway.reload()
    # Hosts read the registry to label their blocks; it is not the report.
    registry = client.get("/v1/attribution/registry", headers={"authorization": f"Bearer {caller}"}).json()
    ids = [b["blockId"] for b in registry["blocks"]]
    assert "wiregate.prepared_context" in ids and "unattributed.prompt_surface" in ids
    assert registry["labelHeader"] == "x-wiregate-blocks" and registry["estimator"] == "runes/4@1"
    prepared = next(b for b in registry["blocks"] if b["blockId"] == "wiregate.prepared_context")
    assert prepared["targetPerInjection"] == 256 and prepared["control"] == "assembly"
    assert client.get("/v1/attribution/report", headers={"authorization": f"Bearer {caller}"}).status_code == 403
    as_viewer = {"authorization": f"Bearer {viewer}"}
    assert client.get("/v1/attribution/report", headers=as_viewer).status_code == 200
    assert client.post("/v1/attribution/collection", json={"collecting": False}, headers=as_viewer).status_code == 403
    assert client.get("/v1/attribution/report").status_code == 401
    admin = {"authorization": f"Bearer {env.gateway_key}"}
    assert client.post("/v1/attribution/collection", json={"collecting": "yes"}, headers=admin).status_code == 422
    assert client.get("/v1/attribution/report", params={"top": "13"}, headers=admin).status_code == 422


def test_a_failing_attribution_sink_never_affects_a_call(gateways: GatewayFactory) -> None:
    with gateways("attribution-failing") as (env, gateway):
        api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
        assert gateway.running is not None
        ledger = gateway.running.app[ATTRIBUTION]
        client = openai_client(gateway, env)
        messages = [{"role": "user", "content": "hello"}]

        def broken(*args: Any) -> None:
            raise RuntimeError("attribution sink down")

        ledger.add = broken  # type: ignore[method-assign]
        ledger.defer = broken  # type: ignore[method-assign]
        for n in range(3):
            reply = client.chat.completions.create(
                model="gpt-4.1", messages=[*messages, {"role": "user", "content": str(n)}]
            )
            assert reply.choices[0].message.content
        chunks = list(client.chat.completions.create(model="gpt-4.1", messages=messages, stream=True))
        assert chunks
        metrics = raw_client(gateway, env).get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
        assert 'wiregate_attribution_records_total{outcome="failed"} 4.0' in metrics
        # The database itself fails: records queue, the flush fails off the call's path.
        del ledger.add
        del ledger.defer
        db = sqlite3.connect(env.dir / "data" / "wiregate.db")
        try:
            db.execute("DROP TABLE wg_attr_records")
            db.commit()
        finally:
            db.close()
        for n in range(3):
            reply = client.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": f"again {n}"}]
            )
            assert reply.choices[0].message.content
        time.sleep(0.2)  # let a flush fail
        reply = client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "still"}])
        assert reply.choices[0].message.content


def test_the_cli_switches_collection_and_prints_the_report(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw

    def cli(*args: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "attribution", *args, "--uds", str(gateway.uds)],
            env={**os.environ, "WIREGATE_KEY": env.gateway_key},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert cli("on") == {"collecting": True}
    before = cli("report")["boundaries"]
    assert cli("off") == {"collecting": False}
    openai_client(gateway, env).chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "x"}])
    after = cli("report")
    assert after["collection"] == {"collecting": False} and after["boundaries"] == before
    assert cli("on") == {"collecting": True}
    missing = subprocess.run(
        [sys.executable, "-m", "gateway", "attribution", "on", "--uds", str(gateway.uds)],
        env={k: v for k, v in os.environ.items() if k != "WIREGATE_KEY"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "WIREGATE_KEY" in missing.stderr


def test_a_large_body_is_attributed_off_the_event_loop(gateways: GatewayFactory) -> None:
    """Bodies past `offload_bytes` are parsed and checked in a worker; the worker that
    parses one also splits it (host labels included), so the loop never parses it again,
    and the report is the same as for a small body."""
    with gateways("attribution-offload", config_extra="[limits]\noffload_bytes = 2048\n") as (env, gateway):
        api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
        system = "Rules. " * 800
        user = "Large question. " * 300
        client = openai_client(gateway, env)
        client.chat.completions.create(
            model="gpt-4.1",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            tools=TOOLS,
        )
        report = api(env, gateway, "GET", "/v1/attribution/report")
        got = {r["blockId"]: r["cumulativeMaterializedEstimate"] for r in report["ledger"]}
        assert got == {
            "prompt.system_instructions": est(system),
            "prompt.current_user_turn": est(user),
            "prompt.tool_schemas": est("".join(compact(t) for t in TOOLS)),
        }
        assert report["exposure"]["status"] == "supported"
        # the host's labels reach the worker's split
        workspace = "Workspace rules. " * 200
        client.chat.completions.create(
            model="gpt-4.1",
            messages=[{"role": "system", "content": workspace}, {"role": "user", "content": user}],
            extra_headers={"x-wiregate-blocks": json.dumps({"/messages/0": "host.workspace_configuration"})},
        )
        report = api(env, gateway, "GET", "/v1/attribution/report")
        got = {r["blockId"]: r["cumulativeMaterializedEstimate"] for r in report["ledger"]}
        assert got["host.workspace_configuration"] == est(workspace)
        assert got["prompt.current_user_turn"] == 2 * est(user) and got["prompt.system_instructions"] == est(system)


@pytest.mark.parametrize("session", [True, False])
def test_a_responses_continuation_is_exposed_to_what_its_session_carries(
    gateways: GatewayFactory, session: bool
) -> None:
    """With `previous_response_id` a call holds only what is new; the session carries the
    rest, so exposure exceeds what was materialized. Without a session the evidence is
    incomplete: `limited`, never filled in from injection counts."""
    with gateways(f"attribution-responses-{session}") as (env, gateway):
        api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
        client = openai_client(gateway, env)
        headers = {"x-wiregate-session": "responses-session"} if session else {}
        instructions = "You answer in one sentence. " * 10
        users = [f"Question {n}: what changed in module {n}?" for n in range(1, 4)]
        previous = None
        for user in users:
            extra = {"previous_response_id": previous} if previous else {}
            reply = client.responses.create(
                model="gpt-4.1", instructions=instructions, input=user, extra_headers=headers, **extra
            )
            previous = reply.id
        report = api(env, gateway, "GET", "/v1/attribution/report")
        got = {r["blockId"]: r for r in report["ledger"]}
        u = [est(x) for x in users]
        assert got["prompt.current_user_turn"]["cumulativeMaterializedEstimate"] == sum(u)
        assert got["prompt.system_instructions"]["cumulativeMaterializedEstimate"] == 3 * est(instructions)
        if session:
            assert report["exposure"]["status"] == "supported"
            exposure = u[0] + (u[0] + u[1]) + (u[0] + u[1] + u[2])
            assert got["prompt.current_user_turn"]["cumulativeExposureEstimate"] == exposure
            assert got["prompt.system_instructions"]["cumulativeExposureEstimate"] == 3 * est(instructions)
        else:
            assert report["exposure"] == {
                "status": "limited",
                "correlatedInvocations": 3,
                "incompleteInvocations": 2,
            }
            assert got["prompt.current_user_turn"]["cumulativeExposureEstimate"] == sum(u)  # what was seen, no more


def _attribution_seconds(env: Env, gateway: GatewayThread) -> dict[str, float]:
    text = raw_client(gateway, env).get("/metrics", headers={"authorization": f"Bearer {env.gateway_key}"}).text
    found = re.findall(r'^wiregate_attribution_seconds_total\{part="(record|write)"\} (\S+)$', text, re.M)
    return {part: float(value) for part, value in found}


def test_the_gateway_counts_the_cpu_time_collection_costs(gateways: GatewayFactory) -> None:
    """`wiregate_attribution_seconds_total` counts what collecting costs in the gateway itself
    (the attribution benchmark reads it): each call's record, on the event loop or, for a body
    past `offload_bytes`, on a thread, and the ledger's batched writes. Nothing while off."""
    with gateways("attribution-cost", config_extra="[limits]\noffload_bytes = 2048\n") as (env, gateway):
        client = openai_client(gateway, env)

        def call(user: str) -> None:
            client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": user}], tools=TOOLS)

        call("Collection is off.")
        api(env, gateway, "GET", "/v1/attribution/report")  # any batch is written before a report
        off = _attribution_seconds(env, gateway)
        assert off.get("record", 0.0) == 0.0 and off.get("write", 0.0) == 0.0

        api(env, gateway, "POST", "/v1/attribution/collection", {"collecting": True})
        call("A small question.")  # its record is made on the event loop
        deadline = time.monotonic() + 5
        while _attribution_seconds(env, gateway).get("record", 0.0) == 0.0 and time.monotonic() < deadline:
            time.sleep(0.02)
        small = _attribution_seconds(env, gateway)
        assert small["record"] > 0.0
        api(env, gateway, "GET", "/v1/attribution/report")
        written = _attribution_seconds(env, gateway)
        assert written["write"] > 0.0

        call("A large question. " * 300)  # past offload_bytes: its record is made on a thread
        deadline = time.monotonic() + 5
        while _attribution_seconds(env, gateway)["record"] == written["record"] and time.monotonic() < deadline:
            time.sleep(0.02)
        report = api(env, gateway, "GET", "/v1/attribution/report")
        after = _attribution_seconds(env, gateway)
        assert after["record"] > written["record"] and after["write"] > written["write"]
        assert sum(r["injectionCount"] for r in report["ledger"] if r["blockId"] == "prompt.current_user_turn") == 2
