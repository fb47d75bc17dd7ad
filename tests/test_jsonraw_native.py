"""The native JSON reader (gateway/carriers/_jsonraw_native.c) against the pure-Python
reference in jsonraw.py: the same documents (types included: DupDict and its shadowed
values, JsonFloat lexemes, int, bool, None), the same units with the same paths in the same
order, the same JsonError reason codes; on generated JSON (valid and broken), on the
evasion bodies and on the benign corpus. And sse.parse_all's native path against the
incremental parser: the same events, the same clean-end flag, the same refusals."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.carriers import CARRIERS, jsonraw, sse
from gateway.carriers.base import CarrierLimits
from gateway.carriers.jsonraw import DupDict, JsonError, JsonFloat
from gateway.units import TextUnit
from tests import native_build

HERE = Path(__file__).parent


def test_native_module_is_built_when_required() -> None:
    """In CI a missing native module is a failure, not a silent fallback to the (slower) reference reader."""
    native_build.assert_built(jsonraw.NATIVE_AVAILABLE, "gateway.carriers._jsonraw_native", "native reader")


needs_native = native_build.needs(jsonraw.NATIVE_AVAILABLE, "native reader")


@pytest.fixture(autouse=True)
def _restore_native() -> Iterator[None]:
    yield
    jsonraw.use_native(True)


# --- comparing outcomes ---------------------------------------------------------------


def shape(value: Any) -> Any:
    """`value` with every type made explicit (so 1 != True != 1.0, str != JsonFloat, and
    member order, DupDict and shadowed values count)."""
    cls = type(value)
    if cls is DupDict:
        return ("DupDict", [(k, shape(v)) for k, v in value.items()], [(k, shape(v)) for k, v in value.shadowed])
    if cls is dict:
        return ("dict", [(k, shape(v)) for k, v in value.items()])
    if cls is list:
        return ("list", [shape(v) for v in value])
    if cls is tuple:
        return ("tuple", [shape(v) for v in value])
    if cls is TextUnit:
        return ("TextUnit", shape(value.path), shape(value.text), value.kind)
    if cls in (str, JsonFloat, int, bool, type(None)):
        return (cls.__name__, value)
    raise AssertionError(f"unexpected type {cls!r}")


def outcome(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except JsonError as exc:
        return ("JsonError", str(exc.reason))
    return ("ok", shape(result))


def both(call: Callable[[], Any]) -> tuple[Any, Any]:
    jsonraw.use_native(True)
    native = outcome(call)
    jsonraw.use_native(False)
    reference = outcome(call)
    jsonraw.use_native(True)
    return native, reference


def assert_same_bytes(raw: bytes, max_depth: int = 64, base: tuple[str | int, ...] = ()) -> None:
    for name, call in (
        ("decode_units", lambda: jsonraw.decode_units(raw, base, max_depth)),
        ("loads", lambda: jsonraw.loads(raw, max_depth=max_depth)),
        ("loads unchecked", lambda: jsonraw.loads(raw, max_depth=max_depth, check_depth=False)),
    ):
        native, reference = both(call)
        assert native == reference, (name, raw[:300])


def assert_same_text(text: str, max_depth: int = 64) -> None:
    for name, call in (
        ("decode_shape", lambda: jsonraw.decode_shape(text, max_depth)),
        ("decode_texts", lambda: jsonraw.decode_texts(text, max_depth)),
    ):
        native, reference = both(call)
        assert native == reference, (name, text[:300])


def assert_same(raw: bytes, max_depth: int = 64) -> None:
    assert_same_bytes(raw, max_depth)
    try:
        text = raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return
    assert_same_text(text, max_depth)


# --- generated JSON -------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "role", "content", "", "k~/", "é", "\U0001f511", "a\\", 'q"'])
CHARS = st.one_of(
    st.characters(codec="utf-8"),  # anything encodable (no surrogate code points)
    st.sampled_from(['"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x1f", "\x7f", "\u2028", "\ufeff"]),
    st.sampled_from(["\U0001f600", "\U0010ffff", "\ue000", "\ud7ff"]),
)
INTEGERS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["0", "-0", "9223372036854775807", "-9223372036854775808", "18446744073709551616"]),
    st.integers(1, 4400).map(lambda n: "7" * n),  # past 4300 digits: the interpreter refuses
)
FLOATS = st.builds(
    lambda i, frac, exp: i + frac + exp,
    st.sampled_from(["0", "-0", "1", "-12", "123456789012345678901234567890"]),
    st.sampled_from(["", ".0", ".5", ".000", ".25"]),
    st.sampled_from(["", "e0", "E5", "e+10", "e-7", "E-0", "e400", "e-400", "e00012"]),
).filter(lambda s: s.lstrip("-").count(".") or "e" in s.lower())


@st.composite
def json_string(draw: st.DrawFn, text: st.SearchStrategy[str] | None = None) -> str:
    """A JSON string literal with escapes chosen at random, surrogate pairs escaped in
    either case, and now and then a lone surrogate escape."""
    chars = draw(st.lists(CHARS, max_size=12)) if text is None else list(draw(text))
    out = ['"']
    for ch in chars:
        code = ord(ch)
        how = draw(st.integers(0, 3))
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif code < 0x20 or how == 0:
            if code > 0xFFFF:
                hi, lo = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(draw(st.sampled_from(["\\u%04x\\u%04x", "\\u%04X\\u%04X"])) % (hi, lo))
            else:
                out.append(draw(st.sampled_from(["\\u%04x", "\\u%04X"])) % code)
        elif ch == "/" and how == 1:
            out.append("\\/")
        else:
            out.append(ch)
    if draw(st.integers(0, 15)) == 0:
        lone = draw(st.sampled_from(["\\ud800", "\\uDBFF", "\\udc00", "\\uDFFF", "\\ud800\\ud800", "\\udc00\\ud800"]))
        out.insert(draw(st.integers(1, len(out))), lone)
    out.append('"')
    return "".join(out)


WS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n  "])


def json_text() -> st.SearchStrategy[str]:
    scalars = st.one_of(
        json_string(),
        INTEGERS.filter(lambda s: len(s) < 60),
        FLOATS,
        st.sampled_from(["true", "false", "null"]),
    )

    def containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        member = st.tuples(KEYS.flatmap(lambda k: json_string(st.just(k))), WS, WS, children).map(
            lambda m: f"{m[0]}{m[1]}:{m[2]}{m[3]}"
        )
        objects = st.tuples(st.lists(member, max_size=6), WS).map(lambda t: "{" + t[1] + ",".join(t[0]) + "}")
        arrays = st.tuples(st.lists(children, max_size=6), WS).map(lambda t: "[" + t[1] + ", ".join(t[0]) + "]")
        return st.one_of(objects, arrays)

    return st.tuples(WS, st.recursive(scalars, containers, max_leaves=30), WS).map("".join)


SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@needs_native
@SLOW
@given(json_text(), st.integers(1, 8))
def test_generated_json(text: str, max_depth: int) -> None:
    assert_same(text.encode("utf-8"), max_depth)
    assert_same(text.encode("utf-8"), 64)


@needs_native
@SLOW
@given(json_text(), st.data())
def test_broken_json(text: str, data: st.DataObject) -> None:
    """Every kind of damage: a byte changed, inserted or dropped (invalid UTF-8 included),
    the document cut short, junk after it."""
    raw = bytearray(text.encode("utf-8"))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(raw)))
        action = data.draw(st.sampled_from(["set", "insert", "drop", "cut", "append"]))
        byte = data.draw(
            st.one_of(
                st.integers(0, 255),
                st.sampled_from(list(b'{}[]",:\\-+.eE0u')),
            )
        )
        if action == "set" and at < len(raw):
            raw[at] = byte
        elif action == "insert":
            raw.insert(at, byte)
        elif action == "drop" and at < len(raw):
            del raw[at]
        elif action == "cut":
            del raw[at:]
        elif action == "append":
            raw += data.draw(st.sampled_from([b"x", b"}", b" 1", b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"NaN"]))
    assert_same(bytes(raw), data.draw(st.integers(1, 10)))


@needs_native
@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b" ",
        b"NaN",
        b"[NaN]",
        b"-Infinity",
        b"[Infinity]",
        b"[1,]",
        b'{"a":1,}',
        b"[01]",
        b"[1.]",
        b"[.5]",
        b"[1e]",
        b"[1e+]",
        b"[-]",
        b"[- 1]",
        b"-0",
        b"[9999999999999999999, -9999999999999999999, 999999999999999999, -999999999999999999]",
        b"[-0, -0.0, 0e0, 1E+2, 1e-2, 5.0e-324]",
        b"1" * 4300,
        b"1" * 4301,
        b"[" + b"9" * 5000 + b"]",
        b'"\\ud83d\\ude00"',
        b'"\\ud83d"',
        b'"\\ude00"',
        b'"\\ud83d\\u0041"',
        b'"\\ud83d\\uzzzz"',
        b'"\\ud83d\\',
        b'"\\ud83d\\ude0"',
        b'"\\u12"',
        b'"\\x41"',
        b'"\\\'"',
        b'"tab\there"',
        b'"\x7f"',
        b'"\xed\xa0\x80"',
        b'"\xc0\xaf"',
        b'"\xf4\x90\x80\x80"',
        b'"\xe2\x82"',
        b"\xef\xbb\xbf{}",
        b'{"a":1,"a":2,"b":3,"a":[4]}',
        b'{"a":1,"b":2,"b":3,"a":4}',
        b'{"a":1,"a":1}',
        b'{"a":{"x":1,"x":2},"a":[{"y":"s","y":"t"}]}',
        b'{"\\u0061":1,"a":2}',
        b'{"":0,"":{"":[]}}',
        b'{"k~/":{"~0":"/1"}}',
        b"[[[[]]]]",
        b"{} {}",
        b"[1] x",
        b"[true, false, null, truex]",
        b"nul",
        b'{"a" 1}',
        b'{"a":}',
        b"{1:2}",
        b'["a"\n,\r"b"\t]',
        b"[\x0b1]",
        b"[\xc2\xa01]",
    ],
)
def test_edge_cases(raw: bytes) -> None:
    for max_depth in (1, 2, 3, 64):
        assert_same(raw, max_depth)


@needs_native
@pytest.mark.parametrize("depth", [1, 2, 63, 64, 65, 200, 5000, 100_000])
@pytest.mark.parametrize("tail", [b"", b"x", b'"\\ud800"'])
def test_deep_nesting(depth: int, tail: bytes) -> None:
    """Past max_depth: too_deep, unless the document is broken first (json_invalid). Past
    the interpreter's recursion budget both readers stop at once (too_deep) whatever
    follows. (Near that budget's edge, ~1,000 levels, the two differ by the few frames
    between the caller and the parser; the reference itself moves with the caller's stack.)"""
    for opener, closer in ((b"[", b"]"), (b'{"a":', b"}")):
        for raw in (opener * depth + tail + closer * depth, opener * depth + closer * depth):
            assert_same(raw, 64)


@needs_native
def test_text_with_raw_surrogates_uses_the_reference() -> None:
    """A str holding a lone surrogate character has no UTF-8 form: the reference reads it."""
    for text in ('["\ud800"]', '{"\udfff":"\\ud800"}', '["\\ud83d\\ude00", "\ud83d"]'):
        assert_same_text(text)


# --- the corpora ----------------------------------------------------------------------


def corpus_files() -> list[Path]:
    return sorted(p for p in (HERE / "inspection" / "benign_corpus").iterdir() if p.is_file()) + sorted(
        (HERE / "fixtures").iterdir()
    )


@needs_native
@pytest.mark.parametrize("path", corpus_files(), ids=lambda p: p.name)
def test_benign_corpus_and_fixtures(path: Path) -> None:
    data = path.read_bytes()
    assert_same(data)  # JSON files decode; the others are refused alike
    for line in data.splitlines():  # SSE events: data lines hold JSON
        if line.startswith(b"data:"):
            assert_same(line[5:].strip())
    text = data.decode("utf-8", "surrogatepass")
    request = {"model": "m", "messages": [{"role": "user", "content": text}, {"role": "tool", "content": text}]}
    assert_same(json.dumps(request).encode())
    assert_same(json.dumps(request, ensure_ascii=False).encode("utf-8", "surrogatepass"))


def evasion_bodies() -> list[tuple[str, str, bytes]]:
    from tests import test_evasion as ev

    bodies = []
    for label, placement in ev.PLACEMENTS.items():
        for enc_name, encode in ev.ENCODINGS.items():
            for i, secret in enumerate(ev.SECRETS):
                route, raw = ev._render(placement, secret, encode, enc_name)
                bodies.append((f"{label}/{enc_name}/{i}", route, raw))
    return bodies


ROUTES = {
    "/v1/chat/completions": "openai.chat",
    "/v1/responses": "openai.responses",
    "/v1/messages": "anthropic.messages",
    "/v1/embeddings": "openai.embeddings",
}


@needs_native
def test_evasion_corpus() -> None:
    """Every evasion body of tests/test_evasion.py: the reader alone, and the carrier's whole
    parse (units of JSON held in strings included) on either path."""
    bodies = evasion_bodies()
    assert len(bodies) > 1000
    limits = CarrierLimits()
    for label, route, raw in bodies:
        assert_same_bytes(raw)
        carrier = CARRIERS[ROUTES[route]]

        def parse(raw: bytes = raw, carrier: Any = carrier) -> Any:
            parsed = carrier.parse_request(raw, limits)
            return [list(parsed.units), list(parsed.duplicate_keys), list(parsed.opaque)]

        native, reference = both(parse)
        assert native == reference, label


# --- SSE: whole buffered streams -------------------------------------------------------


def sse_parsed(data: bytes) -> tuple[list[tuple[str, str | None, str, str | None]], bool]:
    """`sse.parse_all`, with each event as a tuple `shape` reads (its type's name first)."""
    events, clean = sse.parse_all(data)
    return [(type(e).__name__, e.event, e.data, e.id) for e in events], clean


def assert_same_sse(data: bytes) -> None:
    """Native and reference alike on `data` (events, clean end, or the same refusal)."""
    native, reference = both(lambda: sse_parsed(data))
    assert native == reference, data[:200]


SSE_PIECES = [
    b"data",
    b"event",
    b"id",
    b"retry",
    b"dat",
    b":",
    b": ",
    b" ",
    b"\r",
    b"\n",
    b"\r\n",
    b"x",
    b"\x00",
    b"\xff",
    b"\xc3\xa9",
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
    b"\xef\xbb\xbf",  # a byte order mark: ignored once at the start, a field name's text elsewhere
    b'{"a":1}',
    b"[DONE]",
]


@needs_native
@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(SSE_PIECES), max_size=40).map(b"".join))
def test_sse_generated(data: bytes) -> None:
    assert_same_sse(data)


