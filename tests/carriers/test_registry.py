"""What every carrier shares, and the registry routes, names and CLI choices come from: bytes in, values out."""

from __future__ import annotations

import json

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.jsonraw import JsonError
from tests.carriers.helpers import LIMITS, covers, units


@pytest.mark.parametrize(
    "carrier,body",
    [
        ("openai.chat", b'{"model":"m"}'),
        ("openai.chat", b'{"model":"m","messages":[],"stream":"yes"}'),
        ("anthropic.messages", b'{"model":"m","messages":[1]}'),
        ("openai.embeddings", b'{"model":"m","input":[{"x":1}]}'),
        ("openai.embeddings", b'{"model":"m","input":"x","encoding_format":"int8"}'),
        ("openai.responses", b'{"model":"m","input":5}'),
    ],
)
def test_unsupported_shapes(carrier: str, body: bytes) -> None:
    with pytest.raises(JsonError) as info:
        CARRIERS[carrier].parse_request(body, LIMITS)
    assert info.value.reason == "unsupported_carrier"


@pytest.mark.parametrize("name", ["openai.chat", "openai.responses", "anthropic.messages"])
def test_stream_error_event_is_valid_sse(name: str) -> None:
    raw = CARRIERS[name].stream_error_event("response_blocked", ["secret_value"], "blocked", "permission_error")
    events, clean = sse.parse_all(raw)
    assert clean and len(events) == 1
    payload = json.loads(events[0].data)
    assert "response_blocked" in json.dumps(payload) and "secret_value" in json.dumps(payload)


_ERROR_MID_STREAM = {
    "openai.chat": (
        'data: {"choices":[{"index":0,"delta":{"content":"half"}}]}\n\n'
        'data: {"error":{"message":"m","type":"server_error"}}\n\n'
        "data: [DONE]\n\n"
    ),
    "anthropic.messages": (
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        '"content_block":{"type":"text","text":""}}\n\n'
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        '"delta":{"type":"text_delta","text":"half"}}\n\n'
        'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"m"}}\n\n'
    ),
    "openai.responses": (
        'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"half"}\n\n'
        'event: response.failed\ndata: {"type":"response.failed","response":{"id":"r","status":"failed"}}\n\n'
    ),
}


@pytest.mark.parametrize("name", sorted(_ERROR_MID_STREAM))
def test_error_event_mid_stream_is_not_complete(name: str) -> None:
    events, clean = sse.parse_all(_ERROR_MID_STREAM[name].encode())
    folded = CARRIERS[name].fold_stream(events, LIMITS)
    assert clean and folded.is_error
    assert not folded.complete and folded.incomplete_reason == "response_incomplete"


def test_response_with_duplicate_keys_is_flagged() -> None:
    folded = CARRIERS["openai.chat"].parse_response(b'{"id":"x","id":"y","choices":[]}', LIMITS)
    assert folded.duplicate_keys == ("",)


def test_event_json_with_duplicate_keys_in_tool_args_is_flagged() -> None:
    args = '{"k":"a","k":"b"}'
    body = {
        "model": "m",
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}],
            }
        ],
    }
    parsed = CARRIERS["openai.chat"].parse_request(json.dumps(body).encode(), LIMITS)
    assert parsed.duplicate_keys == ("/messages/0/tool_calls/0/function/arguments",)
    found = units(parsed)
    assert covers(found, "/messages/0/tool_calls/0/function/arguments", '"k":"a"')
    assert covers(found, "/messages/0/tool_calls/0/function/arguments", '"k":"b"')


def test_routes_short_names_and_cli_choices_come_from_the_registry() -> None:
    from gateway.carriers import ROUTES, SHORT_NAMES
    from gateway.cli import build_parser

    assert {c.route: name for name, c in CARRIERS.items()} == ROUTES
    # Each short name belongs to the first carrier that has it; a later one with the same
    # name is another endpoint of that schema (token counting) granted by the same entry.
    first: dict[str, str] = {}
    for name, c in CARRIERS.items():
        first.setdefault(c.short_name, name)
    assert first == SHORT_NAMES
    assert SHORT_NAMES["messages"] == "anthropic.messages"
    assert CARRIERS["anthropic.count_tokens"].short_name == "messages"
    parser = build_parser()
    args = parser.parse_args(
        [
            "profiles",
            "new",
            "--id",
            "x",
            "--provider",
            "openai",
            "--base-url",
            "https://a",
            "--models",
            "m",
            "--credential",
            "env:X",
            "--sign-key",
            "k",
            "--carriers",
            *SHORT_NAMES,
        ]
    )
    assert sorted(args.carriers) == sorted(SHORT_NAMES)
