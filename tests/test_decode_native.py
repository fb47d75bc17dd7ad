"""The native decoding helpers (gateway/inspection/_decode_native.c) against the pure-Python
reference in decoders.py: the same (offset, decoded bytes) for every base64/base64url and
hex run, the same segments holding a percent, entity or backslash escape, the same
invisible-character flags and the same copies of ASCII texts (hence the same normalised
copies); on generated input, on edge cases at every length and padding boundary, on every
code point, on the units buffers and decoded copies of every evasion body and of the
benign corpus; and the same engine verdicts."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection import decoders
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Subject
from gateway.inspection.formats import build_format_set
from tests import native_build

HERE = Path(__file__).parent
SEPARATOR = b"\x00"

needs_native = native_build.needs(decoders.NATIVE_AVAILABLE, "native finder")


def test_native_module_is_built_when_required() -> None:
    native_build.assert_built(decoders.NATIVE_AVAILABLE, "gateway.inspection._decode_native", "native finder")


@pytest.fixture(autouse=True)
def _restore_native() -> Iterator[None]:
    yield
    decoders.use_native(True)


def both(data: bytes) -> tuple[Any, Any]:
    """(native, reference) results of both functions on `data`."""
    decoders.use_native(True)
    native = (decoders.run_decodings(data), decoders.trigger_segments(data))
    decoders.use_native(False)
    reference = (decoders.run_decodings(data), decoders.trigger_segments(data))
    decoders.use_native(True)
    return native, reference


def assert_same(data: bytes) -> tuple[Any, Any]:
    native, reference = both(data)
    assert native == reference, data[:200]
    return native


# The bytes the two finders branch on, plus the rest of the base64 alphabet's classes.
ALPHABET = b"AZaz09fF+/_-=%&#;xXuU\\0127\x00 .QWqw"


@needs_native
@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), max_size=120).map(bytes))
def test_generated_from_the_branching_alphabet(data: bytes) -> None:
    assert_same(data)


@needs_native
@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_generated_bytes(data: bytes) -> None:
    assert_same(data)


@needs_native
@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.sampled_from(["std", "url", "hex"]), st.binary(max_size=8))
def test_generated_encodings_in_text(value: bytes, kind: str, around: bytes) -> None:
    """Real encodings between arbitrary neighbours: found, and found alike."""
    if kind == "hex":
        encoded = value.hex().encode()
    elif kind == "std":
        encoded = base64.b64encode(value)
    else:
        encoded = base64.urlsafe_b64encode(value)
    native = assert_same(around + b" " + encoded + b" " + around)
    if len(encoded.rstrip(b"=")) >= 16 and kind == "hex" and not encoded.isalpha():
        assert any(value in d for _, d in native[0])


def _edge_cases() -> Iterator[bytes]:
    for n in range(10, 22):  # around the 11-character base64 and 16-digit hex minimums
        for pad in range(4):
            yield b"Ab1" * (n // 3) + b"Ab1"[: n % 3] + b"=" * pad
            yield b"0a" * (n // 2) + b"0" * (n % 2) + b"=" * pad
            yield b"x" + b"aB" * (n // 2) + b"-_+/"[pad : pad + 1] + b"." + b"=" * pad
    yield b"abcdefghijklmnop"  # one case: no base64; letters only: no hex
    yield b"ABCDEFGHIJKLMNOP=="  # one case, not letters only (the '=')
    yield b"0123456789012345"  # no letters at all: decoded as base64 and as hex
    yield b"ab+cd/ef-gh_ijKL"  # both alphabets: no base64
    yield b"deadbeefdeadbeefXdeadbeefdeadbeef0"
    for name in (b"a", b"ab", b"a" * 31, b"a" + b"b" * 31, b"a" + b"b" * 32):
        yield b"&" + name + b";" + SEPARATOR + b"x"
    for tail in (b"%4", b"%41", b"%g1", b"&#", b"&#1", b"&#x", b"&#xg", b"&#X1", b"\\x", b"\\u", b"\\U", b"\\7"):
        yield b"first" + SEPARATOR + b"second " + tail
        yield tail + SEPARATOR + tail + SEPARATOR
    yield b"\\777 \\778 \\0123"
    yield SEPARATOR * 3 + b"%41" + SEPARATOR * 2 + b"&amp;" + SEPARATOR


@needs_native
@pytest.mark.parametrize("data", list(_edge_cases()))
def test_edge_cases(data: bytes) -> None:
    assert_same(data)


def test_reference_semantics() -> None:
    """The behaviour both paths are held to, on the reference alone."""
    decoders.use_native(False)
    runs = decoders.run_decodings(b"pre " + base64.b64encode(b"a secret value!") + b" 0123456789abcdef0")
    # the hex run (17 digits) from its first digit and from its second (a value behind an odd prefix)
    assert runs[:3] == [
        (4, b"a secret value!"),
        (25, bytes.fromhex("0123456789abcdef")),
        (26, bytes.fromhex("123456789abcdef0")),
    ]
    # then the base64 run again from its second, third and fourth character (a value behind a prefix)
    assert [offset for offset, _ in runs[3:]] == [5, 6, 7]
    buf = b"plain" + SEPARATOR + b"a %41 b" + SEPARATOR + b"&amp; and &amp;" + SEPARATOR + b"\\x41"
    assert decoders.trigger_segments(buf) == [(6, 13), (14, 29), (30, 34)]


# --- invisible characters --------------------------------------------------------------


@needs_native
def test_invisible_flags_for_every_code_point() -> None:
    """The native class is the reference's, code point by code point (tag characters
    included), and a text's flags are found wherever the character sits."""
    differ, found, marked = [], 0, 0
    for code in range(0x110000):
        ch = chr(code)
        decoders.use_native(True)
        native = decoders.invisible_flags(ch), decoders.text_flags(ch)
        decoders.use_native(False)
        if native != (decoders.invisible_flags(ch), decoders.text_flags(ch)):
            differ.append(hex(code))
        found += native[0] != 0
        marked += (native[1] & decoders.MARK_OR_FORM) != 0
    assert differ == []
    assert found > 4000  # controls, format characters, variation selectors, tags...
    assert marked > 0x100000  # every character above the BMP, the BMP's marks and the parenthesised forms


