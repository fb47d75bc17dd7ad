"""Cache planning, bytes in, bytes out: where markers go, what never moves, idempotence."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import caching
from gateway.admission import runes_div4
from gateway.carriers import CARRIERS, jsonspan
from gateway.profiles.model import CacheSettings

ANTHROPIC = CacheSettings(mode="anthropic-cache-control", max_breakpoints=4, min_prefix_tokens=100, ttl="5m")
OPENAI = CacheSettings(mode="openai-prompt-cache-key")
CTX = caching.CacheContext("alice", "team-a", "prof-1")
LONG = "Policy sentence that is long enough to matter. " * 40  # ~470 tokens


def _conversation(turns: int = 3, *, system: Any = LONG, tools: bool = True) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"question {t}: " + "words " * 30})
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"answer {t}"},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{t}",
                        "name": "lookup",
                        "input": {"q": f"x{t}", "nested": {"b": 2, "a": 1}},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": "result " * 20}],
            }
        )
    doc: dict[str, Any] = {"model": "claude-test-model", "max_tokens": 100, "system": system, "messages": messages}
    if tools:
        doc["tools"] = [
            {"name": "lookup", "description": "Look things up in the index. " * 20, "input_schema": {"type": "object"}},
            {"name": "other", "description": "Another tool", "input_schema": {"type": "object"}},
        ]
    return doc


def _plan(
    doc: dict[str, Any], settings: CacheSettings = ANTHROPIC, raw: str | None = None
) -> tuple[str, caching.CachePlan]:
    text = raw if raw is not None else json.dumps(doc, indent=1)  # unusual spacing on purpose
    plan = caching.plan(CARRIERS["anthropic.messages"], text, json.loads(text), settings, CTX, runes_div4)
    return jsonspan.apply(text, plan.edits), plan


def _markers(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, ttl) of every cache_control, in prompt order."""
    found = []
    for i, tool in enumerate(doc.get("tools") or ()):
        if isinstance(tool.get("cache_control"), dict):
            found.append((f"tools/{i}", tool["cache_control"].get("ttl", "5m")))
    system = doc.get("system")
    for i, block in enumerate(system if isinstance(system, list) else ()):
        if isinstance(block.get("cache_control"), dict):
            found.append((f"system/{i}", block["cache_control"].get("ttl", "5m")))
    for m, msg in enumerate(doc["messages"]):
        content = msg["content"]
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block.get("cache_control"), dict):
                found.append((f"messages/{m}/{j}", block["cache_control"].get("ttl", "5m")))
    return found


def test_anthropic_breakpoints_at_stable_boundaries() -> None:
    doc = _conversation()
    planned, plan = _plan(doc)
    after = json.loads(planned)
    # newest user message = messages[8]; the turn before = messages[7] (assistant)
    assert _markers(after) == [("tools/1", "5m"), ("system/0", "5m"), ("messages/7/1", "5m"), ("messages/8/0", "5m")]
    assert {name for name, _ in plan.breakpoints} == {"tools", "system", "last_turn", "tail"}
    assert after["system"][0]["text"] == LONG  # a string system became one text block, same text


def test_every_byte_the_client_sent_is_kept() -> None:
    doc = _conversation()
    text = json.dumps(doc, indent=1)  # the client's own formatting
    planned, plan = _plan(doc, raw=text)
    assert len(planned) > len(text)
    for start, end, replacement in plan.edits:
        assert text[start:end] in replacement  # an insertion, or the original value wrapped
    # Every region between edits is carried over byte for byte, in order.
    at = 0
    for a, b in _unchanged_spans(text, plan.edits):
        found = planned.find(text[a:b], at)
        assert found >= at
        at = found + (b - a)
    # tool-use inputs in particular stay byte-identical (key order and spacing included)
    for t in range(3):
        start, end = jsonspan.locate(text, ("messages", 3 * t + 1, "content", 1, "input"))
        assert text[start:end] in planned


def _unchanged_spans(text: str, edits: tuple[jsonspan.Edit, ...]) -> list[tuple[int, int]]:
    spans, at = [], 0
    for start, end, _ in sorted(edits):
        spans.append((at, start))
        at = end
    spans.append((at, len(text)))
    return spans


def test_planning_is_idempotent_and_deterministic() -> None:
    doc = _conversation()
    once, _ = _plan(doc)
    again, second = _plan(doc)
    assert once == again
    twice, plan2 = _plan(json.loads(once), raw=once)
    assert twice == once and plan2.edits == ()


