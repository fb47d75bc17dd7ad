"""Windowed strict streaming (`release = "windowed"` on a profile): a stream is released as it
arrives, holding back the policy's window; nothing inside the window that a rule could
still complete is ever released, a finding ends the stream with the protocol's error event,
and everything else reaches the client exactly as a buffered release would send it."""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.mockprovider import MockProviderServer
from gateway.obs.logging import JsonFormatter
from gateway.state import METRICS
from tests.conftest import GatewayFactory
from tests.harness import (
    Env,
    GatewayThread,
    anthropic_client,
    chat_chunk_event,
    openai_client,
    raw_client,
    windowed_profiles,
)

WINDOW_CAP = 128
SECRET_VALUE = "wg-windowed-literal-7Hq2"  # configured literal
AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"  # a credential format, never configured
FILLER = " ".join(f"word{i:03d}" for i in range(120))  # ~960 characters of plain text


def _openers(text: str, limit: int = 6) -> set[str]:
    return {text[i : i + limit] for i in range(len(text) - limit + 1)}


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    profiles = windowed_profiles(mock.url)
    with gateways(
        "windowed", secrets_=[SECRET_VALUE], profiles=profiles, policy_extra=f"stream_window_cap = {WINDOW_CAP}\n"
    ) as started:
        yield started


def _chat(sid: str) -> dict[str, Any]:
    return {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}


def _messages(sid: str) -> dict[str, Any]:
    return {
        "model": "claude-test-model",
        "max_tokens": 99,
        "stream": True,
        "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
    }


def _scenario(mock: MockProviderServer, **step: Any) -> str:
    sid = "w" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [step])
    return sid


def _text_of(route: str, body: bytes) -> str:
    events, _ = sse.parse_all(body)
    carrier = CARRIERS["openai.chat" if route.endswith("completions") else "anthropic.messages"]
    folded = carrier.fold_stream([e for e in events if "error" not in e.data[:40]], CarrierLimits())
    return "".join(u.text for u in folded.units if u.kind == "folded" and u.path[-1] in ("content", "text"))


def test_the_window_is_part_of_the_policy(gw: tuple[Env, GatewayThread]) -> None:
    _, gateway = gw
    assert gateway.running is not None
    window = gateway.running.holder.current.policy.window
    assert window.cap == WINDOW_CAP and window.chars == WINDOW_CAP
    assert "jwt" in window.capped and window.needed > WINDOW_CAP


@pytest.mark.parametrize("route,make", [("/v1/chat/completions", _chat), ("/v1/messages", _messages)])
def test_clean_stream_arrives_before_it_ends(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, make: Any
) -> None:
    """A slow stream: the client reads text while the upstream is still sending, and the
    bytes it gets in the end are exactly what a buffered release sends."""
    env, gateway = gw
    sid = _scenario(mock, text=FILLER, chunk_size=8, drip_ms=4)
    started = time.monotonic()
    first_text: float | None = None
    body = b""
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(gateway.uds)), timeout=30) as client:
        with client.stream(
            "POST", "http://gw" + route, json=make(sid), headers={"authorization": f"Bearer {env.gateway_key}"}
        ) as r:
            assert r.status_code == 200
            for chunk in r.iter_bytes():
                body += chunk
                if first_text is None and "word000" in _text_of(route, body):
                    first_text = time.monotonic() - started
    total = time.monotonic() - started
    assert _text_of(route, body) == FILLER
    assert first_text is not None
    # 120 events of 8 characters, 4 ms apart: the first words come out well before the end
    assert first_text < total / 2
    events, clean = sse.parse_all(body)
    assert clean and not any('"error"' in e.data[:12] for e in events)


