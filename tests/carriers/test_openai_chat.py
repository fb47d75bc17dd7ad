"""OpenAI Chat Completions: bytes in, values out."""

from __future__ import annotations

import json

import pytest

from gateway.carriers import CARRIERS, sse
from tests.carriers.helpers import FIX, LIMITS, covers, fold, units


def test_openai_chat_request_units() -> None:
    parsed = CARRIERS["openai.chat"].parse_request((FIX / "openai_chat_request_tools.json").read_bytes(), LIMITS)
    found = units(parsed)
    assert parsed.model == "gpt-4.1" and parsed.stream is False
    assert "Answer briefly." in found["/messages/0/content"]
    assert "Price of SKU A-1?" in found["/messages/1/content"]  # text parts joined
    assert covers(found, "/messages/2/tool_calls/0/function/arguments", "A-1")
    assert covers(found, "/messages/2/tool_calls/0/function/arguments", "sku")
    assert "Price by SKU" in found["/tools/0/function/description"]
    assert covers(found, "/messages/3/content", "12.5")
    assert "T-99" in found["/metadata/ticket"] and "ticket" in found["/metadata"]  # keys too
    assert parsed.opaque == ("/messages/1/content/2",)
    assert parsed.duplicate_keys == ()


def test_openai_chat_stream_folds_parallel_tool_calls() -> None:
    folded = fold("openai.chat", "openai_chat_stream_tools.sse")
    found = units(folded)
    assert folded.complete and folded.response_id == "chatcmpl-9abc"
    assert '{"sku":"A-1"}' in found["/choices/0/message/tool_calls/0/function/arguments"]
    assert '{"sku":"B-2"}' in found["/choices/0/message/tool_calls/1/function/arguments"]
    assert covers(found, "/choices/0/message/tool_calls/1/function/arguments", "B-2")
    assert folded.usage is not None and folded.usage.fields["prompt_tokens"] == 1320


def test_stream_without_terminal_event_is_incomplete() -> None:
    raw = (FIX / "openai_chat_stream_tools.sse").read_bytes().replace(b"data: [DONE]\n\n", b"")
    events, _ = sse.parse_all(raw)
    folded = CARRIERS["openai.chat"].fold_stream(events, LIMITS)
    assert not folded.complete and folded.incomplete_reason == "response_incomplete"


CHAT = CARRIERS["openai.chat"]


def test_schema_facts() -> None:
    assert (CHAT.short_name, CHAT.route, CHAT.path, CHAT.dialect.value, CHAT.cache_style) == (
        "chat",
        "/v1/chat/completions",
        "/chat/completions",
        "openai",
        "key",
    )
    assert CHAT.requested_output({"max_completion_tokens": 50, "max_tokens": 9}) == 50
    assert CHAT.requested_output({"max_tokens": 9}) == 9 and CHAT.requested_output({}) is None


def test_usage_counts_split_cached_input_out_of_the_total() -> None:
    counts = CHAT.usage_counts(
        {
            "prompt_tokens": 100,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 60},
            "completion_tokens_details": {"reasoning_tokens": 3},
        }
    )
    assert counts["input_total"].value == 100 and counts["cache_read"].value == 60
    assert counts["input_uncached"].value is None  # cache writes not reported: the rest is unknown
    assert counts["output"].value == 7 and counts["reasoning"].value == 3
    assert all(c.value is None for c in CHAT.usage_counts(None).values())


@pytest.mark.parametrize(
    "body,expected",
    [
        ({"model": "m", "stream": True, "messages": []}, {"include_usage": True}),
        ({"model": "m", "stream": True, "stream_options": {}, "messages": []}, {"include_usage": True}),
        (
            {"model": "m", "stream": True, "stream_options": {"include_usage": False}, "messages": []},
            {"include_usage": True},
        ),
    ],
)
def test_usage_edits_ask_a_stream_for_usage_and_the_release_drops_it(
    body: dict[str, object], expected: dict[str, object]
) -> None:
    from gateway.carriers import jsonspan

    text = json.dumps(body)
    edits, injected = CHAT.usage_edits(text, body)
    assert injected and json.loads(jsonspan.apply(text, edits))["stream_options"] == expected
    events = [
        sse.SSEEvent(None, '{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}'),
        sse.SSEEvent(None, '{"id":"c","choices":[],"usage":{"prompt_tokens":1}}'),
        sse.SSEEvent(None, "[DONE]"),
    ]
    released = CHAT.released_events(events, injected)
    assert [e.data for e in released] == ['{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}]}', "[DONE]"]
    assert CHAT.released_events(events, False) == events
    asked = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "messages": []}
    assert CHAT.usage_edits(json.dumps(asked), asked) == ([], False)


def test_prompt_layout_in_render_order() -> None:
    doc = {
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": {}}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"},
        ],
    }
    parts = CHAT.prompt_layout(doc).parts
    assert [(p.region, p.role, p.kind) for p in parts] == [
        ("tools", None, "tool"),
        ("system", "system", "text"),
        ("message", "user", "text"),
        ("message", "user", "image_url"),
        ("message", "assistant", "tool_calls"),
        ("message", "tool", "text"),
        ("message", "tool", "tool_result"),
    ]
    assert parts[1].path == ("messages", 0, "content") and parts[1].text == "rules"


def test_released_events_read_only_the_chunks_that_can_name_a_usage() -> None:
    """The usage-only chunk is dropped however its key is written (an escaped key included);
    a chunk whose last member is `"usage":null` loses that member; other chunks, which
    cannot name a usage, pass untouched (and are not parsed again)."""
    escaped = '{"id":"c","choices":[],"us\\u0061ge":{"prompt_tokens":1}}'
    spaced = '{"id": "c", "choices": [], "usage": {"prompt_tokens": 1}}'
    content = '{"id":"c","choices":[{"index":0,"delta":{"content":"usage"}}]}'
    kept_usage = '{"id":"c","choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":1}}'
    events = [sse.SSEEvent(None, d) for d in (escaped, spaced, content, kept_usage, "not json", "[DONE]")]
    released = [e.data for e in CHAT.released_events(events, True)]
    assert released == [content, kept_usage, "not json", "[DONE]"]