def test_client_markers_count_and_win() -> None:
    doc = _conversation()
    doc["tools"][0]["cache_control"] = {"type": "ephemeral"}
    doc["messages"][0]["content"] = [
        {"type": "text", "text": doc["messages"][0]["content"], "cache_control": {"type": "ephemeral"}}
    ]
    planned, _ = _plan(doc)
    after = json.loads(planned)
    marks = _markers(after)
    assert len(marks) == 4 and ("tools/0", "5m") in marks and ("messages/0/0", "5m") in marks
    full = _conversation()
    for i in range(2):
        full["tools"][i]["cache_control"] = {"type": "ephemeral"}
    full["messages"][1]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    full["messages"][4]["content"][0]["cache_control"] = {"type": "ephemeral"}
    text = json.dumps(full)
    planned, plan = _plan(full, raw=text)
    assert planned == text and plan.edits == ()  # four client markers: forwarded exactly


def test_client_one_hour_marker_after_ours_never_happens() -> None:
    doc = _conversation()
    # The client put a 1 h marker late in the conversation; our 5 min markers may not precede it.
    doc["messages"][7]["content"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    planned, plan = _plan(doc)
    marks = _markers(json.loads(planned))
    one_hour_at = [i for i, (_, ttl) in enumerate(marks) if ttl == "1h"]
    five_min_at = [i for i, (_, ttl) in enumerate(marks) if ttl == "5m"]
    assert all(f > h for f in five_min_at for h in one_hour_at)
    assert "ttl_order" in plan.skipped


def test_stable_ttl_one_hour_before_five_minutes() -> None:
    settings = CacheSettings(mode="anthropic-cache-control", min_prefix_tokens=100, ttl="5m", stable_ttl="1h")
    planned, _ = _plan(_conversation(), settings)
    assert _markers(json.loads(planned)) == [
        ("tools/1", "1h"),
        ("system/0", "1h"),
        ("messages/7/1", "5m"),
        ("messages/8/0", "5m"),
    ]


def test_below_minimum_and_caching_off() -> None:
    small = _conversation(1, system="short", tools=False)
    planned, plan = _plan(small, CacheSettings(mode="anthropic-cache-control", min_prefix_tokens=100_000))
    assert plan.edits == () and "below_minimum" in plan.skipped
    text = json.dumps(_conversation())
    planned, plan = _plan(json.loads(text), CacheSettings(mode="none"), raw=text)
    assert planned == text and plan.edits == ()


def test_prepared_context_block_gets_a_breakpoint_when_slots_allow() -> None:
    doc = _conversation(tools=False)
    doc["system"] = [
        {"type": "text", "text": LONG},
        {"type": "text", "text": "BEGIN_POWERCONTEXT_PREPARED_CONTEXT_V1\n{}\nEND_POWERCONTEXT_PREPARED_CONTEXT_V1"},
        {"type": "text", "text": "Final instructions."},
    ]
    _, plan = _plan(doc)
    assert [n for n, _ in plan.breakpoints] == ["prepared_context", "system", "last_turn", "tail"]


def test_openai_cache_key() -> None:
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}
    text = json.dumps(body)
    plan = caching.plan(CARRIERS["openai.chat"], text, body, OPENAI, CTX, runes_div4)
    planned = json.loads(jsonspan.apply(text, plan.edits))
    assert planned["prompt_cache_key"] == plan.cache_key and plan.cache_key.startswith("wg-")
    assert jsonspan.apply(text, plan.edits).startswith(text[:-1])  # appended: the prefix is unchanged
    again = caching.plan(CARRIERS["openai.chat"], text, body, OPENAI, CTX, runes_div4)
    assert again.cache_key == plan.cache_key  # stable, never random
    other = caching.plan(
        CARRIERS["openai.chat"], text, body, OPENAI, caching.CacheContext("bob", "team-a", "prof-1"), runes_div4
    )
    assert other.cache_key != plan.cache_key  # principal boundary by default
    scoped = CacheSettings(mode="openai-prompt-cache-key", sharing_boundary="scope")
    a = caching.plan(CARRIERS["openai.chat"], text, body, scoped, CTX, runes_div4).cache_key
    b = caching.plan(
        CARRIERS["openai.chat"], text, body, scoped, caching.CacheContext("bob", "team-a", "prof-1"), runes_div4
    ).cache_key
    assert a == b
    session = caching.plan(
        CARRIERS["openai.chat"],
        text,
        body,
        OPENAI,
        caching.CacheContext("alice", "team-a", "prof-1", "s-1"),
        runes_div4,
    )
    assert session.cache_key != plan.cache_key
    mine = {**body, "prompt_cache_key": "mine"}
    assert caching.plan(CARRIERS["openai.responses"], json.dumps(mine), mine, OPENAI, CTX, runes_div4).edits == ()
    retained = CacheSettings(mode="openai-prompt-cache-key", retention="24h")
    plan = caching.plan(CARRIERS["openai.responses"], text, body, retained, CTX, runes_div4)
    assert json.loads(jsonspan.apply(text, plan.edits))["prompt_cache_retention"] == "24h"
    assert caching.plan(CARRIERS["openai.embeddings"], text, body, OPENAI, CTX, runes_div4).edits == ()


