"""Windowed release and encoded text (checks/window.py): the window is counted in what every
copy the engine reads holds for certain, so no part of a match of a rule the window covers
leaves before the match is whole, however it is encoded (escapes, character references,
percent-encoding, base64 and hex of those, combining marks, kinds chained across the
field); and a stream that ends early still records the usage its provider reported."""

from __future__ import annotations

import base64
import html.entities
import json
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.checks import window as windowed
from gateway.checks.inspect import inspect
from gateway.checks.window import WindowedRelease, json_string_text, significant
from gateway.config.load import load_runtime
from gateway.config.runtime import Runtime
from gateway.inspection import decoders
from gateway.inspection.engine import Subject
from gateway.mockprovider import MockProviderServer
from gateway.proxy import decide
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, build_env, chat_chunk_event, mock_profile, raw_client, windowed_profiles
from tests.test_window_unit import _chat_stream

CAP = 128
LITERAL = "wg-unit-window-literal-5Rt"
AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"  # a credential format, never configured
ANT_KEY = (
    "sk-ant-api03-"
    + (
        "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5bC7dE9fG1hJ3kL5mN7pQ9rS1tU3vW5xY7zA9bC1dE3fG5hJ7kL9mN1pQ3rS5tU7vWq8Zr0Tk2"
        * 2
    )[:93]
    + "AA"
)
LONG_LITERAL = ("harbor lantern meadow orchid pebble quartz river saffron timber violet willow yarrow zephyr " * 3)[
    :200
]
WORDS = " ".join(f"w{i:03d}" for i in range(200))


def _runtime(tmp_path_factory: pytest.TempPathFactory, secrets: list[str], cap: int | None) -> Runtime:
    url = "http://127.0.0.1:9"
    env = build_env(
        tmp_path_factory.mktemp("window-encoded"),
        url,
        secrets_=secrets,
        profiles=[mock_profile("mock-openai", "openai", url, release="windowed")],
        policy_extra=f"stream_window_cap = {cap}\n" if cap else "",
    )
    return load_runtime(env.config)


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    return _runtime(tmp_path_factory, [LITERAL], CAP)


@pytest.fixture(scope="module")
def default_runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    """The default cap (1024), a 200-character configured value (not capped)."""
    return _runtime(tmp_path_factory, [LONG_LITERAL], None)


def _pieces(text: str, size: int = 3) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _feed(runtime: Runtime, raw: bytes, size: int = 40) -> tuple[bytes, list[str]]:
    """Feed `raw` in reads of `size` bytes; what was released, and why it was refused
    mid-stream (empty when it was not)."""
    window = WindowedRelease(runtime, CARRIERS["openai.chat"], "mock-openai", {}, False)
    released = b""
    for k, at in enumerate(range(0, len(raw), size)):
        step = window.feed(raw[at : at + size], k * 0.01)
        released += step.release
        if step.refusal is not None:
            return released, list(step.refusal.reason_codes)
    return released, []


def _field(released: bytes, name: str = "content") -> str:
    events, _ = sse.parse_all(released)
    folded = CARRIERS["openai.chat"].fold_stream(events, CarrierLimits())
    return "".join(u.text for u in folded.units if u.kind == "folded" and u.path[-1] == name)


def _buffered_refuses(runtime: Runtime, raw: bytes) -> bool:
    folded, released = decide.decode(CARRIERS["openai.chat"], raw, True, runtime)
    return not inspect(runtime, Subject(raw=released, units=folded.units), "mock-openai").allowed


# --- how a secret is hidden: each reads as the secret to the engine ----------------------


def _u8(text: str) -> str:
    return "".join(f"\\U{ord(c):08X}" for c in text)


def _entities_hex(text: str) -> str:
    return "".join(f"&#x{ord(c):07X};" for c in text)


def _entities_long(text: str) -> str:
    return "".join(f"&#{'0' * 30}{ord(c)};" for c in text)  # any number of digits reads as one character


def _base64_of_escapes(text: str) -> str:
    return base64.b64encode(_u8(text).encode()).decode()


def _hex_of_escapes(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text).encode().hex()


def _percent_encoded_references(text: str) -> str:
    return "".join(f"%26%23x{ord(c):X}%3B" for c in text)


def _references_to_escapes(text: str) -> str:
    return "".join(f"&#x5C;u{ord(c):04x}" for c in text)