@pytest.mark.parametrize("route,make", [("/v1/chat/completions", _chat), ("/v1/messages", _messages)])
@pytest.mark.parametrize("secret", [SECRET_VALUE, AWS_KEY], ids=["literal", "format"])
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_secret_split_over_deltas_is_never_partly_released(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, make: Any, secret: str, chunk: int
) -> None:
    env, gateway = gw
    text = FILLER[:400] + " " + secret + " " + FILLER[:400]
    sid = _scenario(mock, text=text, chunk_size=chunk, drip_ms=0.2)
    r = raw_client(gateway, env, uds=True).post(
        route, json=make(sid), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    released = _text_of(route, r.content)
    assert r.status_code == 200  # the stream had started: the refusal is its error event
    assert secret not in released
    assert not (_openers(secret, 4) & _openers(released, 4)), "a part of the secret was released"
    assert released and FILLER.startswith(released[: len(released)])  # a clean prefix was released
    events, _ = sse.parse_all(r.content)
    last = json.loads(events[-1].data)
    assert last.get("error", {}).get("code") == "response_blocked" or last.get("type") == "error"


@pytest.mark.parametrize("first", ["the first words", f"a {SECRET_VALUE} first"], ids=["clean", "secret"])
def test_a_byte_order_mark_before_the_first_event(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, first: str
) -> None:
    """The window's incremental parser ignores one leading byte order mark, even arriving a
    byte at a time: the first event is released, and a secret in it is never."""
    env, gateway = gw
    events = [
        "\ufeff" + chat_chunk_event({"role": "assistant", "content": first}),
        chat_chunk_event({"content": " " + FILLER[:300]}),
        chat_chunk_event({}, "stop"),
        "data: [DONE]\n\n",
    ]
    sid = _scenario(mock, raw_events=events, split_bytes=1)
    route = "/v1/chat/completions"
    r = raw_client(gateway, env, uds=True).post(
        route, json=_chat(sid), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    released = _text_of(route, r.content)
    if SECRET_VALUE in first:
        assert SECRET_VALUE not in r.text and not (_openers(SECRET_VALUE, 4) & _openers(released, 4))
        return
    assert r.status_code == 200 and released == first + " " + FILLER[:300]


def test_tool_argument_deltas(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """A secret inside a tool call's arguments, split over 3-character deltas, escaped as
    JSON: no part of it leaves."""
    env, gateway = gw
    args = json.dumps({"path": FILLER[:300], "token": AWS_KEY.replace("Q", "\\u0051")})
    sid = _scenario(mock, tool_calls=[{"name": "f", "arguments": args}], chunk_size=3, drip_ms=0.2)
    r = raw_client(gateway, env, uds=True).post(
        "/v1/chat/completions", json=_chat(sid), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    events, _ = sse.parse_all(r.content)
    released = "".join(
        call.get("function", {}).get("arguments", "")
        for e in events
        if e.data.startswith("{") and "choices" in e.data
        for choice in json.loads(e.data)["choices"]
        for call in choice.get("delta", {}).get("tool_calls") or ()
    )
    assert r.status_code == 200 and released  # streaming had started
    decoded = released.replace("\\u0051", "Q")
    assert not (_openers(AWS_KEY, 4) & _openers(decoded, 4))
    assert "error" in events[-1].data


def test_sdks_stream_through_windowed_release(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    oai = openai_client(gateway, env)  # over HTTPS
    sid = _scenario(mock, text=FILLER, chunk_size=5)
    pieces = [
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(
            model="gpt-4.1", stream=True, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        )
        if c.choices
    ]
    assert "".join(pieces) == FILLER
    ant = anthropic_client(gateway, env)
    sid = _scenario(mock, text=FILLER, chunk_size=5)
    with ant.messages.stream(
        model="claude-test-model", max_tokens=99, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
    ) as stream:
        assert "".join(stream.text_stream) == FILLER
    sid = _scenario(mock, text=FILLER[:300] + " " + SECRET_VALUE + " " + FILLER[:300], chunk_size=5)
    with pytest.raises(openai.APIError) as caught:
        for _ in oai.chat.completions.create(
            model="gpt-4.1", stream=True, messages=[{"role": "user", "content": f"mock-scenario:{sid}"}]
        ):
            pass
    assert SECRET_VALUE not in str(caught.value)


def test_nothing_stays_counted_and_the_access_line_names_the_window(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, caplog: pytest.LogCaptureFixture
) -> None:
    """After clean, blocked and oversized windowed streams the buffered-bytes gauge is back
    to zero, and each access line carries the window it held (content-free)."""
    env, gateway = gw
    assert gateway.running is not None
    gauge = gateway.running.app[METRICS].buffered_bytes
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    with caplog.at_level(logging.INFO, logger="wiregate"):
        for text in (FILLER, FILLER[:300] + " " + SECRET_VALUE + " " + FILLER[:300]):
            sid = _scenario(mock, text=text, chunk_size=6, drip_ms=0.2)
            r = client.post("/v1/chat/completions", json=_chat(sid), headers=headers)
            assert r.status_code == 200
        deadline = time.monotonic() + 5  # the access line follows the response's last byte
        while sum(r.getMessage() == "request" for r in caplog.records) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert gauge._value.get() == 0
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records if r.getMessage() == "request"]
    windowed = [line for line in lines if line.get("release") == "windowed"]
    assert len(windowed) >= 2
    assert all(line["window"] == WINDOW_CAP and line["window_capped_rules"] > 0 for line in windowed)
    assert any(line["released_early"] > 0 and line["outcome"] == "refused_in_stream" for line in windowed)
    assert not any(SECRET_VALUE in formatter.format(r) for r in caplog.records)