@pytest.mark.parametrize(
    "doc,path",
    [
        ({"a": 1, "b": {"c": [1, {"d": "x"}]}}, ("b", "c", 1, "d")),
        ({"a": 'é\\"q', "b": []}, ("b",)),
        ([1, [2, 3]], (1, 0)),
    ],
)
def test_jsonspan_locate(doc: Any, path: tuple[Any, ...]) -> None:
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    start, end = jsonspan.locate(text, path)
    value: Any = doc
    for step in path:
        value = value[step]
    assert json.loads(text[start:end]) == value


def every_marker(node: Any, out: list[str] | None = None) -> list[str]:
    """The TTL of every `cache_control` object anywhere in a document, depth first in
    document order (a nested block's before its holder's own)."""
    out = [] if out is None else out
    if isinstance(node, dict):
        for key, value in node.items():
            if key != "cache_control":
                every_marker(value, out)
        if isinstance(node.get("cache_control"), dict):
            out.append(node["cache_control"].get("ttl", "5m"))
    elif isinstance(node, list):
        for value in node:
            every_marker(value, out)
    return out


def no_duplicate_keys(text: str) -> None:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        assert len(keys) == len(set(keys)), keys
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)


def test_a_null_cache_control_is_the_clients_decision() -> None:
    """`cache_control: null` on a block or a tool: no marker is added beside it (a second
    member of the same name is a duplicate key the gateway itself would refuse), and it
    takes no slot; the planner uses the block before it instead."""
    doc = _conversation()
    doc["system"] = [{"type": "text", "text": LONG}, {"type": "text", "text": LONG, "cache_control": None}]
    doc["tools"][1]["cache_control"] = None
    planned, plan = _plan(doc)
    no_duplicate_keys(planned)
    after = json.loads(planned)
    assert after["system"][1]["cache_control"] is None and after["tools"][1]["cache_control"] is None
    assert ("system/0", "5m") in _markers(after) and ("tools/0", "5m") in _markers(after)
    assert len(every_marker(after)) == 4 and "client_markers" not in plan.evidence


def _nested_markers(ttl: str | None, count: int) -> dict[str, Any]:
    doc = _conversation()
    marker = {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}
    doc["messages"][5]["content"][0]["content"] = [
        {"type": "text", "text": f"part {i} " * 30, "cache_control": marker} for i in range(count)
    ]
    return doc


@pytest.mark.parametrize("count", [1, 2, 4])
def test_markers_nested_in_a_tool_result_count_towards_the_limit(count: int) -> None:
    planned, plan = _plan(_nested_markers(None, count))
    assert len(every_marker(json.loads(planned))) == 4
    assert len(plan.breakpoints) == 4 - count and "client_markers" in plan.evidence


def test_markers_in_a_documents_source_count_too() -> None:
    doc = _conversation()
    doc["messages"][0]["content"] = [
        {
            "type": "document",
            "source": {
                "type": "content",
                "content": [{"type": "text", "text": "page " * 50, "cache_control": {"type": "ephemeral"}}] * 3,
            },
        },
        {"type": "text", "text": "summarise"},
    ]
    planned, plan = _plan(doc)
    assert len(every_marker(json.loads(planned))) == 4 and len(plan.breakpoints) == 1


def test_a_tools_input_is_data_not_a_marker() -> None:
    """A member named `cache_control` inside a tool call's input or a schema is the
    client's data: it takes no slot."""
    doc = _conversation()
    doc["messages"][1]["content"][1]["input"] = {"cache_control": {"type": "ephemeral"}}
    doc["tools"][0]["input_schema"] = {"type": "object", "properties": {"cache_control": {"type": "object"}}}
    _, plan = _plan(doc)
    assert len(plan.breakpoints) == 4


@pytest.mark.parametrize(
    ("nested", "profile"),
    [("5m", CacheSettings(mode="anthropic-cache-control", min_prefix_tokens=100, ttl="1h")), ("1h", ANTHROPIC)],
)
def test_nested_client_markers_keep_one_hour_before_five_minutes(nested: str, profile: CacheSettings) -> None:
    planned, _ = _plan(_nested_markers(nested, 1), profile)
    ttls = every_marker(json.loads(planned))
    assert ttls == sorted(ttls, key=lambda t: t != "1h"), ttls  # every 1h before every 5m
    assert nested in ttls and len(ttls) >= 2


def test_no_marker_on_a_tool_loaded_on_demand() -> None:
    """A `defer_loading` tool cannot carry `cache_control` (the provider refuses both): the
    tools breakpoint goes on the last tool the prompt holds."""
    doc = _conversation()
    doc["tools"].append(
        {"name": "later", "description": "d", "input_schema": {"type": "object"}, "defer_loading": True}
    )
    planned, plan = _plan(doc)
    after = json.loads(planned)
    assert "cache_control" not in after["tools"][2] and "cache_control" in after["tools"][1]
    assert ("tools", "5m") in plan.breakpoints
