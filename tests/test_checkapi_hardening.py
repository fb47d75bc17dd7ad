"""POST /v1/context/check, hardened: it holds a before_send's model to the proxy's rules,
refuses a check request that repeats an object key, and reads and inspects a large check
request off the event loop — deciding exactly what it decides for a small one."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway import devsetup
from gateway.api import check
from gateway.carriers import CARRIERS, sse
from gateway.checks import runner
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, chat_chunk_event, raw_client

SECRET = "sk-hardening-SECRET-7c41d09e"
PAD = "lorem ipsum dolor sit amet " * 80  # 2 KiB of ordinary text
MARKER = "harmless-marker-5b2e"  # a value that must never come back in an answer
DUP_HEADER = "x-duplicate-header-name-91af"  # a key that must never come back either

# Every check request of 1 KiB or more is read and inspected off the loop here (in a thread:
# the API does not need the proxy's check-worker processes, which stay off) ...
LARGE_AT_1K = "[server]\ncheck_workers = 0\n[limits]\noffload_bytes = 1024\n"
# ... and, with the default threshold (1 MiB), every one of these cases on the loop there.


@pytest.fixture(scope="module")
def pair(gateways: GatewayFactory) -> Iterator[tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]]]:
    keys: dict[str, str] = {}

    def prepare(env: Env) -> None:
        # A principal allowed one GPT model, and one Claude model that mock-openai does not serve.
        key, digest = devsetup.new_gateway_key()
        block = devsetup.principal_block(
            "narrow-models", [digest], ["proxy", "context.check"], ["mock-openai"], ["default"]
        )
        with (env.dir / "principals.toml").open("a") as fh:
            fh.write(block + 'models = ["gpt-4.1-mini", "claude-opus-4"]\n')
        keys[env.dir.name] = key

    with (
        gateways("hardened_large", secrets_=[SECRET], config_extra=LARGE_AT_1K, prepare=prepare) as large,
        gateways("hardened_small", secrets_=[SECRET], prepare=prepare) as small,
    ):
        for env, _ in (large, small):
            env.narrow_key = keys[env.dir.name]  # type: ignore[attr-defined]
        yield large, small


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


def _post(env: Env, gateway: GatewayThread, content: bytes, *, key: str | None = None) -> Any:
    return raw_client(gateway, env, uds=True).post(
        "/v1/context/check", content=content, headers=_auth(key or env.gateway_key)
    )


def _reasons(r: Any) -> list[str]:
    """The reason codes of a refusal, in the native or the OpenAI dialect's envelope."""
    error = r.json()["error"]
    return list(error.get("details", {}).get("reason_codes") or error.get("reason_codes") or [])


def _send(body: Any, *, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "scope_id": "default",
        "phase": "before_send",
        "target_profile": "mock-openai",
        "payload": {
            "schema": "powercontext.model-json-payload.v1",
            "headers": headers if headers is not None else {"content-type": "application/json"},
            "body": body if isinstance(body, str) else json.dumps(body),
        },
    }


def _release(binding: str, body: str, *, stream: bool, completion: str = "complete") -> dict[str, Any]:
    schema = "powercontext.model-sse-payload.v1" if stream else "powercontext.model-json-payload.v1"
    return {
        "scope_id": "default",
        "phase": "before_release",
        "target_profile": "mock-openai",
        "request_binding": binding,
        "payload": {"schema": schema, "headers": {}, "body": body},
        "completion": completion,
    }


def _chat(text: str, model: str = "gpt-4.1") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


# --- 1. the proxy's model rules --------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        ("gpt-5-pro", "forbidden_model"),  # outside the principal's `models`
        ("claude-opus-4", "forbidden_profile"),  # the principal's, but mock-openai does not serve it
    ],
)
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_model_the_proxy_refuses_is_refused_as_the_proxy_does(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], model: str, reason: str, size: str
) -> None:
    env, gateway = pair[0]
    key = env.narrow_key  # type: ignore[attr-defined]
    text = "hello" if size == "small" else PAD
    proxied = raw_client(gateway, env).post(
        "/v1/chat/completions",
        json=_chat(text, model),
        headers={**_auth(key), "x-wiregate-profile": "mock-openai"},  # the check API's target_profile
    )
    assert proxied.status_code == 403 and _reasons(proxied) == [reason], proxied.text
    r = _post(env, gateway, json.dumps(_send(_chat(text, model))).encode(), key=key)
    assert r.status_code == proxied.status_code and _reasons(r) == _reasons(proxied), r.text
    assert "binding" not in r.text and text not in r.text


