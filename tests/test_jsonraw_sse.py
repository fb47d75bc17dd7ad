"""The strict JSON reader and the SSE parser: bytes in, values out (property-based)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import units
from gateway.carriers import jsonraw, sse
from gateway.carriers.jsonraw import DupDict, JsonError, JsonFloat


def test_duplicates_keep_every_value() -> None:
    doc = jsonraw.loads(b'{"a": "first", "b": 1, "a": "second"}', max_depth=8)
    assert isinstance(doc, DupDict) and doc["a"] == "second"
    texts = {text for _, text, _ in jsonraw.walk(doc)}
    assert {"first", "second"} <= texts
    _, dup_paths, keys = jsonraw.collect(doc, (), 8)
    assert dup_paths == [()] and keys == 2  # the kept keys; the shadowed value is walked too


def test_exact_numbers() -> None:
    doc = jsonraw.loads(b'{"i": 123456789012345678901234567890, "f": 1.10000000000000000001, "e": 1E+5}', max_depth=4)
    assert doc["i"] == 123456789012345678901234567890
    assert isinstance(doc["f"], JsonFloat) and doc["f"] == "1.10000000000000000001"
    assert {t for _, t, k in jsonraw.walk(doc) if k == "number"} == {
        "123456789012345678901234567890",
        "1.10000000000000000001",
        "1E+5",
    }


@pytest.mark.parametrize(
    "raw,reason",
    [
        (b'{"a": NaN}', "json_invalid"),
        (b'{"a": -Infinity}', "json_invalid"),
        (b'{"a": "\\udc00"}', "json_invalid"),
        (b'{"\\ud800": 1}', "json_invalid"),
        (b'{"a": "\xc3"}', "json_invalid"),
        (b"\xef\xbb\xbf{}", "json_invalid"),
        (b'{"a": 1} trailing', "json_invalid"),
        (b"[" * 10 + b"]" * 10, "too_deep"),
        (b"[" * 100000 + b"]" * 100000, "too_deep"),
    ],
)
def test_refusals(raw: bytes, reason: str) -> None:
    with pytest.raises(JsonError) as info:
        jsonraw.loads(raw, max_depth=8)
    assert info.value.reason == reason


def test_surrogate_pairs_are_fine() -> None:
    assert jsonraw.loads(b'{"a": "\\ud83d\\ude00"}', max_depth=4) == {"a": "\U0001f600"}


def test_pointer_escaping() -> None:
    assert units.pointer(("a/b", "c~d", 3)) == "/a~1b/c~0d/3"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_every_string_is_walked(value: object) -> None:
    raw = json.dumps({"v": value}).encode()
    doc = jsonraw.loads(raw, max_depth=64)
    walked = [t for _, t, k in jsonraw.walk(doc) if k in ("string", "key")]
    expected: list[str] = []

    def collect(v: object) -> None:
        if isinstance(v, str):
            expected.append(v)
        elif isinstance(v, list):
            for x in v:
                collect(x)
        elif isinstance(v, dict):
            for k, x in v.items():
                expected.append(k)
                collect(x)

    collect({"v": value})
    assert sorted(walked) == sorted(expected)


# --- SSE ---------------------------------------------------------------------------

STREAM = (
    'event: message_start\r\ndata: {"type":"message_start"}\r\n\r\n'
    ": keep-alive comment\n\n"
    'data: {"text":"naïve 日本 🎉"}\n\n'
    "event: multi\ndata: line one\ndata: line two\n\n"
    "data:no-space\rid: 7\r\r"
    "data: [DONE]\n\n"
).encode()

EXPECTED = [
    sse.SSEEvent("message_start", '{"type":"message_start"}'),
    sse.SSEEvent(None, '{"text":"naïve 日本 🎉"}'),
    sse.SSEEvent("multi", "line one\nline two"),
    sse.SSEEvent(None, "no-space", "7"),
    sse.SSEEvent(None, "[DONE]"),
]


def test_parse_all() -> None:
    events, clean = sse.parse_all(STREAM)
    assert events == EXPECTED and clean


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_split_gives_the_same_events(cuts: list[int]) -> None:
    """Events and multi-byte UTF-8 characters split across reads at any byte."""
    points = sorted(set(cuts))
    pieces = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    parser = sse.SSEParser()
    events = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    tail, clean = parser.close()
    assert events + tail == EXPECTED and clean


def test_a_line_arriving_in_many_pieces_is_read_once_whole() -> None:
    """Byte by byte, and a long event in many reads (kept in pieces until its line ends, so
    a large event costs linear time), CR and CRLF endings landing on a read's edge."""
    parser = sse.SSEParser()
    events = [event for n in range(len(STREAM)) for event in parser.feed(STREAM[n : n + 1])]
    tail, clean = parser.close()
    assert events + tail == EXPECTED and clean
    long = b"data: " + b"x" * 100_000
    for ending in (b"\n\n", b"\r\r", b"\r\n\r\n"):
        data = long + ending + b"data: [DONE]" + ending
        parser = sse.SSEParser()
        found = []
        for at in range(0, len(data), 997):
            found.extend(parser.feed(data[at : at + 997]))
        edge = len(long) + 1  # a read that ends right after the first CR or LF
        split = sse.SSEParser()
        again = split.feed(data[:edge]) + split.feed(data[edge:]) + split.close()[0]
        assert [e.data for e in again] == ["x" * 100_000, "[DONE]"]
        rest, clean = parser.close()
        assert [e.data for e in found + rest] == ["x" * 100_000, "[DONE]"] and clean


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM) + 3), max_size=6))
def test_one_leading_byte_order_mark_is_ignored(cuts: list[int]) -> None:
    """The standard's decoder drops one leading U+FEFF: without that, the first line's field
    would be read as "\ufeffevent" and the first event lost. Split anywhere, the mark's own
    bytes included; a second mark, or one later in the stream, is a field name's text."""
    data = sse.BOM + STREAM
    assert sse.parse_all(data) == (EXPECTED, True)
    points = sorted(set(cuts))
    parser = sse.SSEParser()
    events = []
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        events.extend(parser.feed(data[a:b]))
    tail, clean = parser.close()
    assert events + tail == EXPECTED and clean
    twice, clean = sse.parse_all(sse.BOM + sse.BOM + b"data: x\n\n" + STREAM)
    assert twice == EXPECTED and clean  # "\ufeffdata: x" is an unknown field: no event holds x
    assert sse.parse_all(b"data: x\n\n" + sse.BOM + b"data: y\n\n") == ([sse.SSEEvent(None, "x")], True)
    for partial in (sse.BOM[:1], sse.BOM[:2]):  # a stream cut inside its mark
        parser = sse.SSEParser()
        assert parser.feed(partial) == [] and parser.close() == ([], False)


def test_cut_stream_is_not_clean() -> None:
    _, clean = sse.parse_all(b'data: {"a":1}\n\ndata: {"b"')
    assert not clean
    _, clean = sse.parse_all(b'data: {"a":1}\n')  # fields without the blank line
    assert not clean


def test_invalid_utf8_in_stream() -> None:
    with pytest.raises(JsonError):
        sse.parse_all(b"data: \xff\n\n")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.text(alphabet="abcdefg._", min_size=1, max_size=8)),
            st.text(
                alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)),
                min_size=1,
                max_size=20,
            ),
        ),
        max_size=6,
    )
)
def test_frame_roundtrip(items: list[tuple[str | None, str]]) -> None:
    events = [sse.SSEEvent(name, data) for name, data in items]
    parsed, clean = sse.parse_all(sse.frame(events))
    assert parsed == events and clean