@needs_native
@pytest.mark.parametrize("before", ["", "\u00e9", "\u0394", "\U0001f600"], ids=["ascii", "latin1", "bmp", "astral"])
@pytest.mark.parametrize(
    "ch", ["\u200b", "\u0301", "\u0336", "\u249c", "\u2474", "\U0001f110", "\U000e0041", "\u00ad", "x"]
)
def test_text_flags_wherever_the_character_sits(before: str, ch: str) -> None:
    """Each string width (the text's widest character decides it), the character first,
    last and between others: the flags are the reference's."""
    for text in (ch + before * 3, before * 3 + ch, before + ch + before + "ab"):
        decoders.use_native(True)
        native = decoders.text_flags(text), decoders.normalise(text)
        decoders.use_native(False)
        assert native == (decoders.text_flags(text), decoders.normalise(text)), text.encode("unicode_escape")


@needs_native
@settings(max_examples=2000, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(
            "ab é\u200b\u00ad\t\n\x00\x7f\ufe0f\U000e0041\U000e0100\U0001f600\uff21\u3164"
            "\u0301\u0336\u20dd\u249c\u2474\u2488\U0001f110\U0001d167"
        ),
        max_size=60,
    )
)
def test_invisible_flags_and_normalise_on_generated_text(text: str) -> None:
    decoders.use_native(True)
    native = (
        decoders.invisible_flags(text),
        decoders.text_flags(text),
        decoders.normalise(text),
        decoders.squeeze(text),
    )
    decoders.use_native(False)
    assert native == (
        decoders.invisible_flags(text),
        decoders.text_flags(text),
        decoders.normalise(text),
        decoders.squeeze(text),
    )


