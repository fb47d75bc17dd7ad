"""Windowed release reads a configured value split over two events whole, where the text
has no folded field to hold it back: two logprobs tokens, a member no one has named, or the
text an Anthropic `message_start` already holds and the first delta of block 0 (the SDK
appends that delta to it). Each check takes in the tail of what the earlier checks read
(`WindowedRelease.joined_tail`), so the event with the second half is refused before it is
released; the buffered release of the same streams blocks them too (the control)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.checks.window import WindowedRelease, significant
from gateway.config.load import load_runtime
from gateway.inspection.literals import SecretValue
from gateway.inspection.window import DEFAULT_CAP, stream_window
from gateway.mockprovider import MockProviderServer
from gateway.units import TextUnit
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, build_env, mock_profile, post_json, windowed_profiles

SECRET = "wg-unfolded-split-Zq81pX4w"
A, B = SECRET[:12], SECRET[12:]
GW = tuple[Env, GatewayThread]


@pytest.fixture(scope="module")
def buffered(gateways: GatewayFactory) -> Iterator[GW]:
    with gateways("joined-tail-b", secrets_=[SECRET]) as started:
        yield started


@pytest.fixture(scope="module")
def windowed(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[GW]:
    with gateways(
        "joined-tail-w",
        secrets_=[SECRET],
        profiles=windowed_profiles(mock.url),
        policy_extra="stream_window_cap = 128\n",
    ) as started:
        yield started


def _chunk(choice_extra: dict[str, Any] | None = None, **extra: Any) -> str:
    choice = {"index": 0, "delta": {"content": ""}, "finish_reason": None, "logprobs": None, **(choice_extra or {})}
    body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1"}
    return "data: " + json.dumps({**body, "choices": [choice], **extra}) + "\n\n"


def _token(token: str) -> dict[str, Any]:
    return {"logprobs": {"content": [{"token": token, "logprob": -0.1, "bytes": None, "top_logprobs": []}]}}


def _event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: " + json.dumps({"type": kind, **body}) + "\n\n"


FILL = " ".join(f"word{i:03d}" for i in range(60))
CHAT_END = [_chunk({"delta": {}, "finish_reason": "stop"}), "data: [DONE]\n\n"]
MESSAGE = {"id": "m1", "type": "message", "role": "assistant", "model": "claude-x", "stop_reason": None}
STREAMS = {
    "logprobs tokens": ("/v1/chat/completions", [_chunk(_token(A)), _chunk(_token(B)), *CHAT_END]),
    "unnamed member": ("/v1/chat/completions", [_chunk(note=A), _chunk(note=B), *CHAT_END]),
    # The SDK starts the message with message_start's block (0); the next one is block 1.
    "message_start text": (
        "/v1/messages",
        [
            _event("message_start", {"message": {**MESSAGE, "content": [{"type": "text", "text": A}]}}),
            _event("content_block_start", {"index": 1, "content_block": {"type": "text", "text": ""}}),
            _event("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": B + " "}}),
            *[
                _event("content_block_delta", {"index": 1, "delta": {"type": "text_delta", "text": FILL[i : i + 40]}})
                for i in range(0, len(FILL), 40)
            ],
            _event("content_block_stop", {"index": 1}),
            _event("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}}),
            _event("message_stop", {}),
        ],
    ),
}


def _send(gw: GW, mock: MockProviderServer, route: str, events: list[str]) -> Any:
    env, gateway = gw
    sid = "jt" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 60}])
    prompt = f"mock-scenario:{sid}"
    body: dict[str, Any] = {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    if route == "/v1/messages":
        body = {**body, "model": "claude-test-model", "max_tokens": 99}
    answer = post_json(gateway, env, route, body)
    assert [x for x in mock.state.records() if x.scenario == sid]  # the provider answered
    return answer


@pytest.mark.parametrize("shape", sorted(STREAMS))
def test_buffered_blocks_the_split_value(buffered: GW, mock: MockProviderServer, shape: str) -> None:
    r = _send(buffered, mock, *STREAMS[shape])
    assert r.status_code == 403 and "secret_value" in r.text, r.text[:300]


@pytest.mark.parametrize("shape", sorted(STREAMS))
def test_windowed_never_releases_the_second_half(windowed: GW, mock: MockProviderServer, shape: str) -> None:
    r = _send(windowed, mock, *STREAMS[shape])
    events, _ = sse.parse_all(r.content)
    released = "".join(e.data for e in events)
    assert "secret_value" in r.text, r.text[:600]  # refused on the open stream ...
    assert B not in released, r.text[:600]  # ... before the event with the second half went out


def _release(tmp_path: Any, secrets: list[str] | None) -> WindowedRelease:
    profile = mock_profile("p", "openai", "http://127.0.0.1:9")
    env = build_env(tmp_path / "config", "http://127.0.0.1:9", secrets_=secrets, profiles=[profile])
    return WindowedRelease(load_runtime(env.config), CARRIERS["openai.chat"], "p", {}, False)


def test_the_tail_keeps_twice_the_longest_value_however_long_the_text(tmp_path: Any) -> None:
    release = _release(tmp_path, [SECRET])
    assert 2 * len(SECRET) <= release.joined_window <= release.runtime.policy.window.cap
    long = "x" * 100_000  # no whitespace to cut at
    tail = release._tail([TextUnit(("a",), "first", "string"), TextUnit(("b",), long, "string")])
    assert sum(significant(u.text) for u in tail) == release.joined_window
    assert [u.path for u in tail] == [("b",)] and tail[0].text == long[-release.joined_window :]
    short = release._tail([TextUnit(("a",), "ab", "string"), TextUnit(("b",), "cd", "string")])
    assert [u.text for u in short] == ["ab", "cd"]  # shorter than the tail: kept whole, in order


def test_the_tail_follows_the_longest_configured_value(tmp_path: Any) -> None:
    longer = _release(tmp_path / "longer", [SECRET * 4])
    assert longer.joined_window >= 2 * len(SECRET * 4) > _release(tmp_path / "short", [SECRET]).joined_window
    assert stream_window([("rule", 40)], []).joined_chars == 0  # no configured value: nothing to join
    assert stream_window([], [SecretValue("v" * 5000)]).joined_chars == DEFAULT_CAP  # within the cap