def test_a_model_the_profile_does_not_serve_is_refused_whoever_asks(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]],
) -> None:
    """The default principal may use every model (`*`): the signed profile still decides."""
    env, gateway = pair[0]
    r = _post(env, gateway, json.dumps(_send(_chat("hello", "claude-opus-4"))).encode())
    assert r.status_code == 403 and _reasons(r) == ["forbidden_profile"], r.text


def test_an_allowed_model_still_gets_allow_and_a_binding(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]],
) -> None:
    env, gateway = pair[0]
    r = _post(env, gateway, json.dumps(_send(_chat("hello", "gpt-4.1-mini"))).encode(), key=env.narrow_key)  # type: ignore[attr-defined]
    assert r.status_code == 200 and r.json()["decision"] == "allow" and r.json()["binding"], r.text


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_request_past_the_context_window_is_withheld_as_the_proxy_withholds_it(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], size: str
) -> None:
    """mock-openai's window is 128,000 tokens: asking for 200,000 output tokens never fits.
    The proxy withholds it before its checks; the check API answered allow, with a binding."""
    env, gateway = pair[0] if size == "large" else pair[1]
    text = "hello" if size == "small" else PAD
    for max_tokens, fits in ((200_000, False), (1_000, True)):
        body = {**_chat(text, "gpt-4.1-mini"), "max_tokens": max_tokens}
        proxied = raw_client(gateway, env).post(
            "/v1/chat/completions", json=body, headers={**_auth(env.gateway_key), "x-wiregate-profile": "mock-openai"}
        )
        r = _post(env, gateway, json.dumps(_send(body)).encode())
        assert r.status_code == 200, r.text
        if fits:
            assert proxied.status_code == 200 and r.json()["decision"] == "allow" and r.json()["binding"]
        else:
            assert proxied.status_code == 422 and _reasons(proxied) == ["window_exceeded"], proxied.text
            assert (r.json()["decision"], r.json()["reason_codes"]) == ("withhold", ["window_exceeded"])
            assert "binding" not in r.json() and text not in r.text


# --- 2. duplicate keys in the check request --------------------------------------------


def _secret_body() -> str:
    return json.dumps(_chat(SECRET))


def _clean_body(pad: str = "") -> str:
    return json.dumps(_chat(MARKER + pad))


def _payload(body: str, *, headers: str = '{"content-type":"application/json"}') -> str:
    return '{"schema":"powercontext.model-json-payload.v1","headers":%s,"body":%s}' % (headers, json.dumps(body))


HEAD = '"scope_id":"default","phase":"before_send","target_profile":"mock-openai"'


def _duplicated(where: str, pad: str) -> bytes:
    """A before_send whose last value of the duplicated key is harmless (pydantic keeps it)."""
    secret, clean = _secret_body(), _clean_body(pad)
    if where == "top-level payload":
        text = '{%s,"payload":%s,"payload":%s}' % (HEAD, _payload(secret), _payload(clean))
    elif where == "top-level scope_id":
        text = '{"scope_id":"%s",%s,"payload":%s}' % (MARKER, HEAD, _payload(clean))
    elif where == "payload body":
        text = '{%s,"payload":{"schema":"powercontext.model-json-payload.v1","headers":{},"body":%s,"body":%s}}' % (
            HEAD,
            json.dumps(secret),
            json.dumps(clean),
        )
    else:  # a header of the payload
        headers = '{"%s":"%s","%s":"%s"}' % (DUP_HEADER, SECRET, DUP_HEADER, MARKER)
        text = '{%s,"payload":%s}' % (HEAD, _payload(clean, headers=headers))
    return text.encode()