@needs_native
@settings(max_examples=1000, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(b"ab\x00\x08\t\n\r\x0b\x0c\x0e\x1f\x7f\x80\xc3\xa9 "), max_size=40).map(bytes))
)
def test_ascii_forms(encoded: list[bytes]) -> None:
    decoders.use_native(True)
    native = decoders.ascii_forms(encoded)
    decoders.use_native(False)
    assert native == decoders.ascii_forms(encoded)
    for data, normal in zip(encoded, native[0], strict=True):
        assert (normal is None) == (not data.isascii())


# --- the corpora, as the engine feeds them ---------------------------------------------


def _units_buffer(raw: bytes, carrier: str) -> bytes:
    parsed = CARRIERS[carrier].parse_request(raw, CarrierLimits())
    return SEPARATOR + SEPARATOR.join(u.text.encode("utf-8", "surrogatepass") for u in parsed.units)


def _assert_same_through(buf: bytes) -> int:
    """The buffer, and each decoded copy in it (what the nested pass reads). Returns how many
    copies were compared."""
    runs, _ = assert_same(buf)
    for _, copy in runs:
        assert_same(copy)
    return len(runs)


@needs_native
def test_evasion_corpus() -> None:
    from tests.test_jsonraw_native import ROUTES, evasion_bodies

    bodies = evasion_bodies()
    assert len(bodies) > 1000
    copies = 0
    for _, route, raw in bodies:
        assert_same(raw)
        copies += _assert_same_through(_units_buffer(raw, ROUTES[route]))
    assert copies > 500  # the corpus is full of encodings: the comparison saw them


@needs_native
@pytest.mark.parametrize(
    "path",
    sorted(p for p in (HERE / "inspection" / "benign_corpus").iterdir() if p.is_file()),
    ids=lambda p: p.name,
)
def test_benign_corpus(path: Path) -> None:
    data = path.read_bytes()
    _assert_same_through(data)
    text = data.decode("utf-8", "surrogatepass")
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    _assert_same_through(_units_buffer(raw, "openai.chat"))


@needs_native
def test_engine_verdicts_agree_on_the_evasion_corpus() -> None:
    """The whole decision, native finder against reference, on every request evasion body."""
    from tests import test_evasion as ev
    from tests.test_jsonraw_native import ROUTES, evasion_bodies

    engine = build_engine(
        secret_values=ev.LITERALS,
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
        policy_version="t",
    )
    refused = 0
    for label, route, raw in evasion_bodies():
        parsed = CARRIERS[ROUTES[route]].parse_request(raw, CarrierLimits())
        subject = Subject(raw=raw, units=parsed.units, opaque=parsed.opaque, duplicate_keys=parsed.duplicate_keys)
        decoders.use_native(True)
        native = engine.inspect(subject)
        decoders.use_native(False)
        reference = engine.inspect(subject)
        assert (native.decision, native.reason_codes) == (reference.decision, reference.reason_codes), label
        refused += native.decision != "allow"
    assert refused > 1000  # the evasion corpus is refused; the comparison was not of allows


@needs_native
@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.text(alphabet=st.sampled_from("ab é\u200b\t\n\x00\x7f\ufe0f\U000e0041\uff21\x0b"), max_size=30),
        max_size=8,
    )
)
def test_encoded_forms_are_each_texts_normalised_and_squeezed_copies(texts: list[str]) -> None:
    """The batch the engine asks for equals the per-text functions, with either finder."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    expected_normals = [decoders.normalise_encoded(d, t) for d, t in zip(encoded, texts, strict=True)]
    expected = (expected_normals, [decoders.squeeze_encoded(n) for n in expected_normals])
    for native in (True, False):
        decoders.use_native(native)
        assert decoders.encoded_forms(texts, encoded) == expected
