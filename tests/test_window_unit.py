"""The windowed releaser on its own (checks/window.py) and the window a policy computes
(inspection/window.py): fed real SSE bytes, with the real compiled policy."""

from __future__ import annotations

import json

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.checks.window import WindowedRelease, json_string_text, significant
from gateway.config.load import load_runtime
from gateway.config.runtime import Runtime
from gateway.inspection import literals
from gateway.inspection.window import stream_window
from gateway.profiles.model import UpstreamProfile
from gateway.proxy import decide
from tests.harness import build_env, mock_profile

CAP = 96
LITERAL = "wg-unit-window-literal-5Rt"
AWS_KEY = "AKIA" + "QYLPMN5HFIQR7XZA"
WORDS = " ".join(f"w{i:03d}" for i in range(200))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    url = "http://127.0.0.1:9"
    env = build_env(
        tmp_path_factory.mktemp("window-unit"),
        url,
        secrets_=[LITERAL],
        profiles=[mock_profile("mock-openai", "openai", url, release="windowed")],
        policy_extra=f"stream_window_cap = {CAP}\n",
    )
    return load_runtime(env.config)


def _chat_stream(pieces: list[str], *, tool_after: list[str] | None = None) -> bytes:
    head = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":%s,"finish_reason":null}]}'
    out = ["data: " + head % '{"role":"assistant","content":""}']
    out += ["data: " + head % json.dumps({"content": p}) for p in pieces]
    for n, piece in enumerate(tool_after or ()):
        call: dict[str, object] = {"index": 0, "function": {"arguments": piece}}
        if n == 0:
            call.update(id="call_1", type="function", function={"name": "f", "arguments": piece})
        out.append("data: " + head % json.dumps({"tool_calls": [call]}))
    out.append("data: " + head.replace('"finish_reason":null', '"finish_reason":"stop"') % "{}")
    out.append("data: [DONE]")
    return ("\n\n".join(out) + "\n\n").encode()


def _feed(window: WindowedRelease, raw: bytes, size: int, dt: float = 0.0) -> tuple[bytes, list[str]]:
    released = b""
    for k, at in enumerate(range(0, len(raw), size)):
        step = window.feed(raw[at : at + size], k * dt)
        released += step.release
        if step.refusal is not None:
            return released, list(step.refusal.reason_codes)
    window.close()
    return released, []


def _content(released: bytes) -> str:
    events, _ = sse.parse_all(released)
    folded = CARRIERS["openai.chat"].fold_stream(events, CarrierLimits())
    return "".join(u.text for u in folded.units if u.kind == "folded" and u.path[-1] == "content")


def _window(runtime: Runtime) -> WindowedRelease:
    return WindowedRelease(runtime, CARRIERS["openai.chat"], "mock-openai", {}, False)


def test_policy_window(runtime: Runtime) -> None:
    window = runtime.policy.window
    assert (window.cap, window.chars) == (CAP, CAP)
    assert window.needed >= 4000 and "jwt" in window.capped and "aws-access-key-id" not in window.capped
    small = stream_window([("a", 20), ("b", 30)], [literals.SecretValue("x" * 12)], cap=1024)
    assert (small.chars, small.needed, small.capped) == (60, 30, ())  # twice the longest match
    escaped = stream_window([("a", 10)], [literals.SecretValue('q"uo\\te-value')], cap=1024)
    assert escaped.needed > len('q"uo\\te-value')  # the escaped wire forms count
    capped = stream_window([("long", 500)], [literals.SecretValue("v" * 300)], cap=128)
    assert capped.chars == 128 and capped.capped == ("long", "secret_value")


def test_release_mode_is_validated() -> None:
    doc = mock_profile("p", "openai", "http://127.0.0.1:9", release="sometimes")
    doc.pop("signature", None)
    with pytest.raises(ValueError, match="release"):
        UpstreamProfile.model_validate(doc)


def test_significant_characters() -> None:
    assert significant("abc def") == 7
    assert significant("a\u200bb\u200cc\n\td") == 4  # invisible and whitespace controls do not count
    assert significant("\U000e0041\U000e0042") == 2  # tag characters stand for ASCII
    assert json_string_text('{"k": "a\\u0051\\"b\\\\') == '{"k": "aQ"b\\'


