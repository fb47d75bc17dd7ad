"""Prompt-cache emulation: Anthropic breakpoints and OpenAI implicit prefix caching.

Token arithmetic: every prompt unit (Anthropic block, OpenAI segment) costs
``max(1, ceil(chars / 4))``; `text(n)` builds a string of exactly ``4 n`` characters,
so a text block made of it costs exactly ``n`` tokens.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from gateway.mockprovider import MockProviderServer, MockState, compute_usage
from gateway.mockprovider.cache import (
    Breakpoint,
    BreakpointError,
    CacheStore,
    CacheUsage,
    bill_anthropic,
    openai_cached_tokens,
    plan_anthropic,
    prefix_totals,
    read_position,
    resolve_breakpoints,
)

MODEL = "claude-sonnet-4-6"
GPT = "gpt-4.1-mini"
FIVE_MIN: dict[str, str] = {"type": "ephemeral"}
ONE_HOUR: dict[str, str] = {"type": "ephemeral", "ttl": "1h"}


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def server() -> Iterator[MockProviderServer]:
    with MockProviderServer() as mock:
        yield mock


@pytest.fixture(autouse=True)
def clock(server: MockProviderServer) -> Iterator[FakeClock]:
    """A fresh cache, default knobs and a controllable clock for every test."""
    fake = FakeClock()
    state = server.state
    state.clear_cache()
    state.cache_min_tokens = 1024
    state.openai_cache_min_tokens = 1024
    state.openai_cache_ttl_s = 600.0
    state.clock = fake
    yield fake
    state.clear_cache()


def text(tokens: int, seed: str) -> str:
    """Exactly ``4 * tokens`` characters (so exactly `tokens` tokens), distinct per seed."""
    base = f"[{seed}] The quick brown fox jumps over the lazy dog. "
    return (base * (4 * tokens // len(base) + 1))[: 4 * tokens]


def block(tokens: int, seed: str, cache_control: dict[str, str] | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {"type": "text", "text": text(tokens, seed)}
    if cache_control is not None:
        result["cache_control"] = cache_control
    return result


def user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def messages_usage(server: MockProviderServer, body: dict[str, Any], key: str = "k") -> Any:
    response = httpx2.post(
        server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 16, **body},
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def cache_counts(usage: dict[str, Any]) -> tuple[int, int, int]:
    """(input_tokens, cache_read_input_tokens, cache_creation_input_tokens)."""
    return (
        usage["input_tokens"],
        usage["cache_read_input_tokens"],
        usage["cache_creation_input_tokens"],
    )


def split(usage: dict[str, Any]) -> tuple[int, int]:
    """(ephemeral_5m_input_tokens, ephemeral_1h_input_tokens)."""
    creation = usage["cache_creation"]
    return creation["ephemeral_5m_input_tokens"], creation["ephemeral_1h_input_tokens"]


def chat_usage(server: MockProviderServer, body: dict[str, Any], key: str = "k") -> Any:
    response = httpx2.post(
        server.url + "/v1/chat/completions",
        json={"model": GPT, **body},
        headers={"authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def cached(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or usage["input_tokens_details"]
    return int(details["cached_tokens"])


# -- Anthropic: write, read, totals ---------------------------------------------------


def test_system_breakpoint_writes_then_reads(server: MockProviderServer) -> None:
    body = {
        "system": [block(1100, "policy", FIVE_MIN)],
        "messages": [user(block(7, "question"))],
    }
    first = messages_usage(server, body)
    second = messages_usage(server, body)

    assert cache_counts(first) == (7, 0, 1100)
    assert split(first) == (1100, 0)
    assert cache_counts(second) == (7, 1100, 0)
    assert split(second) == (0, 0)
    # The total is the same either way, and is what compute_usage counts uncached.
    uncached = compute_usage("anthropic", body)["input_tokens"]
    assert sum(cache_counts(first)) == sum(cache_counts(second)) == uncached == 1107


def test_sdk_parses_cache_usage_non_stream_and_stream(server: MockProviderServer) -> None:
    system: Any = [block(1200, "sdk-system", FIVE_MIN)]
    messages: Any = [{"role": "user", "content": "Hello"}]
    with anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client:
        first = client.messages.create(model=MODEL, max_tokens=8, system=system, messages=messages)
        with client.messages.stream(model=MODEL, max_tokens=8, system=system, messages=messages) as stream:
            second = stream.get_final_message()

    assert first.usage.cache_creation_input_tokens == 1200
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation is not None
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == 1200
    assert second.usage.cache_read_input_tokens == 1200
    assert second.usage.cache_creation_input_tokens == 0
    assert first.usage.input_tokens == second.usage.input_tokens == 2  # "Hello"


def test_stream_message_start_carries_cache_counts(server: MockProviderServer) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "stream": True,
        "system": [block(1030, "stream-sys", ONE_HOUR)],
        "messages": [user(block(3, "stream-q"))],
    }
    raw = httpx2.post(server.url + "/v1/messages", json=body).content
    events = [json.loads(chunk.split("\ndata: ", 1)[1]) for chunk in raw.decode().split("\n\n")[:-1]]
    start = events[0]["message"]["usage"]
    assert events[0]["type"] == "message_start"
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == (3, 0)
    assert start["cache_creation_input_tokens"] == 1030
    assert start["cache_creation"] == {
        "ephemeral_5m_input_tokens": 0,
        "ephemeral_1h_input_tokens": 1030,
    }
    delta = events[-2]
    assert delta["type"] == "message_delta"
    assert delta["usage"]["output_tokens"] > 0
    assert delta["usage"]["cache_creation_input_tokens"] == 1030


def test_string_system_and_list_system_share_the_prefix(server: MockProviderServer) -> None:
    """Markers and the string shorthand never change a block's hash."""
    system_text = text(1100, "shorthand")
    written = messages_usage(
        server,
        {
            "system": [{"type": "text", "text": system_text, "cache_control": ONE_HOUR}],
            "messages": [user(block(5, "first"))],
        },
    )
    assert cache_counts(written) == (5, 0, 1100)
    # Plain-string system, breakpoint on the user block: the lookback finds block 0.
    read = messages_usage(
        server,
        {"system": system_text, "messages": [user(block(6, "second", FIVE_MIN))]},
    )
    assert cache_counts(read) == (0, 1100, 6)
    assert split(read) == (6, 0)