def _marked(text: str) -> str:
    return "".join(c + "\u0336" * 8 for c in text)  # normalising removes the marks


ENCODINGS: dict[str, Callable[[str], str]] = {
    "u8_escapes": _u8,
    "references": _entities_hex,
    "long_references": _entities_long,
    "base64_of_escapes": _base64_of_escapes,
    "hex_of_escapes": _hex_of_escapes,
    "percent_encoded_references": _percent_encoded_references,
    "references_to_escapes": _references_to_escapes,
    "combining_marks": _marked,
}


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_no_part_of_an_encoded_secret_leaves(runtime: Runtime, encoding: str) -> None:
    """Longer encoded than the window, shorter decoded: held whole until it is read whole."""
    hidden = ENCODINGS[encoding](AWS_KEY)
    assert len(hidden) > CAP  # counted as it arrives, its start would go before its end arrived
    before = WORDS[:300] + " "
    raw = _chat_stream(_pieces(before + hidden + " " + WORDS[:300]))
    assert _buffered_refuses(runtime, raw)
    released, refusal = _feed(runtime, raw)
    assert refusal and refusal[0].startswith("secret_format:")
    got = _field(released)
    assert got and before.startswith(got)  # text before it went early, nothing of it


def test_kinds_chained_across_the_field_are_read(runtime: Runtime) -> None:
    """A percent-encoded reference to a backslash escape decodes whole only where the unit
    holds every kind; the complete check reads the whole field, where a reference and an
    escape come much later: each slice is read as if they were there."""
    hidden = "".join(f"%26%23x5C;U{ord(c):08X}" for c in AWS_KEY)
    before = WORDS[:300] + " "
    raw = _chat_stream(_pieces(before + hidden + " " + WORDS + " &amp; \\x41 end"))
    assert _buffered_refuses(runtime, raw)
    released, refusal = _feed(runtime, raw)
    assert refusal and refusal[0].startswith("secret_format:")
    assert before.startswith(_field(released))


def test_slices_are_also_read_with_every_kind_decoded() -> None:
    assert windowed.decoded_throughout("%26%23x5C;U00000041 &amp#x42; \\x5cx43 x") == "A B C x"
    assert windowed.decoded_throughout("caf%E9 plain") == "caf\ufffd plain"
    # a percent-encoded byte that is not UTF-8 is kept as it is; the references beside it are read
    assert windowed.decoded_throughout("caf%E9 &amp; &#x41; x") == "caf\ufffd & A x"


def test_escaped_tool_arguments_are_held_whole(tmp_path_factory: pytest.TempPathFactory) -> None:
    """JSON \\u escapes in tool-call arguments (which any client decodes): cap 96."""
    runtime = _runtime(tmp_path_factory, [LITERAL], 96)
    args = json.dumps({"note": WORDS[:200], "key": AWS_KEY})
    escaped = "".join(f"\\u{ord(c):04x}" for c in AWS_KEY)
    args = args.replace(AWS_KEY, escaped)
    raw = _chat_stream([], tool_after=_pieces(args))
    released, refusal = _feed(runtime, raw)
    assert refusal and refusal[0].startswith("secret_format:")
    assert args[: args.index(escaped)].startswith(_field(released, "arguments"))


@pytest.mark.parametrize("encoding", ["u8_escapes", "references"])
def test_default_window_holds_long_encoded_matches(default_runtime: Runtime, encoding: str) -> None:
    """The default cap: an Anthropic key (about a hundred characters) and a 200-character
    configured value, both under the window decoded and far over it encoded."""
    window = default_runtime.policy.window
    assert window.chars == 1024 and "anthropic-api-key" not in window.capped and "secret_value" not in window.capped
    before = WORDS[:300] + " "
    for secret in (ANT_KEY, LONG_LITERAL):
        hidden = ENCODINGS[encoding](secret)
        raw = _chat_stream(_pieces(before + hidden + " " + WORDS + " " + WORDS))
        released, refusal = _feed(default_runtime, raw)
        assert refusal
        assert before.startswith(_field(released))


