"""A stream the official SDKs rebuild differently from the gateway's fold is not released.

The fold joins each field's deltas by their indexes; the SDKs rebuild a message their own
way: the Anthropic SDK starts the content with what `message_start` holds, skips events
with no `event:` name and deltas of a type it does not know; the OpenAI chat helper files
choices and tool calls by their place in its lists (a new index goes to the end) and skips
chunks whose `object` is not a chunk's; the Responses helper extends the text an item or a
part starts with and only takes `*.delta` events. Each of these let a value reach an SDK
user whole while the fold read it in two pieces (an outside review found them). Such a
stream is refused whole, buffered or windowed; the well-formed streams the providers send
(several choices, several tool calls, Azure's filter chunks) still pass."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, anthropic_client, openai_client, post_json, windowed_profiles

SECRET = "wg-one-reading-Zp4471qX"
HEAD, TAIL = SECRET[:9], SECRET[9:]
AWS = "AKIAQYLPMN5HFIQR7XZA"  # a catalogue credential: no configured value, no joined read


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("stream-one-reading", secrets_=[SECRET]) as started:
        yield started


@pytest.fixture(scope="module")
def windowed(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("stream-one-reading-w", secrets_=[SECRET], profiles=windowed_profiles(mock.url)) as started:
        yield started


def _event(name: str | None, data: dict[str, Any]) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n"


# --- Anthropic ---------------------------------------------------------------------------


def _a(kind: str, named: bool = True, **obj: Any) -> str:
    return _event(kind if named else None, {"type": kind, **obj})


def _anthropic(start: list[dict[str, Any]], *middle: str) -> list[str]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test-model",
        "content": start,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 1},
    }
    return [
        _a("message_start", message=message),
        _a("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        *middle,
        _a("content_block_stop", index=0),
        _a("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 5}),
        _a("message_stop"),
    ]


def _text(text: str, kind: str = "text_delta", named: bool = True) -> str:
    return _a("content_block_delta", named, index=0, delta={"type": kind, "text": text})


# --- OpenAI chat ---------------------------------------------------------------------------


def _chunk(*choices: dict[str, Any], obj: str = "chat.completion.chunk") -> str:
    chunk = {"id": "chatcmpl-1", "object": obj, "created": 1, "model": "gpt-4.1", "choices": list(choices)}
    return _event(None, chunk)


def _choice(index: int, **delta: Any) -> dict[str, Any]:
    return {"index": index, "delta": delta, "finish_reason": None}


def _call(index: int, arguments: str, name: str | None = None) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if name is not None:
        call |= {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}
    return call


def _chat(*chunks: str) -> list[str]:
    return [*chunks, _chunk({"index": 0, "delta": {}, "finish_reason": "stop"}), "data: [DONE]\n\n"]


# --- OpenAI Responses ----------------------------------------------------------------------


def _response(output: list[dict[str, Any]], status: str) -> dict[str, Any]:
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    return {"id": "resp_1", "object": "response", "created_at": 1, "status": status, "model": "gpt-5"} | {
        "output": output,
        "usage": usage,
    }


def _item(*texts: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": content}


def _r(kind: str, **obj: Any) -> str:
    return _event(kind, {"type": kind, **obj})


def _delta(text: str, kind: str = "response.output_text.delta") -> str:
    return _r(kind, item_id="msg_1", output_index=0, content_index=0, delta=text)


def _responses(
    created: list[dict[str, Any]] | None = None,
    item: dict[str, Any] | None = None,
    part: str = "",
    *deltas: str,
) -> list[str]:
    return [
        _r("response.created", response=_response(created or [], "in_progress")),
        _r("response.output_item.added", output_index=0, item=item or _item()),
        _r(
            "response.content_part.added",
            item_id="msg_1",
            output_index=0,
            content_index=0,
            part={"type": "output_text", "text": part, "annotations": []},
        ),
        *deltas,
        _r("response.output_item.done", output_index=0, item=_item("ok")),
        _r("response.completed", response=_response([_item("ok")], "completed")),
    ]


_CALL_ITEM = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": HEAD}

REFUSED: dict[str, tuple[str, list[str]]] = {
    "anthropic: message_start already holds the start of the text": (
        "/v1/messages",
        _anthropic([{"type": "text", "text": HEAD}], _text(TAIL)),
    ),
    "anthropic: message_start holds half a catalogue credential": (
        "/v1/messages",
        _anthropic([{"type": "text", "text": AWS[:8]}], _text(AWS[8:])),
    ),
    "anthropic: an event with no name between the halves": (
        "/v1/messages",
        _anthropic([], _text(HEAD), _text("~", named=False), _text(TAIL)),
    ),
    "anthropic: a delta of a type the SDK does not know between the halves": (
        "/v1/messages",
        _anthropic([], _text(HEAD), _text("~", kind="annotation_delta"), _text(TAIL)),
    ),
    "chat: a chunk the SDK skips (object not a chunk's) between the halves": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", content=HEAD)),
            _chunk(_choice(0, content="~"), obj=""),
            _chunk(_choice(0, content=TAIL)),
        ),
    ),
    "chat: a choice index past the next one (the SDK appends it)": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", content="Hello")),
            _chunk(_choice(2, content=HEAD), _choice(2, content="x")),
            _chunk(_choice(1, content=TAIL)),
        ),
    ),
    "chat: a tool call index past the next one": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", tool_calls=[_call(2, HEAD, "f"), _call(2, "x")])),
            _chunk(_choice(0, tool_calls=[_call(0, TAIL)])),
        ),
    ),
    "chat: the first chunk's choices out of order": (
        "/v1/chat/completions",
        _chat(_chunk(_choice(1, content=HEAD), _choice(0, content="x")), _chunk(_choice(0, content=TAIL))),
    ),
    "chat: a list the SDK merges by index": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", parts=[{"index": 0, "text": HEAD}, {"index": 1, "text": "x"}])),
            _chunk(_choice(0, parts=[{"index": 0, "text": TAIL}])),
        ),
    ),
    "responses: the created response's output already holds text": (
        "/v1/responses",
        _responses([_item(HEAD)], None, "", _delta(TAIL)),
    ),
    "responses: an added item already holds text": ("/v1/responses", _responses(None, _item(HEAD), "", _delta(TAIL))),
    "responses: an added part already holds text": ("/v1/responses", _responses(None, None, HEAD, _delta(TAIL))),
    "responses: an added call already holds arguments": (
        "/v1/responses",
        [
            _r("response.created", response=_response([], "in_progress")),
            _r("response.output_item.added", output_index=0, item=_CALL_ITEM),
            _r("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=TAIL),
            _r("response.completed", response=_response([], "completed")),
        ],
    ),
    "responses: a delta in an event that is not a delta's": (
        "/v1/responses",
        _responses(None, None, "", _delta(HEAD), _delta("~", kind="response.output_text"), _delta(TAIL)),
    ),
}

PASSED: dict[str, tuple[str, list[str]]] = {
    "chat: two choices, interleaved": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", content="one "), _choice(1, role="assistant", content="two ")),
            _chunk(_choice(1, content="more")),
            _chunk(_choice(0, content="more")),
        ),
    ),
    "chat: two tool calls, the first extended after the second started": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", tool_calls=[_call(0, '{"a":', "f")])),
            _chunk(_choice(0, tool_calls=[_call(1, '{"b":', "g")])),
            _chunk(_choice(0, tool_calls=[_call(0, "1}"), _call(1, "2}")])),
        ),
    ),
    "chat: tool calls numbered from 1 (read both ways, nothing in them)": (
        "/v1/chat/completions",
        _chat(
            _chunk(_choice(0, role="assistant", tool_calls=[_call(1, '{"a":', "f")])),
            _chunk(_choice(0, tool_calls=[_call(1, "1}")])),
            _chunk(_choice(0, tool_calls=[_call(2, '{"b":2}', "g")])),
        ),
    ),
    "chat: Azure's filter chunks (no delta) around the answer": (
        "/v1/chat/completions",
        _chat(
            _chunk({"index": 0, "finish_reason": None, "content_filter_results": {}}, obj=""),
            _chunk(_choice(0, role="assistant", content="all good")),
            _chunk({"index": 0, "finish_reason": None, "content_filter_offsets": {"start_offset": 0}}, obj=""),
        ),
    ),
    "anthropic: a well-formed answer": ("/v1/messages", _anthropic([], _text("all "), _text("good"))),
    "responses: a well-formed answer": ("/v1/responses", _responses(None, None, "", _delta("all "), _delta("good"))),
}


def _body(route: str, sid: str) -> dict[str, Any]:
    prompt = f"mock-scenario:{sid}"
    if route == "/v1/responses":
        return {"model": "gpt-5", "stream": True, "input": prompt}
    if route == "/v1/messages":
        return {
            "model": "claude-test-model",
            "max_tokens": 20,
            "stream": True,
            "messages": [{"role": "user", "content": prompt}],
        }
    return {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": prompt}]}


def _scenario(mock: MockProviderServer, events: list[str]) -> str:
    sid = "or" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"raw_events": events}])
    return sid


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_a_stream_the_sdk_rebuilds_otherwise_is_refused(
    gw: tuple[Env, GatewayThread],
    windowed: tuple[Env, GatewayThread],
    mock: MockProviderServer,
    case: str,
    release: str,
) -> None:
    route, events = REFUSED[case]
    env, gateway = gw if release == "buffered" else windowed
    sid = _scenario(mock, events)
    r = post_json(gateway, env, route, _body(route, sid))
    assert [x for x in mock.state.records() if x.scenario == sid]  # the provider answered: it was judged
    if release == "buffered":
        assert r.status_code >= 400, r.text
    # windowed: refused before anything was sent (403), or the stream ends with the refusal
    assert "upstream_invalid_response" in r.text or "secret_value" in r.text, r.text
    assert TAIL not in r.text and AWS[8:] not in r.text


@pytest.mark.parametrize("case", sorted(PASSED))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_the_streams_providers_send_still_pass(
    gw: tuple[Env, GatewayThread],
    windowed: tuple[Env, GatewayThread],
    mock: MockProviderServer,
    case: str,
    release: str,
) -> None:
    route, events = PASSED[case]
    env, gateway = gw if release == "buffered" else windowed
    r = post_json(gateway, env, route, _body(route, _scenario(mock, events)))
    assert r.status_code == 200 and "reason_codes" not in r.text, r.text
    assert events[-1].strip() in r.text  # released to its last event


def test_the_sdks_read_the_refused_streams_as_errors(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """What an SDK user sees of two of the refused streams: an error, never the value."""
    import anthropic
    import openai

    env, gateway = gw
    _, events = REFUSED["anthropic: message_start already holds the start of the text"]
    client = anthropic_client(gateway, env)
    with pytest.raises(anthropic.APIStatusError) as a_err:
        with client.messages.stream(
            model="claude-test-model",
            max_tokens=20,
            messages=[{"role": "user", "content": f"mock-scenario:{_scenario(mock, events)}"}],
        ) as stream:
            stream.get_final_message()
    assert SECRET not in str(a_err.value.body)
    _, events = REFUSED["chat: a choice index past the next one (the SDK appends it)"]
    oai = openai_client(gateway, env)
    with pytest.raises(openai.APIStatusError) as o_err:
        with oai.chat.completions.stream(
            model="gpt-4.1", messages=[{"role": "user", "content": f"mock-scenario:{_scenario(mock, events)}"}]
        ) as chat:
            chat.get_final_completion()
    assert SECRET not in str(o_err.value.body)


def test_a_plain_chat_chunk_is_still_read_as_its_delta_and_labels() -> None:
    """The chat folder still knows a plain chunk whole (`_delta_only`: its delta folded, its
    ids labels), so the windowed release holds only the text (the method was once dropped by
    a rewrite of the folder, and every chunk read in full)."""
    from gateway.carriers import CARRIERS
    from gateway.carriers.base import CarrierLimits

    folder = CARRIERS["openai.chat"].stream_folder(CarrierLimits())
    chunk = json.loads(_chunk(_choice(0, content="hello")).removeprefix("data: "))
    labels = folder._delta_only(chunk)  # noqa: SLF001
    assert labels is not None and (("id",), "chatcmpl-1") in labels