# -- Anthropic: conversations and the 20-block lookback --------------------------------


def _tool_turn(index: int) -> list[dict[str, Any]]:
    """An assistant tool call and the user's tool result: 4 blocks."""
    call_id = f"toolu_{index:02d}"
    return [
        assistant(
            block(10, f"thinking-aloud-{index}"),
            {"type": "tool_use", "id": call_id, "name": "lookup", "input": {"n": index}},
        ),
        user(
            {"type": "tool_result", "tool_use_id": call_id, "content": text(20, f"r{index}")},
            block(5, f"follow-up-{index}"),
        ),
    ]


def _mark_last_stable(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copy of `history` with a 5 min breakpoint on the last block before the newest
    user message (what a gateway does)."""
    marked: list[dict[str, Any]] = json.loads(json.dumps(history))
    marked[-2]["content"][-1]["cache_control"] = FIVE_MIN
    return marked


def test_growing_conversation_reads_previous_turn(server: MockProviderServer) -> None:
    system = [block(1100, "agent-system")]
    tool_use_tokens = math.ceil(len('{"n":0}lookup') / 4)  # canonical input + name
    turn_tokens = 10 + tool_use_tokens + 20 + 5

    history = [user(block(8, "task")), *_tool_turn(0)]
    # Breakpoint on the assistant's tool_use (block 3); nothing stored yet.
    first = messages_usage(server, {"system": system, "messages": _mark_last_stable(history)})
    prefix_through_call = 1100 + 8 + 10 + tool_use_tokens
    assert cache_counts(first) == (25, 0, prefix_through_call)

    history += _tool_turn(1)
    second = messages_usage(server, {"system": system, "messages": _mark_last_stable(history)})
    # The new breakpoint (block 7) looks back 4 blocks to block 3, written before.
    assert cache_counts(second) == (25, prefix_through_call, turn_tokens)

    history += _tool_turn(2)
    third = messages_usage(server, {"system": system, "messages": _mark_last_stable(history)})
    assert cache_counts(third) == (25, prefix_through_call + turn_tokens, turn_tokens)
    totals = {sum(cache_counts(u)) - n * turn_tokens for n, u in enumerate((first, second, third))}
    assert totals == {1100 + 8 + turn_tokens}


def _long_history(extra_blocks: int) -> list[dict[str, Any]]:
    """A user turn (block 1 after the system block), then `extra_blocks` more blocks."""
    return [
        user(block(4, "opening")),
        assistant(*(block(3, f"a{i}") for i in range(extra_blocks - 1))),
        user(block(2, "latest")),
    ]


def test_growth_beyond_the_lookback_misses_without_an_earlier_breakpoint(
    server: MockProviderServer,
) -> None:
    system = [block(1100, "lookback-system")]
    opening = {"system": system, "messages": [user(block(4, "opening", FIVE_MIN))]}
    assert cache_counts(messages_usage(server, opening)) == (0, 0, 1104)

    # 21 blocks later: block 22 looks back to block 3 at most, so block 1 is not found.
    far = _long_history(21)
    far[-1]["content"][-1]["cache_control"] = FIVE_MIN
    missed = messages_usage(server, {"system": system, "messages": far})
    total = 1100 + 4 + 20 * 3 + 2
    assert cache_counts(missed) == (0, 0, total)

    # A second breakpoint on the old write position finds it.
    server.state.clear_cache()
    messages_usage(server, opening)
    both = json.loads(json.dumps(far))
    both[0]["content"][0]["cache_control"] = FIVE_MIN
    hit = messages_usage(server, {"system": system, "messages": both})
    assert cache_counts(hit) == (0, 1104, total - 1104)


def test_lookback_reaches_exactly_twenty_positions(server: MockProviderServer) -> None:
    system = [block(1100, "edge-system")]
    opening = {"system": system, "messages": [user(block(4, "opening", FIVE_MIN))]}
    messages_usage(server, opening)

    # Breakpoint on block 20: positions 20..1 are checked, block 1 is among them.
    near = _long_history(19)
    near[-1]["content"][-1]["cache_control"] = FIVE_MIN
    usage = messages_usage(server, {"system": system, "messages": near})
    assert usage["cache_read_input_tokens"] == 1104


# -- Anthropic: minimum, TTLs, expiry -------------------------------------------------


def test_prefix_below_the_minimum_is_not_cached(server: MockProviderServer) -> None:
    body = {"system": [block(1000, "small", FIVE_MIN)], "messages": [user(block(3, "q"))]}
    assert cache_counts(messages_usage(server, body)) == (1003, 0, 0)
    assert cache_counts(messages_usage(server, body)) == (1003, 0, 0)
    assert server.state.cache_entries() == 0

    server.state.cache_min_tokens = 512
    assert cache_counts(messages_usage(server, body)) == (3, 0, 1000)
    assert cache_counts(messages_usage(server, body)) == (3, 1000, 0)


def test_only_breakpoints_reaching_the_minimum_write(server: MockProviderServer) -> None:
    body = {
        "system": [block(600, "s1", ONE_HOUR), block(600, "s2", FIVE_MIN)],
        "messages": [user(block(3, "q"))],
    }
    # Block 0 (600 tokens) is too small; block 1 (1200) is written at 5 min.
    first = messages_usage(server, body)
    assert cache_counts(first) == (3, 0, 1200)
    assert split(first) == (1200, 0)


def test_mixed_ttl_billing(server: MockProviderServer) -> None:
    s1, s2, u1, u2 = 1100, 300, 200, 9
    first = messages_usage(
        server,
        {"system": [block(s1, "s1", ONE_HOUR)], "messages": [user(block(u2, "u0"))]},
    )
    assert cache_counts(first) == (u2, 0, s1)
    assert split(first) == (0, s1)

    # A = block 0 (read), B = block 1 (last 1 h write), C = block 2 (last breakpoint).
    body = {
        "system": [block(s1, "s1", ONE_HOUR), block(s2, "s2", ONE_HOUR)],
        "messages": [user(block(u1, "u1", FIVE_MIN), block(u2, "u2"))],
    }
    second = messages_usage(server, body)
    assert cache_counts(second) == (u2, s1, s2 + u1)
    assert split(second) == (u1, s2)

    # Everything up to C is stored now.
    third = messages_usage(server, body)
    assert cache_counts(third) == (u2, s1 + s2 + u1, 0)


def test_mixed_ttl_billing_without_a_hit(server: MockProviderServer) -> None:
    body = {
        "system": [block(1100, "fresh", ONE_HOUR)],
        "messages": [user(block(50, "a", FIVE_MIN), block(60, "b", FIVE_MIN), block(7, "c"))],
    }
    usage = messages_usage(server, body)
    assert cache_counts(usage) == (7, 0, 1210)
    assert split(usage) == (110, 1100)


def test_automatic_breakpoint_is_on_the_last_block(server: MockProviderServer) -> None:
    body = {
        "cache_control": ONE_HOUR,
        "system": text(1100, "auto-sys"),
        "messages": [user(block(12, "auto-q"))],
    }
    assert cache_counts(messages_usage(server, body)) == (0, 0, 1112)
    assert split(messages_usage(server, body)) == (0, 0)
    assert cache_counts(messages_usage(server, body)) == (0, 1112, 0)


def test_five_minute_entries_expire_and_hits_refresh_them(server: MockProviderServer, clock: FakeClock) -> None:
    body = {"system": [block(1100, "ttl5", FIVE_MIN)], "messages": [user(block(2, "q"))]}
    assert messages_usage(server, body)["cache_creation_input_tokens"] == 1100  # t = 0
    clock.t += 200
    assert messages_usage(server, body)["cache_read_input_tokens"] == 1100  # expiry -> 500
    clock.t += 250
    assert messages_usage(server, body)["cache_read_input_tokens"] == 1100  # expiry -> 750
    clock.t += 300
    assert cache_counts(messages_usage(server, body)) == (2, 0, 1100)  # expired: rewritten


def test_one_hour_entries_outlive_five_minutes(server: MockProviderServer, clock: FakeClock) -> None:
    body = {"system": [block(1100, "ttl1h", ONE_HOUR)], "messages": [user(block(2, "q"))]}
    messages_usage(server, body)
    clock.t += 3000
    assert messages_usage(server, body)["cache_read_input_tokens"] == 1100
    clock.t += 3600
    assert messages_usage(server, body)["cache_read_input_tokens"] == 0


# -- Anthropic: invalid markers, isolation, concurrency, admin -----------------------


def _status_and_error(server: MockProviderServer, body: dict[str, Any]) -> tuple[int, Any]:
    response = httpx2.post(server.url + "/v1/messages", json={"model": MODEL, "max_tokens": 8, **body})
    return response.status_code, response.json().get("error")


def test_more_than_four_breakpoints_is_a_400(server: MockProviderServer) -> None:
    body: dict[str, Any] = {
        "system": [block(10, f"s{i}", FIVE_MIN) for i in range(4)],
        "messages": [user(block(1, "q", FIVE_MIN))],
    }
    status, error = _status_and_error(server, body)
    assert status == 400
    assert error["type"] == "invalid_request_error"
    assert "maximum of 4" in error["message"]

    # The automatic breakpoint takes a slot of its own...
    auto = {**body, "messages": [user(block(1, "q"))], "cache_control": FIVE_MIN}
    assert _status_and_error(server, auto)[0] == 400
    # ...unless the last block already carries the same marker.
    four = {"system": body["system"][:3], "messages": body["messages"], "cache_control": FIVE_MIN}
    assert _status_and_error(server, four)[0] == 200

    with (
        anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0) as client,
        pytest.raises(anthropic.BadRequestError),
    ):
        client.messages.create(model=MODEL, max_tokens=8, system=body["system"], messages=body["messages"])


def test_one_hour_after_five_minutes_is_a_400(server: MockProviderServer) -> None:
    body: dict[str, Any] = {
        "system": [block(10, "a", FIVE_MIN)],
        "messages": [user(block(1, "q", ONE_HOUR))],
    }
    status, error = _status_and_error(server, body)
    assert status == 400 and "ttl='1h'" in error["message"]
    # Tools come first: a 5 min tool marker before a 1 h system marker is also a 400.
    tools = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": FIVE_MIN}]
    body = {"tools": tools, "system": [block(10, "b", ONE_HOUR)], "messages": [user(block(1, "q"))]}
    assert _status_and_error(server, body)[0] == 400
    # An automatic 1 h breakpoint after an explicit 5 min one, too.
    body = {
        "cache_control": ONE_HOUR,
        "system": [block(10, "c", FIVE_MIN)],
        "messages": [user(block(1, "q"))],
    }
    assert _status_and_error(server, body)[0] == 400


@pytest.mark.parametrize(
    "cache_control",
    [{"type": "persistent"}, {"type": "ephemeral", "ttl": "10m"}, "ephemeral"],
)
def test_malformed_cache_control_is_a_400(server: MockProviderServer, cache_control: Any) -> None:
    body = {"system": [{"type": "text", "text": "x", "cache_control": cache_control}]}
    assert _status_and_error(server, {**body, "messages": [user(block(1, "q"))]})[0] == 400


def test_automatic_ttl_conflicting_with_the_last_marker_is_a_400(
    server: MockProviderServer,
) -> None:
    body = {"cache_control": FIVE_MIN, "messages": [user(block(1, "q", ONE_HOUR))]}
    assert _status_and_error(server, body)[0] == 400


def test_cache_is_isolated_per_api_key_and_model(server: MockProviderServer) -> None:
    body = {"system": [block(1100, "shared", FIVE_MIN)], "messages": [user(block(2, "q"))]}
    assert messages_usage(server, body, key="workspace-1")["cache_creation_input_tokens"] == 1100
    assert messages_usage(server, body, key="workspace-2")["cache_read_input_tokens"] == 0
    assert messages_usage(server, body, key="workspace-1")["cache_read_input_tokens"] == 1100
    other_model = {**body, "model": "claude-opus-4-1"}
    assert messages_usage(server, other_model, key="workspace-1")["cache_read_input_tokens"] == 0


def test_concurrent_identical_requests_write_once(server: MockProviderServer) -> None:
    body = {"system": [block(1100, "fan-out", FIVE_MIN)], "messages": [user(block(2, "q"))]}
    results: list[tuple[int, int, int]] = []
    lock = threading.Lock()

    def call() -> None:
        counts = cache_counts(messages_usage(server, body))
        with lock:
            results.append(counts)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [(2, 0, 1100)] + [(2, 1100, 0)] * 7


def test_delete_cache_route_forgets_entries(server: MockProviderServer) -> None:
    body = {"system": [block(1100, "purge", FIVE_MIN)], "messages": [user(block(2, "q"))]}
    messages_usage(server, body)
    assert httpx2.delete(server.url + "/_mock/cache").json() == {"cleared": 1}
    assert messages_usage(server, body)["cache_read_input_tokens"] == 0
    assert server.state.clear_cache() == 1
    assert httpx2.delete(server.url + "/_mock/cache").json() == {"cleared": 0}
    assert server.state.records()[-1].path == "/v1/messages"  # admin routes not recorded


def test_cache_min_tokens_server_option() -> None:
    with MockProviderServer(cache_min_tokens=100) as mock:
        assert mock.state.cache_min_tokens == 100
        body = {"system": [block(150, "opt", FIVE_MIN)], "messages": [user(block(2, "q"))]}
        assert messages_usage(mock, body)["cache_creation_input_tokens"] == 150
        assert messages_usage(mock, body)["cache_read_input_tokens"] == 150


def test_cache_knobs_are_validated() -> None:
    state = MockState()
    assert (state.cache_min_tokens, state.openai_cache_min_tokens) == (1024, 1024)
    assert state.openai_cache_ttl_s == 600.0
    with pytest.raises(ValueError):
        state.cache_min_tokens = -1
    with pytest.raises(ValueError):
        state.openai_cache_ttl_s = 0
    with pytest.raises(ValueError):
        MockState(openai_cache_min_tokens=True)


# -- OpenAI ---------------------------------------------------------------------------


def _chat_body(system_tokens: int, question: str, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": text(system_tokens, "oa-system")},
            {"role": "user", "content": question},
        ],
        **extra,
    }


def test_chat_second_call_reports_cached_multiple_of_128(server: MockProviderServer) -> None:
    body = _chat_body(1100, "What is the refund window?", prompt_cache_key="tenant-a")
    total = 1100 + math.ceil(len("What is the refund window?") / 4)
    first = chat_usage(server, body)
    second = chat_usage(server, body)

    assert (first["prompt_tokens"], cached(first)) == (total, 0)
    assert second["prompt_tokens"] == total  # includes the cached tokens
    assert cached(second) == total - total % 128 == 1024
    assert second["prompt_tokens_details"]["cache_write_tokens"] == 0

    # A new question shares only the system segment: 1100 -> 1024.
    third = chat_usage(server, _chat_body(1100, "And shipping?", prompt_cache_key="tenant-a"))
    assert cached(third) == 1024


def test_chat_long_shared_prefix_rounds_down(server: MockProviderServer) -> None:
    chat_usage(server, _chat_body(1500, "first"))
    usage = chat_usage(server, _chat_body(1500, "second"))
    assert cached(usage) == 1408  # 1500 rounded down to a multiple of 128


def test_chat_prompt_cache_key_and_api_key_partition_the_cache(
    server: MockProviderServer,
) -> None:
    body = _chat_body(1100, "q", prompt_cache_key="tenant-a")
    chat_usage(server, body)
    assert cached(chat_usage(server, {**body, "prompt_cache_key": "tenant-b"})) == 0
    assert cached(chat_usage(server, {**body, "prompt_cache_key": None})) == 0
    assert cached(chat_usage(server, body, key="other-org")) == 0
    assert cached(chat_usage(server, body)) == 1024


def test_chat_below_1024_tokens_is_not_cached(server: MockProviderServer) -> None:
    body = _chat_body(900, "q")
    chat_usage(server, body)
    assert cached(chat_usage(server, body)) == 0
    server.state.openai_cache_min_tokens = 256
    assert cached(chat_usage(server, body)) == 896


def test_chat_tools_are_part_of_the_prefix(server: MockProviderServer) -> None:
    tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}]
    body = _chat_body(1100, "q", tools=tools)
    chat_usage(server, body)
    assert cached(chat_usage(server, body)) == 1024
    renamed = [{**tools[0], "function": {**tools[0]["function"], "name": "b"}}]
    assert cached(chat_usage(server, {**body, "tools": renamed})) == 0


def test_openai_entries_expire(server: MockProviderServer, clock: FakeClock) -> None:
    body = _chat_body(1100, "q")
    chat_usage(server, body)
    clock.t += 599
    assert cached(chat_usage(server, body)) == 1024  # renewed: expires at +1199
    clock.t += 599
    assert cached(chat_usage(server, body)) == 1024
    clock.t += 600
    assert cached(chat_usage(server, body)) == 0


def test_chat_sdk_non_stream_and_stream_with_usage(server: MockProviderServer) -> None:
    messages: Any = _chat_body(1200, "Summarise.")["messages"]
    with openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client:
        first = client.chat.completions.create(model=GPT, messages=messages, prompt_cache_key="sdk")
        chunks = list(
            client.chat.completions.create(
                model=GPT,
                messages=messages,
                prompt_cache_key="sdk",
                stream=True,
                stream_options={"include_usage": True},
            )
        )
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    final = chunks[-1].usage
    assert final is not None and final.prompt_tokens_details is not None
    assert final.prompt_tokens_details.cached_tokens == 1152  # 1203 -> 1152
    assert final.prompt_tokens == first.usage.prompt_tokens == 1203


def test_responses_non_stream_and_completed_event(server: MockProviderServer) -> None:
    instructions = text(1300, "oa-instructions")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client:
        first = client.responses.create(model="gpt-5-mini", instructions=instructions, input="Hi", prompt_cache_key="r")
        with client.responses.stream(
            model="gpt-5-mini", instructions=instructions, input="Hi again", prompt_cache_key="r"
        ) as stream:
            events = list(stream)
            final = stream.get_final_response()

    assert first.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    completed = [event for event in events if event.type == "response.completed"]
    assert len(completed) == 1
    usage = completed[0].response.usage
    assert usage is not None and final.usage is not None
    assert usage.input_tokens_details.cached_tokens == 1280  # the instructions: 1300 -> 1280
    assert usage.input_tokens == 1300 + math.ceil(len("Hi again") / 4)
    assert final.usage.input_tokens_details.cached_tokens == 1280
    assert usage.input_tokens_details.cache_write_tokens == 0


def test_embeddings_are_never_cached(server: MockProviderServer) -> None:
    body = {"model": "text-embedding-3-small", "input": text(1500, "embed")}
    for _ in range(2):
        usage = httpx2.post(server.url + "/v1/embeddings", json=body).json()["usage"]
        assert usage == {"prompt_tokens": 1500, "total_tokens": 1500}
    assert server.state.cache_entries() == 0


# -- pure rules -----------------------------------------------------------------------


def test_resolve_breakpoints_rules() -> None:
    five, hour = Breakpoint(1, "5m"), Breakpoint(0, "1h")
    assert resolve_breakpoints([five, hour], None, 3) == (hour, five)
    assert resolve_breakpoints([five], "5m", 2) == (five,)  # same TTL on the last block
    assert resolve_breakpoints([], "1h", 2) == (Breakpoint(1, "1h"),)
    assert resolve_breakpoints([], "5m", 0) == ()
    with pytest.raises(BreakpointError):
        resolve_breakpoints([five], "1h", 2)
    with pytest.raises(BreakpointError):
        resolve_breakpoints([Breakpoint(i, "5m") for i in range(5)], None, 5)
    with pytest.raises(BreakpointError):
        resolve_breakpoints([Breakpoint(0, "5m"), Breakpoint(1, "1h")], None, 2)


def test_read_position_lookback_boundary() -> None:
    assert read_position([Breakpoint(20, "5m")], {1}) == 1
    assert read_position([Breakpoint(21, "5m")], {1}) is None
    assert read_position([Breakpoint(21, "5m"), Breakpoint(5, "5m")], {1, 3}) == 3
    assert read_position([Breakpoint(30, "5m")], {12, 25}) == 25  # nearest first


def test_plan_and_bill_anthropic() -> None:
    tokens = prefix_totals([1000, 100, 50, 10, 5])  # 1000, 1100, 1150, 1160, 1165
    bps = (Breakpoint(0, "1h"), Breakpoint(1, "1h"), Breakpoint(3, "5m"))
    plan = plan_anthropic(tokens, bps, live=frozenset({0}), min_tokens=1000)
    assert plan.read_position == 0
    assert plan.writes == bps[1:]
    assert plan.usage == CacheUsage(read_tokens=1000, write_5m_tokens=60, write_1h_tokens=100)
    # Below the minimum: inert, even when stored.
    assert plan_anthropic(tokens, bps, frozenset({0}), 2000).usage == CacheUsage()
    # Only 5 min writes after a 1 h hit: C - A.
    five_only = bill_anthropic(tokens, 1, (Breakpoint(4, "5m"),))
    assert five_only == CacheUsage(read_tokens=1100, write_5m_tokens=65)
    # The last breakpoint is 1 h: no 5 min writes.
    assert bill_anthropic(tokens, None, (Breakpoint(2, "1h"),)) == CacheUsage(write_1h_tokens=1150)


def test_openai_cached_tokens_rounding() -> None:
    assert openai_cached_tokens(1023) == 0
    assert openai_cached_tokens(1024) == 1024
    assert openai_cached_tokens(1151) == 1024
    assert openai_cached_tokens(1152) == 1152
    assert openai_cached_tokens(0, min_tokens=0) == 0


def test_cache_store_refresh_and_expiry() -> None:
    store = CacheStore()
    store.put(b"k", 300.0, now=0.0)
    assert store.is_live(b"k", 299.9) and not store.is_live(b"k", 300.0)
    store.refresh(b"k", 200.0)
    assert store.is_live(b"k", 499.0) and not store.is_live(b"k", 500.0)
    store.refresh(b"k", 600.0)  # expired: no resurrection
    assert not store.is_live(b"k", 600.0)
    assert store.sweep(600.0) == 1 and len(store) == 0