@pytest.mark.parametrize("where", ["top-level payload", "top-level scope_id", "payload body", "payload header"])
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_repeated_key_in_the_check_request_is_refused_without_echo(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], where: str, size: str
) -> None:
    env, gateway = pair[0]
    raw = _duplicated(where, "" if size == "small" else PAD)
    assert (len(raw) >= 1024) is (size == "large")
    json.loads(raw)  # valid JSON: only the repeated key is wrong with it
    r = _post(env, gateway, raw)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request" and _reasons(r) == ["duplicate_key"], r.text
    for leaked in ("binding", "decision", SECRET, MARKER, DUP_HEADER, "lorem"):
        assert leaked not in r.text, (leaked, r.text)


def test_the_same_request_without_the_repeat_is_checked(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]],
) -> None:
    """Either value alone is decided as usual (the refusal above is about the repeat)."""
    env, gateway = pair[0]
    secret = '{%s,"payload":%s}' % (HEAD, _payload(_secret_body()))
    clean = '{%s,"payload":%s}' % (HEAD, _payload(_clean_body()))
    assert _post(env, gateway, secret.encode()).json()["decision"] == "block"
    assert _post(env, gateway, clean.encode()).json()["decision"] == "allow"


def test_a_field_is_read_by_its_wire_name_only(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]],
) -> None:
    """`schema_` (the Python name of `schema`) is an unknown member: refused, never read in
    place of the missing `schema`."""
    env, gateway = pair[0]
    renamed = _payload(_clean_body()).replace('"schema":', '"schema_":', 1)
    r = _post(env, gateway, ('{%s,"payload":%s}' % (HEAD, renamed)).encode())
    assert r.status_code == 422, r.text
    assert "binding" not in r.text and "decision" not in r.text
    assert _post(env, gateway, ('{%s,"payload":%s}' % (HEAD, _payload(_clean_body()))).encode()).status_code == 200


# --- 3. large check requests: off the loop, same verdicts -------------------------------


def _sse(texts: list[str]) -> str:
    return "".join(chat_chunk_event({"content": t}) for t in texts) + chat_chunk_event({}, "stop") + "data: [DONE]\n\n"


def _reply(text: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
    )


SENDS: dict[str, str] = {
    "benign": json.dumps(_chat(PAD)),
    "secret": json.dumps(_chat(f"{PAD} {SECRET} {PAD}")),
    "duplicate_keys_in_body": '{"model": "gpt-4.1", "messages": [{"role": "user", "content": "%s", "content": "%s"}]}'
    % (PAD, SECRET),
    "malformed": '{"model": "gpt-4.1", "messages": [{"role": "user", "content": "%s"' % PAD,
    "forbidden_model": json.dumps(_chat(PAD, "claude-opus-4")),
}

RELEASES: dict[str, tuple[str, bool, str]] = {
    "json_benign": (_reply(PAD), False, "complete"),
    "json_secret": (_reply(f"{PAD} {SECRET}"), False, "complete"),
    "sse_benign": (_sse([PAD[:500]] * 6), True, "complete"),
    "sse_secret_split": (_sse([PAD, SECRET[:9], SECRET[9:], PAD]), True, "complete"),
    "sse_cut": ("".join(chat_chunk_event({"content": t}) for t in (PAD, PAD)), True, "complete"),
    "incomplete": (_reply(PAD), False, "incomplete"),
}


def _seen(r: Any) -> tuple[Any, ...]:
    """What a check answered, less what differs between two gateways (bindings, times)."""
    body = r.json()
    if r.status_code != 200:
        return (r.status_code, body["error"]["code"], tuple(_reasons(r)))
    return (200, body["decision"], tuple(body["reason_codes"]), json.dumps(body["coverage"]), "binding" in body)


class _Reader:
    """`check.CheckRequest` with its `validate_json` spied on."""

    def __init__(self, adapter: Any, spy: Callable[[str, Callable[..., Any]], Callable[..., Any]]) -> None:
        self.validate_json = spy("read", adapter.validate_json)


