"""Carriers, bytes in, values out: every text unit with its pointer, opaque parts, folding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest
from gateway.carriers.jsonraw import JsonError

FIX = Path(__file__).parent / "fixtures"
LIMITS = CarrierLimits()


def _units(parsed: ParsedRequest | FoldedResponse) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for unit in parsed.units:
        out.setdefault(unit.pointer, set()).add(unit.text)
    return out


def _covers(units: dict[str, set[str]], pointer: str, text: str) -> bool:
    """Some unit at `pointer` holds `text` (JSON inside a string is inspected as that
    string when it has no escapes, and as one joined embedded unit when it does)."""
    return any(text in unit for unit in units.get(pointer, ()))


def _fold(carrier: str, fixture: str) -> FoldedResponse:
    events, clean = sse.parse_all((FIX / fixture).read_bytes())
    assert clean
    return CARRIERS[carrier].fold_stream(events, LIMITS)


def test_openai_chat_request_units() -> None:
    parsed = CARRIERS["openai.chat"].parse_request((FIX / "openai_chat_request_tools.json").read_bytes(), LIMITS)
    units = _units(parsed)
    assert parsed.model == "gpt-4.1" and parsed.stream is False
    assert "Answer briefly." in units["/messages/0/content"]
    assert "Price of SKU A-1?" in units["/messages/1/content"]  # text parts joined
    assert _covers(units, "/messages/2/tool_calls/0/function/arguments", "A-1")
    assert _covers(units, "/messages/2/tool_calls/0/function/arguments", "sku")
    assert "Price by SKU" in units["/tools/0/function/description"]
    assert _covers(units, "/messages/3/content", "12.5")
    assert "T-99" in units["/metadata/ticket"] and "ticket" in units["/metadata"]  # keys too
    assert parsed.opaque == ("/messages/1/content/2",)
    assert parsed.duplicate_keys == ()


def test_openai_responses_request_units() -> None:
    body = {"model": "gpt-5", "instructions": "Reply in one sentence.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Oslo?"},
                                     {"type": "input_image", "image_url": "https://x/y.png"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp_c\":4}"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}
    parsed = CARRIERS["openai.responses"].parse_request(json.dumps(body).encode(), LIMITS)
    units = _units(parsed)
    assert "Reply in one sentence." in units["/instructions"]
    assert "Weather in Oslo?" in units["/input/0/content"]
    assert _covers(units, "/input/1/arguments", "Oslo") and _covers(units, "/input/2/output", "4")
    assert set(parsed.opaque) == {"/input/0/content/2", "/input/3/encrypted_content"}


@pytest.mark.parametrize("inputs,opaque", [
    ("one string", ()),
    (["a", "b"], ()),
    ([1, 2, 3], ("/input",)),
    ([[1, 2], [3]], ("/input/0", "/input/1")),
])
def test_openai_embeddings_inputs(inputs: object, opaque: tuple[str, ...]) -> None:
    parsed = CARRIERS["openai.embeddings"].parse_request(
        json.dumps({"model": "text-embedding-3-small", "input": inputs, "encoding_format": "base64"}).encode(), LIMITS)
    assert parsed.opaque == opaque
    if isinstance(inputs, str):
        assert _units(parsed)["/input"] == {"one string"}


def test_openai_embeddings_response_skips_float_vectors_and_reads_base64_ones() -> None:
    floats = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25e-3]}],
                         "model": "m", "usage": {"prompt_tokens": 2, "total_tokens": 2}}).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(floats, LIMITS)
    assert folded.complete and not folded.raw_scan
    assert all(u.text not in ("0.5", "-1.25e-3") for u in folded.units)
    assert folded.usage is not None and folded.usage.fields["prompt_tokens"] == 2
    # a base64 vector is a unit: the engine decodes it and scans the bytes
    b64 = json.dumps({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": "AAAAPw=="}],
                      "model": "m"}).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(b64, LIMITS)
    assert folded.complete and not folded.raw_scan
    assert _units(folded)["/data/0/embedding"] == {"AAAAPw=="}


@pytest.mark.parametrize("data", ['"text"', '{"a": "b"}', '[{"embedding": "not base64!"}]', '[{"embedding": {"x": 1}}]',
                                  '[{"embedding": [1, "two"]}]', "[]", '[{"index": 0}]'])
def test_openai_embeddings_response_of_unexpected_shape_is_read_in_full(data: str) -> None:
    raw = ('{"object":"list","model":"m","data":%s}' % data).encode()
    folded = CARRIERS["openai.embeddings"].parse_response(raw, LIMITS)
    assert folded.complete and folded.raw_scan


def test_anthropic_request_units() -> None:
    parsed = CARRIERS["anthropic.messages"].parse_request((FIX / "anthropic_request.json").read_bytes(), LIMITS)
    units = _units(parsed)
    assert "Policy part one. Policy part two." in units["/system"]
    assert "42" in units["/messages/1/content/0/input/id"]
    assert "status=shipped" in units["/messages/2/content/0/content/0/text"]
    assert "plain text doc" in units["/messages/0/content/1/source/data"]
    assert set(parsed.opaque) == {"/messages/0/content/0", "/messages/2/content/0/content/1"}


@pytest.mark.parametrize("carrier,body", [
    ("openai.chat", b'{"model":"m"}'),
    ("openai.chat", b'{"model":"m","messages":[],"stream":"yes"}'),
    ("anthropic.messages", b'{"model":"m","messages":[1]}'),
    ("openai.embeddings", b'{"model":"m","input":[{"x":1}]}'),
    ("openai.embeddings", b'{"model":"m","input":"x","encoding_format":"int8"}'),
    ("openai.responses", b'{"model":"m","input":5}'),
])
def test_unsupported_shapes(carrier: str, body: bytes) -> None:
    with pytest.raises(JsonError) as info:
        CARRIERS[carrier].parse_request(body, LIMITS)
    assert info.value.reason == "unsupported_carrier"


def test_openai_chat_stream_folds_parallel_tool_calls() -> None:
    folded = _fold("openai.chat", "openai_chat_stream_tools.sse")
    units = _units(folded)
    assert folded.complete and folded.response_id == "chatcmpl-9abc"
    assert '{"sku":"A-1"}' in units["/choices/0/message/tool_calls/0/function/arguments"]
    assert '{"sku":"B-2"}' in units["/choices/0/message/tool_calls/1/function/arguments"]
    assert _covers(units, "/choices/0/message/tool_calls/1/function/arguments", "B-2")
    assert folded.usage is not None and folded.usage.fields["prompt_tokens"] == 1320


def test_stream_without_terminal_event_is_incomplete() -> None:
    raw = (FIX / "openai_chat_stream_tools.sse").read_bytes().replace(b"data: [DONE]\n\n", b"")
    events, _ = sse.parse_all(raw)
    folded = CARRIERS["openai.chat"].fold_stream(events, LIMITS)
    assert not folded.complete and folded.incomplete_reason == "response_incomplete"


def test_anthropic_stream_folds_blocks_and_usage() -> None:
    folded = _fold("anthropic.messages", "anthropic_stream_tool_use.sse")
    units = _units(folded)
    assert folded.complete and folded.response_id == "msg_01X"
    assert "Checking the order." in units["/content/0/text"]
    assert '{"id": "42"}' in units["/content/1/input"] and _covers(units, "/content/1/input", "42")
    assert folded.usage is not None
    assert folded.usage.fields["input_tokens"] == 37 and folded.usage.fields["output_tokens"] == 29
    assert folded.usage.fields["cache_read_input_tokens"] == 5210


def test_responses_stream_folds_deltas() -> None:
    folded = _fold("openai.responses", "openai_responses_stream.sse")
    units = _units(folded)
    assert folded.complete and folded.response_id == "resp_68a1"
    assert "It is 4 °C." in units["/output/0/content/0/text"]
    assert '{"city":"Oslo"}' in units["/output/1/arguments"]
    assert folded.usage is not None and folded.usage.fields["input_tokens"] == 2100


@pytest.mark.parametrize("name", ["openai.chat", "openai.responses", "anthropic.messages"])
def test_stream_error_event_is_valid_sse(name: str) -> None:
    raw = CARRIERS[name].stream_error_event("response_blocked", ["secret_value"], "blocked", "permission_error")
    events, clean = sse.parse_all(raw)
    assert clean and len(events) == 1
    payload = json.loads(events[0].data)
    assert "response_blocked" in json.dumps(payload) and "secret_value" in json.dumps(payload)


def test_response_with_duplicate_keys_is_flagged() -> None:
    folded = CARRIERS["openai.chat"].parse_response(b'{"id":"x","id":"y","choices":[]}', LIMITS)
    assert folded.duplicate_keys == ("",)


def test_event_json_with_duplicate_keys_in_tool_args_is_flagged() -> None:
    args = '{"k":"a","k":"b"}'
    body = {"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]}]}
    parsed = CARRIERS["openai.chat"].parse_request(json.dumps(body).encode(), LIMITS)
    assert parsed.duplicate_keys == ("/messages/0/tool_calls/0/function/arguments",)
    units = _units(parsed)
    assert _covers(units, "/messages/0/tool_calls/0/function/arguments", '"k":"a"')
    assert _covers(units, "/messages/0/tool_calls/0/function/arguments", '"k":"b"')