@needs_native
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_sse_generated_bytes(data: bytes) -> None:
    assert_same_sse(data)


@needs_native
@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\r",
        b"\n",
        b"data: a\r",
        b"data: a\n\r",
        b"data: a\r\n\r\n",
        b"data: a\n\ndata: b",
        b"data\n\n",
        b"data:\n\n",
        b"data:  two spaces\n\n",
        b"event: e\nid: 1\ndata: a\ndata: b\n\n",
        b"id: a\x00b\ndata: x\n\n",
        b": comment only\n\n",
        b"\xc3\xa9vent: x\ndata: \xc3\xa9\n\n",
        b"\xc3\xa9:\xc3\xa9 x\n\n",
        b"data: ok\n\n: \xff\n",
        b"event: only\n\n",
        b"data: a\n",
        b"\xef\xbb\xbfdata: a\n\n",
        b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n",
        b"\xef\xbb\xbf",
        b"\xef\xbb",
        b"data: a\n\n\xef\xbb\xbfdata: b\n\n",
    ],
)
def test_sse_edge_cases(data: bytes) -> None:
    assert_same_sse(data)


@needs_native
@pytest.mark.parametrize("path", sorted((HERE / "fixtures").glob("*.sse")), ids=lambda p: p.name)
def test_sse_fixtures(path: Path) -> None:
    raw = path.read_bytes()
    assert_same_sse(raw)
    events, clean = sse_parsed(raw)
    assert len(events) > 3 and clean and all(e[0] == "SSEEvent" for e in events)
