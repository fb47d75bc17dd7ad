"""An SSE event's own `event:` and `id:` fields reach the client re-framed beside its data
(`sse.frame`), so they are read exactly like the data's strings: normalised and decoded,
not only scanned raw. (They once were only scanned raw: the base64, fullwidth,
zero-width-interleaved or percent-encoded form of a configured value in an `id:` line, or
in the `event:` line of an OpenAI chat chunk or of a `[DONE]` event, was released.) Both
the buffered and the windowed release refuse such a stream; a stream with ordinary event
names and ids is released unchanged. Each distinct field text is read once per stream (an
Anthropic stream names `content_block_delta` on every delta), at a fixed path that logs
no client text."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway import units
from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.inspection.engine import joinable
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, post_json, windowed_profiles

SECRET = "wg-sse-field-Rk83vQ2xT"
FORMS: dict[str, str] = {
    "plain": SECRET,
    "base64": base64.b64encode(SECRET.encode()).decode(),
    "fullwidth": "".join(chr(ord(c) + 0xFEE0) for c in SECRET),
    "zero_width": "\u200b".join(SECRET),
    "percent": "".join(f"%{b:02X}" for b in SECRET.encode()),
}
GW = tuple[Env, GatewayThread]


@pytest.fixture(scope="module")
def buffered(gateways: GatewayFactory) -> Iterator[GW]:
    with gateways("sse-fields-b", secrets_=[SECRET]) as started:
        yield started


@pytest.fixture(scope="module")
def windowed(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[GW]:
    with gateways("sse-fields-w", secrets_=[SECRET], profiles=windowed_profiles(mock.url)) as started:
        yield started


def _chunk(delta: dict[str, Any], finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1"}
    return "data: " + json.dumps({**body, "choices": [choice]}) + "\n\n"


def _anthropic(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **body}) + "\n\n"


def chat_stream(head: str = "", done_head: str = "") -> list[str]:
    """An OpenAI chat stream; `head` (field lines) leads its first content chunk,
    `done_head` its `[DONE]` event."""
    return [
        _chunk({"role": "assistant", "content": ""}),
        head + _chunk({"content": "Hello there, all is well."}),
        _chunk({}, "stop"),
        done_head + "data: [DONE]\n\n",
    ]


MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test-model",
    "content": [],
    "stop_reason": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def anthropic_stream(start_head: str = "", done_head: str | None = None) -> list[str]:
    """An Anthropic stream; `start_head` (field lines) leads `message_start`. With
    `done_head`, a `[DONE]` event led by it follows the first delta (the fold tolerates
    `[DONE]` without reading its name: no `type` to compare it with)."""
    events = [
        start_head + _anthropic("message_start", {"message": MESSAGE}),
        _anthropic("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
        _anthropic("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hello there,"}}),
        _anthropic("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " all is well."}}),
        _anthropic("content_block_stop", {"index": 0}),
        _anthropic("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
        _anthropic("message_stop", {}),
    ]
    if done_head is not None:
        events.insert(3, done_head + "data: [DONE]\n\n")
    return events


CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
# (route, field) -> the stream with the field's line holding `value`
PLACES: dict[str, tuple[str, Callable[[str], list[str]]]] = {
    "chat-id": (CHAT, lambda v: chat_stream(head=f"id: {v}\n")),
    "chat-event": (CHAT, lambda v: chat_stream(head=f"event: {v}\n")),
    "chat-done-id": (CHAT, lambda v: chat_stream(done_head=f"id: {v}\n")),
    "chat-done-event": (CHAT, lambda v: chat_stream(done_head=f"event: {v}\n")),
    "anthropic-id": (MESSAGES, lambda v: anthropic_stream(start_head=f"id: {v}\n")),
    "anthropic-event": (MESSAGES, lambda v: anthropic_stream(done_head=f"event: {v}\n")),
}


def _body(route: str, sid: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"mock-scenario:{sid}"}]
    if route == MESSAGES:
        return {"model": "claude-test-model", "max_tokens": 64, "stream": True, "messages": messages}
    return {"model": "gpt-4.1", "stream": True, "messages": messages}


def _through(gw: GW, mock: MockProviderServer, route: str, events: list[str]) -> Any:
    env, gateway = gw
    sid = "sf" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"raw_events": events}])
    answer = post_json(gateway, env, route, _body(route, sid))
    assert [x for x in mock.state.records() if x.scenario == sid]  # the provider answered: its stream was judged
    return answer


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_a_value_in_an_event_field_is_refused(
    buffered: GW, windowed: GW, mock: MockProviderServer, release: str, place: str, form: str
) -> None:
    route, stream = PLACES[place]
    value = FORMS[form]
    r = _through(buffered if release == "buffered" else windowed, mock, route, stream(value))
    if r.status_code == 200:  # windowed, something already released: the refusal is the stream's error event
        events, _ = sse.parse_all(r.content)
        assert events and '"error"' in events[-1].data, r.text
        assert "response_blocked" in r.text and "secret_value" in r.text, r.text
    else:
        assert r.status_code == 403, r.text
        assert "secret_value" in r.text, r.text
    assert value not in r.text and SECRET not in r.text


@pytest.mark.parametrize(
    ("route", "events"),
    [
        (CHAT, chat_stream(head="event: message\nid: 7\n", done_head="id: 8\n")),
        (MESSAGES, anthropic_stream(start_head="id: evt_0001\n", done_head="event: ping\nid: evt_0002\n")),
    ],
    ids=["chat", "anthropic"],
)
@pytest.mark.parametrize("release", ["buffered", "windowed"])
def test_ordinary_event_names_and_ids_are_released_unchanged(
    buffered: GW, windowed: GW, mock: MockProviderServer, release: str, route: str, events: list[str]
) -> None:
    r = _through(buffered if release == "buffered" else windowed, mock, route, events)
    assert r.status_code == 200, r.text
    assert "response_blocked" not in r.text, r.text
    got, clean = sse.parse_all(r.content)
    sent, _ = sse.parse_all("".join(events).encode())
    assert clean and got == sent


def _fold(carrier: str, events: list[str]) -> Any:
    parsed, clean = sse.parse_all("".join(events).encode())
    assert clean
    return CARRIERS[carrier].fold_stream(parsed, CarrierLimits())


def test_each_distinct_field_text_is_one_unit_at_a_fixed_path() -> None:
    """A name repeated on thousands of deltas costs one unit; a new id costs one more. The
    path says where (never what): its segments are fixed names and the event's index."""
    delta = _anthropic("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "ok "}})
    start, block, *_ = anthropic_stream()
    end = anthropic_stream()[4:]
    ids = [f"id: {SECRET}\n", "id: 42\n", f"id: {SECRET}\n"]
    events = [ids[0] + start, block, *[delta] * 3000, ids[1] + delta, ids[2] + delta, *end]
    folded = _fold("anthropic.messages", events)
    assert folded.complete
    fields = [u for u in folded.units if "~sse" in u.path]
    names = ["message_start", "content_block_start", "content_block_delta", "content_block_stop"]
    names += ["message_delta", "message_stop"]
    assert sorted(u.text for u in fields) == sorted([SECRET, "42", *names])
    assert all(u.kind == units.KIND_STRING and u.path[0] == "~events" for u in fields)
    for unit in fields:
        assert unit.path[2:] in (("~sse", "type"), ("~sse", "id"))
        assert SECRET not in units.location(unit.path)
    secret_unit = next(u for u in fields if u.text == SECRET)
    assert secret_unit.path == ("~events", 0, "~sse", "id")


def test_field_units_do_not_break_the_joined_read() -> None:
    """The joined read of the text leaves the field units out (their last segment is a
    structural field's name, like the data's own `type` and `id`): a value split over the
    text `message_start` holds and the first delta is still read whole."""
    folded = _fold("anthropic.messages", anthropic_stream(start_head="id: evt_1\n"))
    fields = [u for u in folded.units if "~sse" in u.path]
    assert fields and not any(joinable(u) for u in fields)