@pytest.fixture
def threads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[int]]:
    """The thread each stage of a check ran on: reading the request, parsing and folding the
    payload, inspecting it."""
    seen: dict[str, list[int]] = {}

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, []).append(threading.get_ident())
            return fn(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(check, "CheckRequest", _Reader(check.CheckRequest, spy))
    monkeypatch.setattr(sse, "parse_all", spy("parse_sse", sse.parse_all))
    monkeypatch.setattr(check, "_fold", spy("fold", check._fold))
    for carrier in CARRIERS.values():
        monkeypatch.setattr(carrier, "parse_request", spy("parse", carrier.parse_request))
    monkeypatch.setattr(runner, "before_send", spy("inspect_send", runner.before_send))
    monkeypatch.setattr(runner, "release_verdict", spy("inspect_release", runner.release_verdict))
    return seen


def _loop_thread(gateway: GatewayThread) -> int:
    ident = gateway._thread.ident
    assert ident is not None
    return ident


def test_a_large_send_check_is_read_parsed_and_inspected_off_the_loop(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], threads: dict[str, list[int]]
) -> None:
    env, gateway = pair[0]
    raw = json.dumps(_send(SENDS["secret"])).encode()
    assert len(raw) >= 1024
    assert _post(env, gateway, raw).json()["decision"] == "block"
    loop = _loop_thread(gateway)
    for stage in ("read", "parse", "inspect_send"):
        assert threads.get(stage) and loop not in threads[stage], (stage, threads)
    # The spies see the loop thread when a check is small (they would catch a regression).
    threads.clear()
    assert _post(env, gateway, json.dumps(_send(_chat("hi"))).encode()).json()["decision"] == "allow"
    for stage in ("read", "parse", "inspect_send"):
        assert threads.get(stage) == [loop] * len(threads[stage]), (stage, threads)


def test_a_large_release_check_is_folded_and_inspected_off_the_loop(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], threads: dict[str, list[int]]
) -> None:
    env, gateway = pair[0]
    binding = _post(env, gateway, json.dumps(_send(_chat("hi"))).encode()).json()["binding"]
    threads.clear()
    body, stream, completion = RELEASES["sse_secret_split"]
    raw = json.dumps(_release(binding, body, stream=stream, completion=completion)).encode()
    assert len(raw) >= 1024
    assert _post(env, gateway, raw).json()["decision"] == "block"
    loop = _loop_thread(gateway)
    for stage in ("read", "parse_sse", "fold", "inspect_release"):
        assert threads.get(stage) and loop not in threads[stage], (stage, threads)


@pytest.mark.parametrize("case", sorted(SENDS))
def test_a_large_send_check_decides_as_a_small_one(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], case: str
) -> None:
    """The same before_send, read off the loop (1 KiB threshold) and on it (1 MiB)."""
    raw = json.dumps(_send(SENDS[case])).encode()
    assert 1024 <= len(raw) < 1024 * 1024
    answers = [_seen(_post(env, gateway, raw)) for env, gateway in pair]
    assert answers[0] == answers[1], answers
    expected = {
        "benign": "allow",
        "secret": "block",
        "duplicate_keys_in_body": "block",  # the shadowed value holds the secret
        "malformed": "withhold",
    }
    if case in expected:
        assert answers[0][1] == expected[case], answers
        if case == "duplicate_keys_in_body":
            assert "duplicate_key" in answers[0][2], answers
    else:
        assert answers[0][0] == 403, answers


@pytest.mark.parametrize("case", sorted(RELEASES))
def test_a_large_release_check_decides_as_a_small_one(
    pair: tuple[tuple[Env, GatewayThread], tuple[Env, GatewayThread]], case: str
) -> None:
    body, stream, completion = RELEASES[case]
    answers = []
    for env, gateway in pair:
        binding = _post(env, gateway, json.dumps(_send(_chat("hi"))).encode()).json()["binding"]
        raw = json.dumps(_release(binding, body, stream=stream, completion=completion)).encode()
        assert 1024 <= len(raw) < 1024 * 1024
        answers.append(_seen(_post(env, gateway, raw)))
    assert answers[0] == answers[1], answers
    expected = {"json_benign": "allow", "sse_benign": "allow", "json_secret": "block", "sse_secret_split": "block"}
    assert answers[0][1] == expected.get(case, "withhold"), answers