def test_clean_stream_is_released_early_and_whole(runtime: Runtime) -> None:
    pieces = [WORDS[i : i + 5] for i in range(0, len(WORDS), 5)]
    raw = _chat_stream(pieces)
    window = _window(runtime)
    early = b""
    for k, at in enumerate(range(0, len(raw), 97)):
        step = window.feed(raw[at : at + 97], k * 0.001)
        assert step.refusal is None
        early += step.release
    folded, released = window.close()
    assert folded.complete and released.startswith(early)  # the complete check reads what left
    text = _content(early)
    assert text and WORDS.startswith(text)
    assert len(WORDS) - len(text) >= CAP  # the window is still held at the end of the upstream
    assert len(text) >= len(WORDS) - 2 * CAP  # ...but not much more than it
    # the released prefix is exactly what the buffered release would send first
    whole = decide.decode(CARRIERS["openai.chat"], raw, True, runtime)[1]
    assert whole.startswith(early) and window.released_bytes == len(early)
    # inspection is throttled: about one per half window of new text, not one per event
    assert window.checks <= 2 * len(WORDS) // (CAP // 2) + 2


def test_first_events_go_at_once(runtime: Runtime) -> None:
    raw = _chat_stream([WORDS[:5]])
    first_event = raw[: raw.index(b"\n\n") + 2]
    step = _window(runtime).feed(first_event, 0.0)
    assert step.refusal is None and b'"role":"assistant"' in step.release  # a label is never held


@pytest.mark.parametrize("secret", [LITERAL, AWS_KEY])
@pytest.mark.parametrize("size", [1, 7, 61, 100_000])
def test_secret_is_never_partly_released(runtime: Runtime, secret: str, size: int) -> None:
    text = WORDS[:300] + " " + secret + " " + WORDS[:300]
    raw = _chat_stream([text[i : i + 3] for i in range(0, len(text), 3)])
    released, refusal = _feed(_window(runtime), raw, size, dt=0.01)
    assert refusal, "the secret was not found"
    got = _content(released)
    assert WORDS.startswith(got)  # only text before the secret, nothing of it
    if size == 100_000:
        assert released == b""  # all in one read: refused before anything left (an ordinary error)


def test_quiet_field_is_released_before_the_end(runtime: Runtime) -> None:
    """Text, then a long tool call: the text's tail is released once the window has arrived
    in the arguments, long before the stream ends."""
    args = json.dumps({"note": WORDS})
    raw = _chat_stream(
        [WORDS[i : i + 5] for i in range(0, 200, 5)], tool_after=[args[i : i + 5] for i in range(0, len(args), 5)]
    )
    released, refusal = _feed(_window(runtime), raw, 200, dt=0.01)
    assert not refusal
    assert _content(released) == WORDS[:200]  # the whole text, though its field never grew again


def test_secret_across_text_and_tool_arguments(runtime: Runtime) -> None:
    """A configured value split between the end of the text and the start of a tool call's
    arguments (read joined, as a buffered check reads them): no part of it leaves."""
    half = len(LITERAL) // 2
    raw = _chat_stream(
        [WORDS[i : i + 5] for i in range(0, 200, 5)] + [LITERAL[:half]],
        tool_after=[LITERAL[half:]] + [WORDS[i : i + 5] for i in range(0, 400, 5)],
    )
    # small reads, each inspected: the text's end is inspected before the arguments arrive
    released, refusal = _feed(_window(runtime), raw, 40, dt=0.1)
    assert refusal == ["secret_value"]
    assert LITERAL[:4] not in _content(released)


def test_escaped_tool_arguments_are_read(runtime: Runtime) -> None:
    """Arguments still arriving are partial JSON: their string escapes are read too."""
    args = json.dumps({"note": WORDS[:200], "key": AWS_KEY}).replace("Q", "\\u0051")
    raw = _chat_stream([], tool_after=[args[i : i + 3] for i in range(0, len(args), 3)])
    released, refusal = _feed(_window(runtime), raw, 64, dt=0.01)
    assert refusal and refusal[0].startswith("secret_format:")
    assert b"AKI" not in released


def test_provider_error_event_ends_the_stream(runtime: Runtime) -> None:
    raw = _chat_stream([WORDS[i : i + 5] for i in range(0, 400, 5)])
    cut = raw.index(b"data: [DONE]")
    broken = raw[:cut] + b'data: {"error":{"message":"overloaded"}}\n\n'
    released, refusal = _feed(_window(runtime), broken, 300, dt=0.01)
    assert refusal == ["response_incomplete"]
    assert b"overloaded" not in released


def test_invalid_utf8_is_refused(runtime: Runtime) -> None:
    step = _window(runtime).feed(b'data: {"choices":[\xff]}\n\n', 0.0)
    assert step.refusal is not None and step.release == b""
