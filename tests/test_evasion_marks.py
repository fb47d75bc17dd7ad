"""Forms a reader reads straight through, sent through a real gateway to the bundled mock
provider in every carrier: a combining mark after each character (strike-through,
underline, accents — `decoders.normalise` removes them before NFKC, which would compose
some into new letters), letters and digits in parentheses (NFKC spells them "(p)"), line
and paragraph separators between the characters (the copy for configured values removes
them like newlines), and a surrogate pair escaped in upper-case hex outside a parsed
document (decoded as one character), and a percent-encoded, entity or escaped value cut by
raw NUL characters inside one string (NUL also separates units where the engine decodes:
such a string is decoded whole without them too). Each is refused and nothing reaches the
provider; ordinary accented and parenthesised text still goes through."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.inspection import decoders, literals
from gateway.mockprovider import MockProviderServer
from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread, raw_client
from tests.inspection.secret_samples import true_positives

PLAIN = "plain-literal-0123456789"
ACCENTED = "pässwörd-日本-κλειδί-🔑"
CASELESS = "Project-Nightingale-Codename"
GW = tuple[Env, GatewayThread]


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[GW]:
    secrets: list[Any] = [PLAIN, ACCENTED, {"value": CASELESS, "ignore_case": True}]
    with gateways("evasion-marks", secrets_=secrets) as started:
        yield started


PLACE: dict[str, Callable[[str], tuple[str, dict[str, Any]]]] = {
    "chat.user": lambda t: ("/v1/chat/completions", {"model": "gpt-4.1", "messages": [{"role": "user", "content": t}]}),
    "chat.tool_description": lambda t: (
        "/v1/chat/completions",
        {
            "model": "gpt-4.1",
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "description": t, "parameters": {}}}],
        },
    ),
    "responses.instructions": lambda t: ("/v1/responses", {"model": "gpt-5", "instructions": t, "input": "hi"}),
    "messages.system": lambda t: (
        "/v1/messages",
        {
            "model": "claude-test-model",
            "max_tokens": 9,
            "system": [{"type": "text", "text": t}],
            "messages": [{"role": "user", "content": "hi"}],
        },
    ),
    "embeddings.input": lambda t: ("/v1/embeddings", {"model": "text-embedding-3-small", "input": [t]}),
}


def _send(gw: GW, mock: MockProviderServer, placement: str, text: str) -> tuple[int, bool]:
    env, gateway = gw
    route, body = PLACE[placement](text)
    before = len(mock.state.records())
    r = raw_client(gateway, env, uds=True).post(
        route,
        content=json.dumps(body, ensure_ascii=False).encode(),
        headers={"authorization": f"Bearer {env.gateway_key}", "content-type": "application/json"},
    )
    return r.status_code, len(mock.state.records()) != before


def _refused(gw: GW, mock: MockProviderServer, placement: str, text: str) -> None:
    status, reached = _send(gw, mock, placement, text)
    assert status == 403 and not reached, (placement, status, reached)


def _marked(value: str, mark: str) -> str:
    return "".join(c + mark for c in value)


def _parenthesised(value: str) -> str:
    out = []
    for c in value:
        if "a" <= c <= "z":
            out.append(chr(0x249C + ord(c) - 0x61))  # ⒜–⒵
        elif "1" <= c <= "9":
            out.append(chr(0x2474 + ord(c) - 0x31))  # ⑴–⑼
        else:
            out.append(c)
    return "".join(out)


MARKS = {"strike": "\u0336", "underline": "\u0332", "acute": "\u0301", "macron-below": "\u0331"}


@pytest.mark.parametrize("placement", sorted(PLACE))
@pytest.mark.parametrize("mark", sorted(MARKS))
def test_a_mark_after_each_character(gw: GW, mock: MockProviderServer, placement: str, mark: str) -> None:
    _refused(gw, mock, placement, "my key: " + _marked(PLAIN, MARKS[mark]))


@pytest.mark.parametrize("value", [ACCENTED, CASELESS, CASELESS.upper()])
def test_a_mark_after_each_character_of_any_value(gw: GW, mock: MockProviderServer, value: str) -> None:
    _refused(gw, mock, "chat.user", _marked(value, "\u0336"))


def test_a_mark_after_each_character_of_a_value_written_decomposed(gw: GW, mock: MockProviderServer) -> None:
    _refused(gw, mock, "chat.user", _marked(unicodedata.normalize("NFD", ACCENTED), "\u0332"))


@pytest.mark.parametrize("rule", ["aws-access-key-id", "github-pat", "jwt"])
def test_a_mark_after_each_character_of_a_catalogue_credential(gw: GW, mock: MockProviderServer, rule: str) -> None:
    credential = true_positives(rule, n=1, seed=1234)[0]
    _refused(gw, mock, "chat.user", f"x {credential} y")  # the control: refused as written
    _refused(gw, mock, "chat.user", "x " + _marked(credential, "\u0336") + " y")


@pytest.mark.parametrize("placement", sorted(PLACE))
def test_parenthesised_letters_and_digits(gw: GW, mock: MockProviderServer, placement: str) -> None:
    _refused(gw, mock, placement, _parenthesised(PLAIN))


@pytest.mark.parametrize("placement", sorted(PLACE))
@pytest.mark.parametrize("separator", ["\u2028", "\u2029"])
def test_line_and_paragraph_separators_between_characters(
    gw: GW, mock: MockProviderServer, placement: str, separator: str
) -> None:
    _refused(gw, mock, placement, separator.join(PLAIN))


def test_a_surrogate_pair_escaped_in_upper_case(gw: GW, mock: MockProviderServer) -> None:
    escaped = json.dumps(ACCENTED)[1:-1]  # p\u00e4ssw\u00f6rd-...\ud83d\udd11
    upper = escaped.replace("\\ud83d\\udd11", "\\uD83D\\uDD11").replace("\\u00e4", "\\u00E4")
    assert upper != escaped and "\\uD83D\\uDD11" in upper
    _refused(gw, mock, "chat.user", "Result: " + upper)


def _percent(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


NUL_CUT = {
    "percent around an invisible": lambda v: _percent(v[:9]) + "\x00%E2%80%8B\x00" + _percent(v[9:]),
    "percent around %00": lambda v: _percent(v[:9]) + "\x00%00\x00" + _percent(v[9:]),
    "percent, every character": lambda v: "\x00%E2%80%8B\x00".join(_percent(c) for c in v),
    "entities": lambda v: (
        "".join(f"&#{ord(c)};" for c in v[:9]) + "\x00&#8203;\x00" + "".join(f"&#{ord(c)};" for c in v[9:])
    ),
    "escapes": lambda v: (
        "".join(f"\\x{b:02x}" for b in v[:9].encode())
        + "\x00\\u200b\x00"
        + "".join(f"\\x{b:02x}" for b in v[9:].encode())
    ),
}


@pytest.mark.parametrize("placement", ["chat.user", "embeddings.input", "messages.system"])
@pytest.mark.parametrize("form", sorted(NUL_CUT))
def test_an_encoded_value_cut_by_nul_characters(gw: GW, mock: MockProviderServer, placement: str, form: str) -> None:
    _refused(gw, mock, placement, NUL_CUT[form](PLAIN))


@pytest.mark.parametrize(
    "text",
    [
        "Café, résumé, naïve — Ångström über Straße",
        "दिल्ली हिन्दी",  # Devanagari: vowel signs are combining marks
        "Tiếng Việt có dấu",
        "steps ⑴ mix ⑵ bake, options ⒜ and ⒝",
        "first line\u2028second line",
        "a%20tool\x00output%21 with &#38; and \\x41",
    ],
)
def test_ordinary_text_with_marks_and_parentheses_goes_through(gw: GW, mock: MockProviderServer, text: str) -> None:
    status, reached = _send(gw, mock, "chat.user", text)
    assert status == 200 and reached


def test_the_normalised_copy_and_the_value_forms() -> None:
    assert decoders.normalise(_marked("plain", "\u0336")) == "plain"
    assert decoders.normalise("p\u0301lain") == "plain"  # not the composed ṕ
    assert decoders.normalise("⒫⒧⒜⒤⒩ ⑴⒉") == "plain 12"
    assert decoders.normalise("Café") == "Café"  # a precomposed letter stays
    assert decoders.squeeze_encoded("a\u2028b\u2029c".encode()) == b"abc"
    assert decoders.unmarked("pässwörd") == "password"
    assert "password-日本".encode() in literals.variants("pässwörd-日本")
    assert decoders._backslashes(b"\\uD83D\\uDD11 \\ud83d\\udd11") == "🔑 🔑".encode()
