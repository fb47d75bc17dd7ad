"""The evasion suite: configured literals and credential formats hidden in every field of
every carrier, in every encoding. In requests none reaches the mock provider; in responses
none reaches the client. Zero leaks, counted over thousands of combinations."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.carriers import sse
from gateway.mockprovider import MockProviderServer
from tests.harness import Env, GatewayThread, build_env, raw_client
from tests.inspection.secret_samples import true_positives

LITERALS = [
    'acme"quote\\back-slash',  # a quote and a backslash
    "a.b*c+d?(e)[f]{g}|h^$-meta",  # regex metacharacters
    "pässwörd-日本-κλειδί-🔑",  # non-ASCII, an astral character too
    "plain-literal-0123456789",
]
NUMBER_LITERAL = "31415926535897932384626"  # leaks as a number's lexical form
FORMAT_RULES = [
    "aws-access-key-id", "github-pat", "openai-project-key", "anthropic-api-key",
    "stripe-live-secret-key", "private-key-rsa", "jwt", "postgres-connection-uri",
    "slack-bot-token", "google-api-key", "slack-webhook-url", "gitlab-pat",
]
FORMAT_SECRETS = [true_positives(rule, n=1, seed=1234)[0] for rule in FORMAT_RULES]
SECRETS = LITERALS + FORMAT_SECRETS
PH = "@@SECRET@@"
PH1, PH2 = "@@PART1@@", "@@PART2@@"


@pytest.fixture(scope="module")
def gw(mock: MockProviderServer, shared_tls: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Env, GatewayThread]]:
    env = build_env(tmp_path_factory.mktemp("evasion"), mock.url, tls_dir=shared_tls,
                    secrets_=[*LITERALS, NUMBER_LITERAL])
    with GatewayThread(env.config) as gateway:
        yield env, gateway


# --- encodings of the secret inside a JSON string literal ------------------------------

def _u_escape(text: str, every: int = 1) -> str:
    out = []
    for i, ch in enumerate(text):
        if i % every:
            out.append(json.dumps(ch)[1:-1])
            continue
        encoded = ch.encode("utf-16-be")
        out.extend("\\u%04x" % int.from_bytes(encoded[j:j + 2], "big") for j in range(0, len(encoded), 2))
    return "".join(out)


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


ENCODINGS: dict[str, Callable[[str], str]] = {
    "json": lambda s: json.dumps(s)[1:-1],
    "utf8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "u_all": _u_escape,
    "u_some": lambda s: _u_escape(s, every=2),
    "escaped_slashes": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "zero_width": lambda s: json.dumps("\u200b".join(s), ensure_ascii=False)[1:-1],
    "fullwidth": lambda s: json.dumps(_fullwidth(s), ensure_ascii=False)[1:-1],
    "soft_hyphen_u": lambda s: _u_escape("\u00ad".join(s), every=3),
}


def _at_depth(encoded: str, depth: int) -> str:
    """Escape an already-encoded string literal body once more per extra level of
    JSON-in-a-string (tool arguments hold JSON text)."""
    for _ in range(depth - 1):
        encoded = json.dumps(encoded)[1:-1]
    return encoded


# --- placements: (carrier path, body with placeholders, depth of the placeholder) ------

def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "messages": [{"role": "user", "content": "hello"}], **extra}


def _args(inner: Any) -> str:
    return json.dumps(inner)


Placement = tuple[str, str, int]  # route, raw JSON text with placeholders, depth


def _p(route: str, doc: Any, depth: int = 1) -> Placement:
    return route, json.dumps(doc), depth


CHAT, RESP, MSGS, EMB = "/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/embeddings"

PLACEMENTS: dict[str, Placement] = {
    "chat.user_text": _p(CHAT, _chat(messages=[{"role": "user", "content": f"x {PH} y"}])),
    "chat.system": _p(CHAT, _chat(messages=[{"role": "system", "content": PH}, {"role": "user", "content": "hi"}])),
    "chat.developer": _p(CHAT, _chat(messages=[{"role": "developer", "content": [{"type": "text", "text": PH}]}])),
    "chat.tool_description": _p(CHAT, _chat(tools=[{"type": "function", "function": {
        "name": "f", "description": f"use {PH}", "parameters": {"type": "object"}}}])),
    "chat.tool_schema_key": _p(CHAT, _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {PH: {"type": "string"}}}}}])),
    "chat.tool_call_args": _p(CHAT, _chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "f", "arguments": _args({"token": PH})}}]}]), depth=2),
    "chat.tool_call_args_double": _p(CHAT, _chat(messages=[{"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "f", "arguments": _args({"payload": _args({"k": PH})})}}]}]), depth=3),
    "chat.tool_result": _p(CHAT, _chat(messages=[{"role": "tool", "tool_call_id": "c", "content": f"result {PH}"}])),
    "chat.tool_result_json": _p(CHAT, _chat(messages=[{"role": "tool", "tool_call_id": "c", "content": _args({"out": PH})}]), depth=2),
    "chat.metadata": _p(CHAT, _chat(metadata={"note": PH})),
    "chat.user_field": _p(CHAT, _chat(user=PH)),
    "chat.unknown_field": _p(CHAT, _chat(x_vendor_extension={"deep": [{"deeper": PH}]})),
    "chat.object_key": _p(CHAT, _chat(metadata={PH: "v"})),
    "chat.split_parts": _p(CHAT, _chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": PH1}, {"type": "text", "text": PH2}]}])),
    "responses.instructions": _p(RESP, {"model": "gpt-5", "instructions": PH, "input": "hi"}),
    "responses.input_string": _p(RESP, {"model": "gpt-5", "input": f"see {PH}"}),
    "responses.input_text": _p(RESP, {"model": "gpt-5", "input": [{"role": "user", "content": [{"type": "input_text", "text": PH}]}]}),
    "responses.function_call": _p(RESP, {"model": "gpt-5", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                                       "arguments": _args({"a": PH})}]}, depth=2),
    "responses.function_output": _p(RESP, {"model": "gpt-5", "input": [{"type": "function_call_output", "call_id": "c", "output": PH}]}),
    "responses.tool_description": _p(RESP, {"model": "gpt-5", "input": "hi", "tools": [{"type": "function", "name": "f",
                                                                                          "description": PH, "parameters": {}}]}),
    "responses.split_parts": _p(RESP, {"model": "gpt-5", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": PH1}, {"type": "input_text", "text": PH2}]}]}),
    "messages.system_string": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "system": PH,
                                        "messages": [{"role": "user", "content": "hi"}]}),
    "messages.system_blocks": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9,
                                        "system": [{"type": "text", "text": PH1}, {"type": "text", "text": PH2}],
                                        "messages": [{"role": "user", "content": "hi"}]}),
    "messages.text_block": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9,
                                     "messages": [{"role": "user", "content": [{"type": "text", "text": PH}]}]}),
    "messages.document_text": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": PH}}]}]}),
    "messages.tool_use_input": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": PH}}]}]}),
    "messages.tool_result": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": PH}]}]}]}),
    "messages.tools": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                                "tools": [{"name": "f", "description": PH, "input_schema": {"type": "object"}}]}),
    "messages.metadata_user": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "metadata": {"user_id": PH},
                                        "messages": [{"role": "user", "content": "hi"}]}),
    "messages.split_parts": _p(MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "text", "text": PH1}, {"type": "text", "text": PH2}]}]}),
    "embeddings.input": _p(EMB, {"model": "text-embedding-3-small", "input": ["fine", PH]}),
}


def _render(placement: Placement, secret: str, encode: Callable[[str], str]) -> tuple[str, bytes]:
    route, text, depth = placement
    half = len(secret) // 2
    raw = (text.replace(PH, _at_depth(encode(secret), depth))
               .replace(PH1, _at_depth(encode(secret[:half]), depth))
               .replace(PH2, _at_depth(encode(secret[half:]), depth)))
    return route, raw.encode("utf-8", "surrogatepass")


def _send_all(env: Env, gateway: GatewayThread, mock: MockProviderServer,
              bodies: list[tuple[str, str, bytes]]) -> list[str]:
    """Send every body; return descriptions of any that were not refused or that reached
    the mock provider."""
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"}
    before = len(mock.state.records())
    leaks = []
    for label, route, raw in bodies:
        r = client.post(route, content=raw, headers=headers)
        if r.status_code not in (403, 422) or len(mock.state.records()) != before:
            leaks.append(f"{label}: {r.status_code}")
            before = len(mock.state.records())
    return leaks


@pytest.mark.parametrize("encoding", sorted(ENCODINGS))
def test_request_evasion(gw: tuple[Env, GatewayThread], mock: MockProviderServer, encoding: str) -> None:
    env, gateway = gw
    bodies = []
    for pname, placement in PLACEMENTS.items():
        for i, secret in enumerate(SECRETS):
            route, raw = _render(placement, secret, ENCODINGS[encoding])
            bodies.append((f"{pname}/{encoding}/secret{i}", route, raw))
    leaks = _send_all(env, gateway, mock, bodies)
    assert leaks == [], f"{len(leaks)} of {len(bodies)} leaked: {leaks[:10]}"
    assert len(bodies) == len(PLACEMENTS) * len(SECRETS)


def test_duplicate_key_either_side(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    bodies = []
    for i, secret in enumerate(SECRETS):
        enc = json.dumps(secret)
        for first, second in ((enc, '"benign"'), ('"benign"', enc)):
            raw = ('{"model":"gpt-4.1","messages":[{"role":"user","content":%s,"content":%s}]}' % (first, second)).encode()
            bodies.append((f"dup/{i}", CHAT, raw))
            raw = ('{"model":"gpt-4.1","messages":[],"metadata":{"k":%s},"metadata":{"k":%s}}' % (first, second)).encode()
            bodies.append((f"dup-object/{i}", CHAT, raw))
    assert _send_all(env, gateway, mock, bodies) == []


def test_number_lexical_form(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    raws = [
        '{"model":"gpt-4.1","messages":[],"seed":%s}' % NUMBER_LITERAL,
        '{"model":"gpt-4.1","messages":[],"metadata":{"n":-%s.5e3}}' % NUMBER_LITERAL,
        '{"model":"gpt-4.1","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\\"n\\": %s}"}}]}]}' % NUMBER_LITERAL,
    ]
    assert _send_all(env, gateway, mock, [(f"num/{i}", CHAT, r.encode()) for i, r in enumerate(raws)]) == []


# --- responses: the model emits it ----------------------------------------------------

def _chunks(text: str) -> list[str]:
    """Small pieces (a secret is never whole in one event), at most ~24 of them."""
    size = max(3, len(text) // 24)
    return [text[i:i + size] for i in range(0, len(text), size)]


def _chat_events(pieces: list[str], tool: bool) -> list[str]:
    head = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":%s,"finish_reason":null}]}'
    events = []
    for n, piece in enumerate(pieces):
        if tool:
            call = {"index": 0, "function": {"arguments": "@@"}}
            if n == 0:
                call.update(id="call_1", type="function")
                call["function"]["name"] = "f"  # type: ignore[index]
            delta = json.dumps({"tool_calls": [call]}).replace('"@@"', '"%s"' % piece)
        else:
            delta = '{"content":"%s"}' % piece
        events.append("data: " + head % delta + "\n\n")
    events.append('data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n')
    events.append("data: [DONE]\n\n")
    return events


def _responses_events(pieces: list[str], tool: bool) -> list[str]:
    kind = "response.function_call_arguments.delta" if tool else "response.output_text.delta"
    events = ['event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress","output":[]}}\n\n']
    for piece in pieces:
        events.append('event: %s\ndata: {"type":"%s","item_id":"i1","output_index":0,"content_index":0,"delta":"%s"}\n\n'
                      % (kind, kind, piece))
    events.append('event: response.completed\ndata: {"type":"response.completed","response":{"id":"r1","status":"completed","output":[]}}\n\n')
    return events


def _anthropic_events(pieces: list[str], tool: bool) -> list[str]:
    block = '{"type":"tool_use","id":"t1","name":"f","input":{}}' if tool else '{"type":"text","text":""}'
    dtype, field = ("input_json_delta", "partial_json") if tool else ("text_delta", "text")
    events = ['event: message_start\ndata: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[],"model":"c","usage":{"input_tokens":1,"output_tokens":1}}}\n\n',
              'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":%s}\n\n' % block]
    for piece in pieces:
        events.append('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"%s","%s":"%s"}}\n\n'
                      % (dtype, field, piece))
    events += ['event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
               'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}\n\n',
               'event: message_stop\ndata: {"type":"message_stop"}\n\n']
    return events


STREAMS = {
    "chat": (CHAT, _chat_events, lambda sid: {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}),
    "responses": (RESP, _responses_events, lambda sid: {"model": "gpt-5", "stream": True, "input": f"mock-scenario:{sid}"}),
    "messages": (MSGS, _anthropic_events, lambda sid: {"model": "claude-test-model", "max_tokens": 9, "stream": True,
                                                        "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}]}),
}


def _client_saw(body: bytes, secret: str) -> bool:
    text = body.decode("utf-8", "replace")
    if secret in text:
        return True
    try:
        decoded = json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return False
    return secret in decoded


@pytest.mark.parametrize("carrier", sorted(STREAMS))
@pytest.mark.parametrize("tool", [False, True], ids=["text", "tool_args"])
def test_stream_response_evasion(gw: tuple[Env, GatewayThread], mock: MockProviderServer, carrier: str, tool: bool) -> None:
    env, gateway = gw
    route, make_events, make_body = STREAMS[carrier]
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    leaks = []
    for enc_name in ("json", "utf8", "u_all", "u_some", "escaped_slashes", "zero_width", "fullwidth"):
        encode = ENCODINGS[enc_name]
        for i, secret in enumerate(SECRETS):
            content = json.dumps({"value": secret}) if tool else f"here: {secret} end"
            # the text is split into pieces, each JSON-escaped on its own (raw is never whole)
            pieces = [encode(p) if not tool else _at_depth(encode(p), 1) for p in _chunks(content)]
            if enc_name in ("zero_width", "fullwidth") and tool:
                pieces = [json.dumps(p, ensure_ascii=False)[1:-1] for p in _chunks(
                    json.dumps({"value": "\u200b".join(secret) if enc_name == "zero_width" else _fullwidth(secret)}, ensure_ascii=False))]
            sid = "e" + uuid.uuid4().hex[:12]
            # every third stream also arrives in odd-sized TCP writes, splitting events and
            # multi-byte characters across reads
            split = {"split_bytes": 61} if i % 3 == 0 else {}
            mock.state.add_scenario(sid, [{"raw_events": make_events(pieces, tool), **split}])
            r = client.post(route, json=make_body(sid), headers=headers)
            if r.status_code != 403 or _client_saw(r.content, secret):
                leaks.append(f"{carrier}/{enc_name}/{i}: {r.status_code}")
    assert leaks == []


@pytest.mark.parametrize("carrier", ["chat", "messages"])
def test_non_stream_response_evasion(gw: tuple[Env, GatewayThread], mock: MockProviderServer, carrier: str) -> None:
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    leaks = []
    for enc_name, encode in ENCODINGS.items():
        for i, secret in enumerate(SECRETS):
            bodies = []
            if carrier == "chat":
                base = '{"id":"c","object":"chat.completion","created":1,"model":"gpt-4.1","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant",%s}}]}'
                bodies.append(base % ('"content":"%s"' % encode(secret)))
                bodies.append(base % ('"content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"%s"}}]'
                                      % _at_depth(json.dumps({"k": "@@"}).replace("@@", encode(secret)), 2)))
                bodies.append(base % ('"content":"%s","content":"fine"' % encode(secret)))  # duplicate key
                route, body = CHAT, {"model": "gpt-4.1", "messages": [{"role": "user", "content": "mock-scenario:%s"}]}
            else:
                base = '{"id":"m","type":"message","role":"assistant","model":"c","content":[%s],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'
                bodies.append(base % ('{"type":"text","text":"%s"}' % encode(secret)))
                bodies.append(base % ('{"type":"tool_use","id":"t","name":"f","input":{"%s":1}}' % encode(secret)))  # as a key
                route, body = MSGS, {"model": "claude-test-model", "max_tokens": 9, "messages": [{"role": "user", "content": "mock-scenario:%s"}]}
            for raw in bodies:
                sid = "n" + uuid.uuid4().hex[:12]
                mock.state.add_scenario(sid, [{"raw_body": raw, "content_type": "application/json"}])
                payload = json.loads(json.dumps(body).replace("%s", sid))
                r = client.post(route, json=payload, headers=headers)
                if r.status_code not in (403, 503) or _client_saw(r.content, secret):
                    leaks.append(f"{carrier}/{enc_name}/{i}: {r.status_code}")
    assert leaks == []


# --- controls: the same bodies with harmless text go through ----------------------------

def test_control_requests_pass(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """Every placement renders a valid request that is sent when it holds nothing secret:
    the refusals above are about the secrets, not about malformed bodies."""
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"}
    failures = []
    for pname, placement in PLACEMENTS.items():
        for enc_name in ("json", "u_all", "zero_width", "fullwidth"):
            route, raw = _render(placement, "harmless words here", ENCODINGS[enc_name])
            r = client.post(route, content=raw, headers=headers)
            if r.status_code != 200:
                failures.append(f"{pname}/{enc_name}: {r.status_code} {r.text[:120]}")
    assert failures == []


@pytest.mark.parametrize("carrier", sorted(STREAMS))
@pytest.mark.parametrize("tool", [False, True], ids=["text", "tool_args"])
def test_control_streams_pass(gw: tuple[Env, GatewayThread], mock: MockProviderServer, carrier: str, tool: bool) -> None:
    env, gateway = gw
    route, make_events, make_body = STREAMS[carrier]
    content = json.dumps({"value": "all good, nothing to see"}) if tool else "here: all good é 日本 end"
    pieces = [ENCODINGS["u_some"](p) for p in _chunks(content)]
    sid = "c" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"raw_events": make_events(pieces, tool), "split_bytes": 61}])
    r = raw_client(gateway, env, uds=True).post(route, json=make_body(sid),
                                                 headers={"authorization": f"Bearer {env.gateway_key}"})
    assert r.status_code == 200
    events, clean = sse.parse_all(r.content)
    assert clean and len(events) == len(make_events(pieces, tool))
