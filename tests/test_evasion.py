"""The evasion suite: configured literals and credential formats hidden in every field of
every carrier, in every encoding. In requests none reaches the mock provider; in responses
none reaches the client. Zero leaks, counted over thousands of combinations."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits
from gateway.checks.window import json_string_text, significant
from gateway.inspection import decoders
from gateway.mockprovider import MockProviderServer
from gateway.units import STRUCTURAL_FIELDS
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, mock_profile, raw_client, sensitive
from tests.inspection.secret_samples import true_positives

LITERALS = [
    'acme"quote\\back-slash',  # a quote and a backslash
    "a.b*c+d?(e)[f]{g}|h^$-meta",  # regex metacharacters
    "pässwörd-日本-κλειδί-🔑",  # non-ASCII, an astral character too
    "plain-literal-0123456789",
]
NUMBER_LITERAL = "31415926535897932384626"  # leaks as a number's lexical form
CASELESS = "Project-Nightingale-Codename"  # configured with ignore_case
FORMAT_RULES = [
    "aws-access-key-id",
    "github-pat",
    "openai-project-key",
    "anthropic-api-key",
    "stripe-live-secret-key",
    "private-key-rsa",
    "jwt",
    "postgres-connection-uri",
    "slack-bot-token",
    "google-api-key",
    "slack-webhook-url",
    "gitlab-pat",
]
FORMAT_SECRETS = [true_positives(rule, n=1, seed=1234)[0] for rule in FORMAT_RULES]
SECRETS = LITERALS + FORMAT_SECRETS
sensitive(*FORMAT_SECRETS)  # sent, never configured: the session's log check looks for them too
PH = "@@SECRET@@"
PH1, PH2 = "@@PART1@@", "@@PART2@@"


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("evasion", secrets_=[*LITERALS, NUMBER_LITERAL, {"value": CASELESS, "ignore_case": True}]) as started:
        yield started


# Stream responses are checked under both release modes: buffered (the whole stream, then
# the check) and windowed (released as it arrives, holding back the policy's window).
WINDOW_CAP = 512


@pytest.fixture(scope="module", params=["buffered", "windowed"])
def stream_gw(
    request: pytest.FixtureRequest, gateways: GatewayFactory, mock: MockProviderServer
) -> Iterator[tuple[Env, GatewayThread, str]]:
    release = str(request.param)
    extra = {"profiles": _profiles(mock, release), "policy_extra": f"stream_window_cap = {WINDOW_CAP}\n"}
    with gateways(
        f"evasion-{release}",
        secrets_=[*LITERALS, NUMBER_LITERAL, {"value": CASELESS, "ignore_case": True}],
        **(extra if release == "windowed" else {}),
    ) as (env, gateway):
        yield env, gateway, release


def _profiles(mock: MockProviderServer, release: str) -> list[dict[str, Any]]:
    return [
        mock_profile("mock-openai", "openai", mock.url, release=release),
        mock_profile("mock-anthropic", "anthropic", mock.url, release=release),
    ]


# --- encodings of the secret inside a JSON string literal ------------------------------


def _u_escape(text: str, every: int = 1) -> str:
    out = []
    for i, ch in enumerate(text):
        if i % every:
            out.append(json.dumps(ch)[1:-1])
            continue
        encoded = ch.encode("utf-16-be")
        out.extend("\\u%04x" % int.from_bytes(encoded[j : j + 2], "big") for j in range(0, len(encoded), 2))
    return "".join(out)


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def _interleave(marks: str) -> Callable[[str], str]:
    """The value with one of `marks` (cycling) after every character, as JSON text."""

    def encode(s: str) -> str:
        out = "".join(ch + marks[i % len(marks)] for i, ch in enumerate(s))
        return json.dumps(out, ensure_ascii=False)[1:-1]

    return encode


def _tags(s: str) -> str:
    """ASCII smuggling: every ASCII character written as its Unicode tag character."""
    return json.dumps("".join(chr(0xE0000 + ord(c)) if " " <= c <= "~" else c for c in s), ensure_ascii=False)[1:-1]


def _text(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _backslash_x(s: str) -> str:
    out = []
    for ch in s:
        code = ord(ch)
        out.append(f"\\x{code:02x}" if code < 0x80 else (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"))
    return _text("".join(out))


def _percent_one(s: str) -> str:
    """Only the middle character percent-encoded: the classic way past a literal match."""
    mid = len(s) // 2
    return _text(s[:mid] + "".join("%%%02X" % b for b in s[mid].encode()) + s[mid + 1 :])


ENCODINGS: dict[str, Callable[[str], str]] = {
    "json": lambda s: json.dumps(s)[1:-1],
    "utf8": lambda s: json.dumps(s, ensure_ascii=False)[1:-1],
    "u_all": _u_escape,
    "u_some": lambda s: _u_escape(s, every=2),
    "escaped_slashes": lambda s: json.dumps(s)[1:-1].replace("/", "\\/"),
    "zero_width": lambda s: json.dumps("\u200b".join(s), ensure_ascii=False)[1:-1],
    "fullwidth": lambda s: json.dumps(_fullwidth(s), ensure_ascii=False)[1:-1],
    "soft_hyphen_u": lambda s: _u_escape("\u00ad".join(s), every=3),
    # invisible characters (issue: every Default_Ignorable code point, Cc and Cf)
    "lrm_rlm": _interleave("\u200e\u200f"),
    "bidi_embeddings": _interleave("\u202a\u202b\u202c\u202d\u202e"),
    "bidi_isolates": _interleave("\u2066\u2067\u2068\u2069"),
    "grapheme_joiner": _interleave("\u034f"),
    "variation_selectors": _interleave("\ufe00\ufe0f\U000e0100"),
    "hangul_filler": _interleave("\u3164"),
    "arabic_letter_mark": _interleave("\u061c"),
    "mongolian_selectors": _interleave("\u180b\u180c\u180d\u180e\u180f"),
    "nul": lambda s: json.dumps("\x00".join(s))[1:-1],
    "c0_controls": lambda s: json.dumps("".join(c + chr(1 + i % 8) for i, c in enumerate(s)))[1:-1],
    "tag_characters": _tags,
    # encodings inside a string (decoded, one level nested, and scanned)
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
    "base64url": lambda s: base64.urlsafe_b64encode(s.encode()).decode().rstrip("="),
    "hex": lambda s: s.encode().hex(),
    "percent_all": lambda s: "".join("%%%02X" % b for b in s.encode()),
    "percent_one": _percent_one,
    "html_decimal": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "html_hex_some": lambda s: _text("".join(f"&#x{ord(c):x};" if i % 2 else c for i, c in enumerate(s))),
    "backslash_x": _backslash_x,
    "base64_of_hex": lambda s: base64.b64encode(s.encode().hex().encode()).decode(),
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
    "chat.tool_description": _p(
        CHAT,
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "description": f"use {PH}", "parameters": {"type": "object"}},
                }
            ]
        ),
    ),
    "chat.tool_schema_key": _p(
        CHAT,
        _chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {PH: {"type": "string"}}}},
                }
            ]
        ),
    ),
    "chat.tool_call_args": _p(
        CHAT,
        _chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": _args({"token": PH})}}
                    ],
                }
            ]
        ),
        depth=2,
    ),
    "chat.tool_call_args_double": _p(
        CHAT,
        _chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": _args({"payload": _args({"k": PH})})},
                        }
                    ],
                }
            ]
        ),
        depth=3,
    ),
    "chat.tool_result": _p(CHAT, _chat(messages=[{"role": "tool", "tool_call_id": "c", "content": f"result {PH}"}])),
    "chat.tool_result_json": _p(
        CHAT, _chat(messages=[{"role": "tool", "tool_call_id": "c", "content": _args({"out": PH})}]), depth=2
    ),
    "chat.metadata": _p(CHAT, _chat(metadata={"note": PH})),
    "chat.user_field": _p(CHAT, _chat(user=PH)),
    "chat.unknown_field": _p(CHAT, _chat(x_vendor_extension={"deep": [{"deeper": PH}]})),
    "chat.object_key": _p(CHAT, _chat(metadata={PH: "v"})),
    "chat.split_parts": _p(
        CHAT,
        _chat(messages=[{"role": "user", "content": [{"type": "text", "text": PH1}, {"type": "text", "text": PH2}]}]),
    ),
    "responses.instructions": _p(RESP, {"model": "gpt-5", "instructions": PH, "input": "hi"}),
    "responses.input_string": _p(RESP, {"model": "gpt-5", "input": f"see {PH}"}),
    "responses.input_text": _p(
        RESP, {"model": "gpt-5", "input": [{"role": "user", "content": [{"type": "input_text", "text": PH}]}]}
    ),
    "responses.function_call": _p(
        RESP,
        {
            "model": "gpt-5",
            "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": _args({"a": PH})}],
        },
        depth=2,
    ),
    "responses.function_output": _p(
        RESP, {"model": "gpt-5", "input": [{"type": "function_call_output", "call_id": "c", "output": PH}]}
    ),
    "responses.tool_description": _p(
        RESP,
        {
            "model": "gpt-5",
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "description": PH, "parameters": {}}],
        },
    ),
    "responses.split_parts": _p(
        RESP,
        {
            "model": "gpt-5",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": PH1}, {"type": "input_text", "text": PH2}]}
            ],
        },
    ),
    "messages.system_string": _p(
        MSGS,
        {"model": "claude-test-model", "max_tokens": 9, "system": PH, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "messages.system_blocks": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "system": [{"type": "text", "text": PH1}, {"type": "text", "text": PH2}],
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    "messages.text_block": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": [{"type": "text", "text": PH}]}],
        },
    ),
    "messages.document_text": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": PH}}
                    ],
                }
            ],
        },
    ),
    "messages.tool_use_input": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": PH}}]}
            ],
        },
    ),
    "messages.tool_result": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": PH}]}],
                }
            ],
        },
    ),
    "messages.tools": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "description": PH, "input_schema": {"type": "object"}}],
        },
    ),
    "messages.metadata_user": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "metadata": {"user_id": PH},
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    "messages.split_parts": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": [{"type": "text", "text": PH1}, {"type": "text", "text": PH2}]}],
        },
    ),
    "embeddings.input": _p(EMB, {"model": "text-embedding-3-small", "input": ["fine", PH]}),
}


# Encodings of a whole value into one run: a value split across parts is encoded first and
# the run split (each half encoded on its own is no longer one run; configured literals
# are still found that way, see test_split_then_encoded_literals).
WHOLE_RUN = frozenset({"base64", "base64url", "hex", "base64_of_hex"})


def _render(placement: Placement, secret: str, encode: Callable[[str], str], name: str = "") -> tuple[str, bytes]:
    route, text, depth = placement
    half = len(secret) // 2
    first, second = encode(secret[:half]), encode(secret[half:])
    if name in WHOLE_RUN:
        whole = encode(secret)
        first, second = whole[: len(whole) // 2], whole[len(whole) // 2 :]
    raw = (
        text.replace(PH, _at_depth(encode(secret), depth))
        .replace(PH1, _at_depth(first, depth))
        .replace(PH2, _at_depth(second, depth))
    )
    return route, raw.encode("utf-8", "surrogatepass")


def _send_all(
    env: Env, gateway: GatewayThread, mock: MockProviderServer, bodies: list[tuple[str, str, bytes]]
) -> list[str]:
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
            route, raw = _render(placement, secret, ENCODINGS[encoding], encoding)
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
            raw = (
                '{"model":"gpt-4.1","messages":[{"role":"user","content":%s,"content":%s}]}' % (first, second)
            ).encode()
            bodies.append((f"dup/{i}", CHAT, raw))
            raw = (
                '{"model":"gpt-4.1","messages":[],"metadata":{"k":%s},"metadata":{"k":%s}}' % (first, second)
            ).encode()
            bodies.append((f"dup-object/{i}", CHAT, raw))
    assert _send_all(env, gateway, mock, bodies) == []


def test_number_lexical_form(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    raws = [
        '{"model":"gpt-4.1","messages":[],"seed":%s}' % NUMBER_LITERAL,
        '{"model":"gpt-4.1","messages":[],"metadata":{"n":-%s.5e3}}' % NUMBER_LITERAL,
        '{"model":"gpt-4.1","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\\"n\\": %s}"}}]}]}'
        % NUMBER_LITERAL,
    ]
    assert _send_all(env, gateway, mock, [(f"num/{i}", CHAT, r.encode()) for i, r in enumerate(raws)]) == []


# --- responses: the model emits it ----------------------------------------------------


def _chunks(text: str, size: int | None = None) -> list[str]:
    """Small pieces (a secret is never whole in one event): at most ~24 of them, or pieces
    of `size` characters."""
    size = size or max(3, len(text) // 24)
    return [text[i : i + size] for i in range(0, len(text), size)]


# Text around a secret, so that a windowed release has something to release before it
# (and after it, something it must never release). It shares no 4 characters with a secret.
FILL = " ".join("~~~~" for _ in range(120))


def _released_views(body: bytes) -> list[str]:
    """Everything a client read in the events it got, as it would read it: every string of
    every event joined, JSON escapes inside them decoded (tool arguments), normalised
    (invisible characters removed, NFKC)."""
    events, _ = sse.parse_all(body)
    strings: list[str] = []

    def leaves(node: Any) -> None:
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, dict):
            for key, value in node.items():
                if key not in STRUCTURAL_FIELDS:  # "chat.completion.chunk" holds ".com"
                    leaves(value)
        elif isinstance(node, list):
            for value in node:
                leaves(value)

    for event in events:
        try:
            doc = json.loads(event.data)
        except ValueError:
            continue
        if isinstance(doc, dict) and ("error" in doc or doc.get("type") == "error"):
            continue  # the gateway's own error event: its message is ours, not the model's
        leaves(doc)
    text = "".join(strings)
    once = json_string_text(text)
    return [view for t in (text, once, json_string_text(once)) for view in (t, decoders.squeeze(t))]


def _grams(text: str, n: int = 4) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)}


def _partly_released(body: bytes, *forms: str) -> bool:
    """Did any 4 consecutive characters of any form of the secret reach the client?"""
    grams = set().union(*(_grams(decoders.squeeze(f)) for f in forms)) - _grams(FILL)
    return any(_grams(view) & grams for view in _released_views(body))


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
    events.append(
        'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4.1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    )
    events.append("data: [DONE]\n\n")
    return events


def _responses_events(pieces: list[str], tool: bool) -> list[str]:
    kind = "response.function_call_arguments.delta" if tool else "response.output_text.delta"
    events = [
        'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress","output":[]}}\n\n'
    ]
    for piece in pieces:
        events.append(
            'event: %s\ndata: {"type":"%s","item_id":"i1","output_index":0,"content_index":0,"delta":"%s"}\n\n'
            % (kind, kind, piece)
        )
    events.append(
        'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r1","status":"completed","output":[]}}\n\n'
    )
    return events


def _anthropic_events(pieces: list[str], tool: bool) -> list[str]:
    block = '{"type":"tool_use","id":"t1","name":"f","input":{}}' if tool else '{"type":"text","text":""}'
    dtype, field = ("input_json_delta", "partial_json") if tool else ("text_delta", "text")
    events = [
        'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[],"model":"c","usage":{"input_tokens":1,"output_tokens":1}}}\n\n',
        'event: content_block_start\ndata: {"type":"content_block_start","index":0,"content_block":%s}\n\n' % block,
    ]
    for piece in pieces:
        events.append(
            'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"%s","%s":"%s"}}\n\n'
            % (dtype, field, piece)
        )
    events += [
        'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n',
        'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}\n\n',
        'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    ]
    return events


STREAMS = {
    "chat": (
        CHAT,
        _chat_events,
        lambda sid: {
            "model": "gpt-4.1",
            "stream": True,
            "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
        },
    ),
    "responses": (
        RESP,
        _responses_events,
        lambda sid: {"model": "gpt-5", "stream": True, "input": f"mock-scenario:{sid}"},
    ),
    "messages": (
        MSGS,
        _anthropic_events,
        lambda sid: {
            "model": "claude-test-model",
            "max_tokens": 9,
            "stream": True,
            "messages": [{"role": "user", "content": f"mock-scenario:{sid}"}],
        },
    ),
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


def _refused(r: Any, release: str) -> bool:
    """Buffered: a 403. Windowed: a 403, or (once the stream had started) the protocol's
    error event as the last event."""
    if r.status_code == 403:
        return True
    if release != "windowed" or r.status_code != 200:
        return False
    events, _ = sse.parse_all(r.content)
    return bool(events) and '"error"' in events[-1].data


@pytest.mark.parametrize("carrier", sorted(STREAMS))
@pytest.mark.parametrize("tool", [False, True], ids=["text", "tool_args"])
def test_stream_response_evasion(
    stream_gw: tuple[Env, GatewayThread, str], mock: MockProviderServer, carrier: str, tool: bool
) -> None:
    env, gateway, release = stream_gw
    route, make_events, make_body = STREAMS[carrier]
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    leaks = []
    for enc_name in ("json", "utf8", "u_all", "u_some", "escaped_slashes", "zero_width", "fullwidth"):
        encode = ENCODINGS[enc_name]
        for i, secret in enumerate(SECRETS):
            content = json.dumps({"pad": FILL, "value": secret, "tail": FILL}) if tool else f"{FILL} {secret} {FILL}"
            # the text is split into pieces, each JSON-escaped on its own (raw is never whole)
            pieces = [encode(p) if not tool else _at_depth(encode(p), 1) for p in _chunks(content, 7)]
            if enc_name in ("zero_width", "fullwidth") and tool:
                hidden = "\u200b".join(secret) if enc_name == "zero_width" else _fullwidth(secret)
                inner = json.dumps({"pad": FILL, "value": hidden, "tail": FILL}, ensure_ascii=False)
                pieces = [json.dumps(p, ensure_ascii=False)[1:-1] for p in _chunks(inner, 7)]
            sid = "e" + uuid.uuid4().hex[:12]
            # every third stream also arrives in odd-sized TCP writes, splitting events and
            # multi-byte characters across reads
            split = {"split_bytes": 61} if i % 3 == 0 else {}
            mock.state.add_scenario(sid, [{"raw_events": make_events(pieces, tool), **split}])
            r = client.post(route, json=make_body(sid), headers=headers)
            if not _refused(r, release) or _client_saw(r.content, secret) or _partly_released(r.content, secret):
                leaks.append(f"{carrier}/{enc_name}/{i}: {r.status_code}")
    assert leaks == []


@pytest.mark.parametrize("carrier", sorted(STREAMS))
def test_stream_response_evasion_encoded(
    stream_gw: tuple[Env, GatewayThread, str], mock: MockProviderServer, carrier: str
) -> None:
    """Every encoding of the suite, streamed in 7-character deltas between plain text: no
    part of the secret reaches the client in either release mode. Windowed: an encoded form
    longer than the window may begin before the window ends, so for those only the whole
    secret is checked (the documented limit of a capped window)."""
    env, gateway, release = stream_gw
    route, make_events, make_body = STREAMS[carrier]
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    assert not (_grams(FILL) & set().union(*(_grams(decoders.squeeze(s)) for s in SECRETS)))
    leaks, partial_checked = [], 0
    for enc_name, encode in sorted(ENCODINGS.items()):
        for i, secret in enumerate(SECRETS):
            hidden = json.loads(f'"{encode(secret)}"')
            text = f"{FILL} {hidden} {FILL}"
            pieces = [json.dumps(p, ensure_ascii=False)[1:-1] for p in _chunks(text, 7)]
            sid = "x" + uuid.uuid4().hex[:12]
            split = {"split_bytes": 97} if i % 5 == 0 else {}
            mock.state.add_scenario(sid, [{"raw_events": make_events(pieces, False), **split}])
            r = client.post(route, json=make_body(sid), headers=headers)
            if not _refused(r, release) or _client_saw(r.content, secret):
                leaks.append(f"{carrier}/{enc_name}/{i}: {r.status_code}")
            elif significant(hidden) <= WINDOW_CAP:
                partial_checked += 1
                if _partly_released(r.content, secret, hidden):
                    leaks.append(f"{carrier}/{enc_name}/{i}: partly released")
    assert leaks == []
    assert partial_checked > len(ENCODINGS) * len(SECRETS) // 2


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
                bodies.append(
                    base
                    % (
                        '"content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"%s"}}]'
                        % _at_depth(json.dumps({"k": "@@"}).replace("@@", encode(secret)), 2)
                    )
                )
                bodies.append(base % ('"content":"%s","content":"fine"' % encode(secret)))  # duplicate key
                route, body = CHAT, {"model": "gpt-4.1", "messages": [{"role": "user", "content": "mock-scenario:%s"}]}
            else:
                base = '{"id":"m","type":"message","role":"assistant","model":"c","content":[%s],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}'
                bodies.append(base % ('{"type":"text","text":"%s"}' % encode(secret)))
                bodies.append(
                    base % ('{"type":"tool_use","id":"t","name":"f","input":{"%s":1}}' % encode(secret))
                )  # as a key
                route, body = (
                    MSGS,
                    {
                        "model": "claude-test-model",
                        "max_tokens": 9,
                        "messages": [{"role": "user", "content": "mock-scenario:%s"}],
                    },
                )
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
def test_control_streams_pass(
    stream_gw: tuple[Env, GatewayThread, str], mock: MockProviderServer, carrier: str, tool: bool
) -> None:
    env, gateway, _ = stream_gw
    route, make_events, make_body = STREAMS[carrier]
    text = f"{FILL} here: all good é 日本 end {FILL}"
    content = json.dumps({"value": text}) if tool else text
    pieces = [ENCODINGS["u_some"](p) for p in _chunks(content, 7)]
    sid = "c" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"raw_events": make_events(pieces, tool), "split_bytes": 61}])
    r = raw_client(gateway, env, uds=True).post(
        route, json=make_body(sid), headers={"authorization": f"Bearer {env.gateway_key}"}
    )
    assert r.status_code == 200
    events, clean = sse.parse_all(r.content)
    assert clean and len(events) == len(make_events(pieces, tool))
    folded = CARRIERS[{CHAT: "openai.chat", MSGS: "anthropic.messages", RESP: "openai.responses"}[route]].fold_stream(
        events, CarrierLimits()
    )
    assert folded.complete and any(u.kind == "folded" and u.text == content for u in folded.units)


# --- configured literals split across parts, joined in document order ------------------

LITERAL_SPLITS: dict[str, Placement] = {
    "chat.two_messages": _p(
        CHAT, _chat(messages=[{"role": "user", "content": PH1}, {"role": "assistant", "content": PH2}])
    ),
    "chat.name_then_content": _p(CHAT, _chat(messages=[{"role": "user", "name": PH1, "content": PH2}])),
    "chat.system_then_user": _p(
        CHAT,
        _chat(messages=[{"role": "system", "content": f"rules {PH1}"}, {"role": "user", "content": f"{PH2} please"}]),
    ),
    "chat.tool_args_across_calls": _p(
        CHAT,
        _chat(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": PH1}},
                        {"id": "b", "type": "function", "function": {"name": "f", "arguments": PH2}},
                    ],
                }
            ]
        ),
    ),
    "responses.two_items": _p(
        RESP,
        {
            "model": "gpt-5",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": PH1}]},
                {"role": "user", "content": [{"type": "input_text", "text": PH2}]},
            ],
        },
    ),
    "messages.system_then_message": _p(
        MSGS,
        {"model": "claude-test-model", "max_tokens": 9, "system": PH1, "messages": [{"role": "user", "content": PH2}]},
    ),
    "messages.two_turns": _p(
        MSGS,
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "messages": [
                {"role": "user", "content": PH1},
                {"role": "assistant", "content": PH2},
                {"role": "user", "content": "ok"},
            ],
        },
    ),
    "embeddings.two_inputs": _p(EMB, {"model": "text-embedding-3-small", "input": [PH1, PH2]}),
}
LITERAL_ENCODINGS: dict[str, Callable[[str], str]] = {
    "json": ENCODINGS["json"],
    "newlines": lambda s: json.dumps("\n".join(s))[1:-1],
    "tabs_and_cr": lambda s: json.dumps("".join(c + "\t\r"[i % 2] for i, c in enumerate(s)))[1:-1],
    "base64_each_part": ENCODINGS["base64"],  # each part encoded on its own
    "hex_each_part": ENCODINGS["hex"],
}


@pytest.mark.parametrize("encoding", sorted(LITERAL_ENCODINGS))
def test_configured_literals_split_across_parts(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, encoding: str
) -> None:
    env, gateway = gw
    bodies = []
    for pname, placement in LITERAL_SPLITS.items():
        for i, secret in enumerate([*LITERALS, CASELESS]):
            route, raw = _render(placement, secret, LITERAL_ENCODINGS[encoding])
            bodies.append((f"{pname}/{encoding}/literal{i}", route, raw))
    assert _send_all(env, gateway, mock, bodies) == []


def test_case_insensitive_literal_is_an_option(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    env, gateway = gw
    refused = [
        (f"caseless/{v}", CHAT, json.dumps(_chat(user=v)).encode())
        for v in (CASELESS, CASELESS.lower(), CASELESS.upper(), "pROJECT-nIGHTINGALE-cODENAME")
    ]
    assert _send_all(env, gateway, mock, refused) == []
    # the others stay case-sensitive (the default): a change of case is not the value
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    r = client.post(CHAT, json=_chat(user=LITERALS[3].upper()), headers=headers)
    assert r.status_code == 200


def test_controls_split_parts_pass(gw: tuple[Env, GatewayThread]) -> None:
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"}
    failures = []
    for pname, placement in LITERAL_SPLITS.items():
        for enc_name, encode in LITERAL_ENCODINGS.items():
            route, raw = _render(placement, "harmless words here", encode)
            r = client.post(route, content=raw, headers=headers)
            if r.status_code != 200:
                failures.append(f"{pname}/{enc_name}: {r.status_code}")
    assert failures == []


# --- JSON inside strings ------------------------------------------------------------------


def _nested(value: Any, levels: int) -> str:
    for _ in range(levels):
        value = json.dumps({"k": value})
    return value


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_json_in_embeddings_input_is_read(gw: tuple[Env, GatewayThread], mock: MockProviderServer, levels: int) -> None:
    env, gateway = gw
    bodies = []
    for i, secret in enumerate(SECRETS):
        inner = _nested(secret, levels)  # json.dumps escapes: the secret is never verbatim past level 1
        bodies.append(
            (f"emb/{levels}/{i}", EMB, json.dumps({"model": "text-embedding-3-small", "input": [inner]}).encode())
        )
        bodies.append(
            (f"emb-str/{levels}/{i}", EMB, json.dumps({"model": "text-embedding-3-small", "input": inner}).encode())
        )
    assert _send_all(env, gateway, mock, bodies) == []


def _escaped_deep(secret: str, levels: int) -> str:
    """JSON text nested `levels` deep whose innermost string holds the secret written only
    as \\u escapes (so no decoded layer short of the last shows it)."""
    inner = '{"k": "%s"}' % _u_escape(secret)
    for _ in range(levels - 1):
        inner = json.dumps({"k": inner})
    return inner


def test_json_nested_past_the_budget_is_withheld(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """embedded_json_depth is 3: JSON four levels down whose strings still hold escapes is
    not read, so the call is withheld (too_deep) rather than sent unread — whether or not
    a secret is in it; three levels are read (and a secret there is blocked)."""
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    before = len(mock.state.records())
    for value in (LITERALS[3], "nothing secret, just deep"):
        secret = value == LITERALS[3]
        for route, body in (
            (CHAT, _chat(metadata={"x": _escaped_deep(value, 4)})),
            (CHAT, _chat(user=_escaped_deep(value, 5))),
            (EMB, {"model": "text-embedding-3-small", "input": [_escaped_deep(value, 4)]}),
        ):
            r = client.post(route, json=body, headers=headers)
            reasons = r.json()["error"]["reason_codes"]
            # the backslash-escape decoder may still see the secret: blocked, and too deep besides
            assert "too_deep" in reasons, r.text
            assert (
                (r.status_code, reasons) in ((422, ["too_deep"]), (403, ["secret_value", "too_deep"]))
                if secret
                else (r.status_code, reasons) == (422, ["too_deep"])
            )
    r = client.post(CHAT, json=_chat(metadata={"x": _escaped_deep(LITERALS[3], 3)}), headers=headers)
    assert r.status_code == 403 and r.json()["error"]["reason_codes"] == ["secret_value"]
    assert len(mock.state.records()) == before
    r = client.post(CHAT, json=_chat(metadata={"x": _escaped_deep("nothing secret", 3)}), headers=headers)
    assert r.status_code == 200  # within the budget: read and sent


# --- stream shapes beyond the usual fields (generated by the mock) -------------------------

SHAPES: dict[str, tuple[str, Callable[[str], dict[str, Any]], dict[str, Any]]] = {
    "chat.reasoning": (CHAT, STREAMS["chat"][2], {"text_field": "reasoning"}),
    "chat.reasoning_content": (CHAT, STREAMS["chat"][2], {"text_field": "reasoning_content"}),
    "chat.refusal": (CHAT, STREAMS["chat"][2], {"text_field": "refusal"}),
    "chat.audio_transcript": (CHAT, STREAMS["chat"][2], {"text_field": "audio.transcript"}),
    "chat.legacy_function_call": (CHAT, STREAMS["chat"][2], {"text_field": "function_call.arguments"}),
    "messages.thinking": (MSGS, STREAMS["messages"][2], {"text_field": "thinking"}),
    "messages.text_in_block_start": (MSGS, STREAMS["messages"][2], {"start_text_chars": 6}),
    "responses.reasoning_summary": (RESP, STREAMS["responses"][2], {"text_field": "reasoning_summary_text"}),
    "responses.unknown_event_family": (RESP, STREAMS["responses"][2], {"text_field": "future_widget_text"}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_stream_shapes_fold_every_field(
    stream_gw: tuple[Env, GatewayThread, str], mock: MockProviderServer, shape: str
) -> None:
    env, gateway, release = stream_gw
    route, make_body, options = SHAPES[shape]
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    leaks = []
    for i, secret in enumerate(SECRETS):
        sid = "s" + uuid.uuid4().hex[:12]
        mock.state.add_scenario(sid, [{"text": f"{FILL} {secret} {FILL}", "chunk_size": 3, **options}])
        r = client.post(route, json=make_body(sid), headers=headers)
        if not _refused(r, release) or _client_saw(r.content, secret) or _partly_released(r.content, secret):
            leaks.append(f"{shape}/{i}: {r.status_code}")
    assert leaks == []
    # control: the same shape with nothing secret is released whole
    sid = "s" + uuid.uuid4().hex[:12]
    mock.state.add_scenario(sid, [{"text": "here: all good, nothing to see end", "chunk_size": 3, **options}])
    r = client.post(route, json=make_body(sid), headers=headers)
    assert r.status_code == 200
    events, clean = sse.parse_all(r.content)
    carrier = {CHAT: "openai.chat", MSGS: "anthropic.messages", RESP: "openai.responses"}[route]
    folded = CARRIERS[carrier].fold_stream(events, CarrierLimits())
    assert clean and folded.complete
    assert any(u.kind == "folded" and u.text == "here: all good, nothing to see end" for u in folded.units)


# --- non-stream responses of the Responses and embeddings carriers ---------------------------


def _responses_bodies(secret_json: str) -> list[str]:
    base = '{"id":"r","object":"response","status":"completed","error":null,"model":"gpt-5","output":[%s],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}'
    return [
        base
        % (
            '{"type":"message","id":"m","role":"assistant","status":"completed","content":[{"type":"output_text","text":"%s","annotations":[]}]}'
            % secret_json
        ),
        base
        % (
            '{"type":"function_call","id":"f","call_id":"c","name":"f","arguments":"%s","status":"completed"}'
            % json.dumps(json.dumps({"k": "@@"}))[1:-1].replace(
                "@@", secret_json.replace("\\", "\\\\").replace('"', '\\"')
            )
        ),
        base % ('{"type":"reasoning","id":"x","summary":[{"type":"summary_text","text":"%s"}]}' % secret_json),
    ]


def _embeddings_bodies(secret_json: str) -> list[str]:
    usage = '"usage":{"prompt_tokens":1,"total_tokens":1}'
    return [
        '{"object":"list","model":"e","data":"%s",%s}' % (secret_json, usage),  # data as a string
        '{"object":"list","model":"e","data":{"note":"%s"},%s}' % (secret_json, usage),  # data as an object
        '{"object":"list","model":"e","data":[{"object":"embedding","index":0,"embedding":"%s"}],%s}'
        % (secret_json, usage),
        '{"object":"list","model":"e","data":[{"object":"embedding","index":0,"embedding":{"v":"%s"}}],%s}'
        % (secret_json, usage),
        '{"object":"list","model":"e","data":[{"object":"embedding","index":0,"embedding":[0.1,"%s"]}],%s}'
        % (secret_json, usage),
    ]


@pytest.mark.parametrize("carrier", ["responses", "embeddings"])
def test_non_stream_response_evasion_more_carriers(
    gw: tuple[Env, GatewayThread], mock: MockProviderServer, carrier: str
) -> None:
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    leaks = []
    for enc_name in ("json", "utf8", "u_all", "zero_width", "tag_characters", "base64"):
        for i, secret in enumerate(SECRETS):
            make = _responses_bodies if carrier == "responses" else _embeddings_bodies
            for n, raw in enumerate(make(ENCODINGS[enc_name](secret))):
                sid = "n" + uuid.uuid4().hex[:12]
                mock.state.add_scenario(sid, [{"raw_body": raw, "content_type": "application/json"}])
                if carrier == "responses":
                    route, body = RESP, {"model": "gpt-5", "input": f"mock-scenario:{sid}"}
                else:
                    route, body = EMB, {"model": "text-embedding-3-small", "input": f"mock-scenario:{sid}"}
                r = client.post(route, json=body, headers=headers)
                if r.status_code not in (403, 503) or _client_saw(r.content, secret):
                    leaks.append(f"{carrier}/{enc_name}/{i}/{n}: {r.status_code}")
    assert leaks == []


def test_well_formed_embeddings_are_released(gw: tuple[Env, GatewayThread], mock: MockProviderServer) -> None:
    """Control: vectors in the shape the API defines (floats, or base64 float32) pass."""
    env, gateway = gw
    client = raw_client(gateway, env, uds=True)
    headers = {"authorization": f"Bearer {env.gateway_key}"}
    for fmt in ("float", "base64"):
        r = client.post(
            EMB, json={"model": "text-embedding-3-small", "input": ["a", "b"], "encoding_format": fmt}, headers=headers
        )
        assert r.status_code == 200 and len(r.json()["data"]) == 2
