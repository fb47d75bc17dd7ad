"""OpenAI Responses: bytes in, values out."""

from __future__ import annotations

import json

from gateway.carriers import CARRIERS
from tests.carriers.helpers import LIMITS, covers, fold, units


def test_openai_responses_request_units() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "Reply in one sentence.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather "},
                    {"type": "input_text", "text": "in Oslo?"},
                    {"type": "input_image", "image_url": "https://x/y.png"},
                ],
            },
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c":4}'},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    }
    parsed = CARRIERS["openai.responses"].parse_request(json.dumps(body).encode(), LIMITS)
    found = units(parsed)
    assert "Reply in one sentence." in found["/instructions"]
    assert "Weather in Oslo?" in found["/input/0/content"]
    assert covers(found, "/input/1/arguments", "Oslo") and covers(found, "/input/2/output", "4")
    assert set(parsed.opaque) == {"/input/0/content/2", "/input/3/encrypted_content"}


def test_responses_stream_folds_deltas() -> None:
    folded = fold("openai.responses", "openai_responses_stream.sse")
    found = units(folded)
    assert folded.complete and folded.response_id == "resp_68a1"
    assert "It is 4 °C." in found["/output/0/content/0/text"]
    assert '{"city":"Oslo"}' in found["/output/1/arguments"]
    assert folded.usage is not None and folded.usage.fields["input_tokens"] == 2100


RESPONSES = CARRIERS["openai.responses"]


def test_schema_facts_and_usage() -> None:
    assert (RESPONSES.short_name, RESPONSES.route, RESPONSES.cache_style) == ("responses", "/v1/responses", "key")
    assert RESPONSES.requested_output({"max_output_tokens": 33}) == 33
    counts = RESPONSES.usage_counts(
        {
            "input_tokens": 10,
            "output_tokens": 4,
            "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 1},
        }
    )
    assert (counts["input_total"].value, counts["input_uncached"].value, counts["cache_read"].value) == (10, 2, 8)
    layout = RESPONSES.prompt_layout(
        {
            "instructions": "be brief",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "function_call_output", "call_id": "c", "output": "42"},
            ],
        }
    )
    assert [(p.region, p.kind) for p in layout.parts] == [
        ("system", "text"),
        ("message", "input_text"),
        ("message", "function_call_output"),
    ]