def test_a_run_still_arriving_is_not_followed_by_a_window(runtime: Runtime) -> None:
    """A clean escaped run much longer than the window: none of it leaves while it is still
    arriving (it may yet decode into anything), and all of it once a window follows it."""
    run = "".join(f"\\u{ord(c):04x}" for c in "plain-words-escaped-" * 20)
    before = WORDS[:300] + " "
    pieces = _pieces(before) + _pieces(run) + _pieces(" " + WORDS)
    raw = _chat_stream(pieces)
    arrived = 1 + len(_pieces(before)) + len(_pieces(run))  # the role's event, the text to the run's end
    cut = len(b"\n\n".join(raw.split(b"\n\n")[:arrived])) + 2  # before the event that ends the run
    released, refusal = _feed(runtime, raw[:cut])
    assert not refusal and before.startswith(_field(released))
    released, refusal = _feed(runtime, raw)
    assert not refusal and _field(released).startswith(before + run)


def test_significant_characters_are_what_normalising_keeps() -> None:
    assert significant("a\u0336\u0336\u0336b") == 2  # combining marks are removed
    assert significant("\u1100\u1161\u11a8") == 1  # conjoining jamo compose into one syllable
    assert significant("\uff76\uff9e") == 1  # a half-width voiced mark joins the kana before it
    assert significant("\u0b47\u0b3e") == 1  # a vowel sign that composes with the one before it
    assert significant("abc def\u200b") == 7
    assert significant("a\u2028b\u2029c") == 3  # squeeze removes the line and paragraph separators


def test_nothing_the_literal_copy_removes_counts_towards_the_window() -> None:
    """Every character `squeeze` (the copy configured values are matched in) removes counts
    nothing: a value interleaved with such characters never stretches past the window
    (planes 0, 1 and 14, where every invisible, control and format character lies)."""
    code_points = [*range(0x0000, 0xD800), *range(0xE000, 0x20000), *range(0xE0000, 0xE1000)]
    removed = [cp for cp in code_points if decoders.squeeze(f"wg{chr(cp)}xy") == "wgxy"]
    assert len(removed) > 400  # the controls, format and ignorable characters
    assert [hex(cp) for cp in removed if significant(chr(cp))] == []


# --- the words the window is counted in agree with the decoders ---------------------------

_FRAGMENTS = ["%2", "%", "5", "C", "&#", "&", "#x", "x", "4", "1", ";", "\\", "u", "U", "00", "amp", "lt", "{", "}"]
_FRAGMENTS += ["A", "z", '"', "/", "+", "=", "_", "-", "n", "0", "7", "e9", "not", "copy"]
_SEPARATORS = [
    " ",
    ".",
    ",",
    ":",
    "(",
    ")",
    "[",
    "]",
    "!",
    "?",
    "*",
    "<",
    ">",
    "@",
    "$",
    "'",
    "|",
    "~",
    "\n",
    "é",
    "\u200b",
]


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 8)))


def _text_readings(text: str) -> list[bytes]:
    data = text.encode()
    decodings = (decoders._percent, decoders._entities, decoders._backslashes)
    return [decode(data) for decode in decodings] + [json_string_text(text).encode()]


def test_words_are_decoded_on_their_own() -> None:
    """No decoding reads across a character outside `decoders.WORD`: each word decodes as
    it would alone, and one without `decoders.DECODING_START` reads as itself."""
    rng = random.Random(20240611)
    words = re.compile(decoders.WORD.pattern.encode())
    for _ in range(3000):
        first, second, separator = _word(rng), _word(rng), rng.choice(_SEPARATORS)
        assert not decoders.WORD.fullmatch(separator)
        for whole, alone_first, alone_second in zip(
            _text_readings(first + separator + second), _text_readings(first), _text_readings(second), strict=True
        ):
            assert whole == alone_first + separator.encode() + alone_second
        for word in (first, second):
            if decoders.DECODING_START.search(word) is None:
                assert all(reading == word.encode() for reading in _text_readings(word))
        text = (first + separator + second).encode()
        spans = [m.span() for m in words.finditer(text)]
        for offset, _ in decoders.run_decodings(text):
            assert any(start <= offset < end for start, end in spans)
    assert all(decoders.WORD.fullmatch(name) for name in html.entities.html5)  # every reference name


# --- end to end: the real gateway and the bundled mock --------------------------------------

