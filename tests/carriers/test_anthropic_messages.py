"""Anthropic Messages: bytes in, values out."""

from __future__ import annotations

import json

from gateway.carriers import CARRIERS
from tests.carriers.helpers import FIX, LIMITS, covers, fold, units


def test_anthropic_request_units() -> None:
    parsed = CARRIERS["anthropic.messages"].parse_request((FIX / "anthropic_request.json").read_bytes(), LIMITS)
    found = units(parsed)
    assert "Policy part one. Policy part two." in found["/system"]
    assert "42" in found["/messages/1/content/0/input/id"]
    assert "status=shipped" in found["/messages/2/content/0/content/0/text"]
    assert "plain text doc" in found["/messages/0/content/1/source/data"]
    assert set(parsed.opaque) == {"/messages/0/content/0", "/messages/2/content/0/content/1"}


def test_anthropic_stream_folds_blocks_and_usage() -> None:
    folded = fold("anthropic.messages", "anthropic_stream_tool_use.sse")
    found = units(folded)
    assert folded.complete and folded.response_id == "msg_01X"
    assert "Checking the order." in found["/content/0/text"]
    assert '{"id": "42"}' in found["/content/1/input"] and covers(found, "/content/1/input", "42")
    assert folded.usage is not None
    assert folded.usage.fields["input_tokens"] == 37 and folded.usage.fields["output_tokens"] == 29
    assert folded.usage.fields["cache_read_input_tokens"] == 5210


MESSAGES = CARRIERS["anthropic.messages"]


def test_schema_facts() -> None:
    assert (MESSAGES.short_name, MESSAGES.route, MESSAGES.path, MESSAGES.dialect.value, MESSAGES.cache_style) == (
        "messages",
        "/v1/messages",
        "/v1/messages",
        "anthropic",
        "markers",
    )
    assert MESSAGES.requested_output({"max_tokens": 64}) == 64 and MESSAGES.requested_output({}) is None
    assert MESSAGES.usage_edits("{}", {"stream": True}) == ([], False)


def test_usage_counts_add_cache_parts_to_the_input() -> None:
    counts = MESSAGES.usage_counts(
        {
            "input_tokens": 5,
            "cache_read_input_tokens": 90,
            "cache_creation_input_tokens": 5,
            "cache_creation": {"ephemeral_5m_input_tokens": 5, "ephemeral_1h_input_tokens": 0},
            "output_tokens": 12,
        }
    )
    assert counts["input_total"].value == 100 and counts["input_uncached"].value == 5
    assert counts["cache_write_5m"].value == 5 and counts["cache_write_1h"].value == 0
    assert counts["reasoning"].value is None


def test_prompt_layout_and_markers() -> None:
    doc = {
        "tools": [{"name": "f", "input_schema": {}}],
        "system": "policy",
        "cache_control": {"type": "ephemeral"},
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "q", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            },
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t"}, {"type": "text", "text": "a"}]},
        ],
    }
    layout = MESSAGES.prompt_layout(doc)
    assert layout.automatic_marker == "5m"
    assert [(p.region, p.kind, p.marker, p.markable) for p in layout.parts] == [
        ("tools", "tool", None, True),
        ("system", "text", None, True),
        ("message", "text", "1h", False),  # the client decided here: nothing is added beside it
        ("message", "thinking", None, False),
        ("message", "text", None, True),
    ]
    text = json.dumps(doc)
    from gateway.carriers import jsonspan

    edited = json.loads(jsonspan.apply(text, [MESSAGES.marker_edit(text, layout.parts[1], "1h")]))
    assert edited["system"] == [{"type": "text", "text": "policy", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    edited = json.loads(jsonspan.apply(text, [MESSAGES.marker_edit(text, layout.parts[0], "5m")]))
    assert edited["tools"][0]["cache_control"] == {"type": "ephemeral"}