SECRET = "wg-windowed-literal-7Hq2"
FILLER = " ".join(f"word{i:03d}" for i in range(120))


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory, mock: MockProviderServer) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("window-encoded", secrets_=[SECRET, LONG_LITERAL], profiles=windowed_profiles(mock.url)) as started:
        yield started


def _post(gateway: GatewayThread, env: Env, route: str, sid: str) -> Any:
    body: dict[str, Any] = {"stream": True, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}
    body.update(
        {"model": "gpt-4.1"} if route.endswith("completions") else {"model": "claude-test-model", "max_tokens": 99}
    )
    return raw_client(gateway, env, uds=True).post(
        route, json=body, headers={"authorization": f"Bearer {env.gateway_key}"}
    )


def _text_of(route: str, body: bytes) -> str:
    events, _ = sse.parse_all(body)
    carrier = CARRIERS["openai.chat" if route.endswith("completions") else "anthropic.messages"]
    folded = carrier.fold_stream([e for e in events if "error" not in e.data[:40]], CarrierLimits())
    return "".join(u.text for u in folded.units if u.kind == "folded" and u.path[-1] in ("content", "text"))


def _refused(r: Any) -> bool:
    if r.status_code == 403:
        return True
    events, _ = sse.parse_all(r.content)
    return r.status_code == 200 and bool(events) and '"error"' in events[-1].data


@pytest.mark.parametrize(
    ("route", "secret", "encode"),
    [
        ("/v1/chat/completions", LONG_LITERAL, _entities_hex),
        ("/v1/messages", ANT_KEY, _entities_long),
    ],
    ids=["chat-value-as-references", "messages-key-as-long-references"],
)
def test_encoded_match_never_partly_leaves_e2e(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, route: str, secret: str, encode: Callable[[str], str]
) -> None:
    env, gateway = gw
    assert gateway.running.holder.current.policy.window.chars == 1024
    before = FILLER + " "
    text = before + encode(secret) + " " + FILLER + " " + FILLER
    sid = "we" + uuid.uuid4().hex[:10]
    if route.endswith("completions"):
        events = [chat_chunk_event({"role": "assistant", "content": ""})]
        events += [chat_chunk_event({"content": p}) for p in _pieces(text, 6)]
        events += [chat_chunk_event({}, "stop"), "data: [DONE]\n\n"]
        mock.state.add_scenario(sid, [{"raw_events": events, "drip_ms": 1}])
    else:
        mock.state.add_scenario(sid, [{"text": text, "chunk_size": 6, "drip_ms": 1}])
    r = _post(gateway, env, route, sid)
    assert _refused(r)
    got = _text_of(route, r.content)
    assert before.startswith(got)


def _records(env: Env, gateway: GatewayThread, request_id: str) -> list[dict[str, Any]]:
    auth = {"authorization": f"Bearer {env.gateway_key}"}
    for _ in range(50):  # recorded as the call ends, just after its last byte
        report = raw_client(gateway, env).get("/v1/usage/report", headers=auth).json()
        found = [r for r in report["recent"] if r["request_id"] == request_id]
        if found:
            return found
        time.sleep(0.05)
    return []


@pytest.mark.parametrize(
    "step",
    [
        {"text": FILLER + " " + FILLER + " " + SECRET + " " + FILLER, "chunk_size": 8, "drip_ms": 0.5},
        {"text": FILLER * 3, "chunk_size": 8, "fault": "reset_mid_stream"},
    ],
    ids=["refused-mid-stream", "upstream-cut"],
)
def test_usage_reported_before_the_end_is_recorded_e2e(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, step: dict[str, Any]
) -> None:
    """Anthropic reports input and cache figures in its first event: a windowed stream ended
    after it (by a finding, or by the upstream) records them; the output stays unknown."""
    env, gateway = gw
    sid = "wu" + uuid.uuid4().hex[:10]
    mock.state.add_scenario(sid, [step])
    r = _post(gateway, env, "/v1/messages", sid)
    events, _ = sse.parse_all(r.content)
    assert r.status_code == 200 and "message_start" in events[0].data  # the first event went out
    assert "error" in events[-1].data
    [record] = _records(env, gateway, r.headers["x-powercontext-request-id"])
    assert record["outcome"] in ("blocked", "incomplete")
    assert record["input_total"]["provenance"] == "known" and record["input_total"]["value"] > 0
    assert record["output"]["provenance"] == "unknown"
