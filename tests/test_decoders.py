"""The normalised copy and the decoders (pure): every invisible character class the engine
must see through, tag characters, encoded runs, and their bounds."""

from __future__ import annotations

import base64
import json
import unicodedata

import pytest

from gateway.carriers import CARRIERS
from gateway.carriers.base import CarrierLimits
from gateway.inspection import decoders
from gateway.inspection.build import build_engine
from gateway.inspection.engine import Engine, Subject
from gateway.inspection.formats import build_format_set

VALUE = "zebra-Secret-4711-value"


def test_ignorable_class_covers_every_control_and_format_character() -> None:
    missing = [
        hex(cp)
        for cp in range(0x110000)
        if unicodedata.category(chr(cp)) in ("Cc", "Cf") and not decoders.is_ignorable(chr(cp))
    ]
    assert missing == []


@pytest.mark.parametrize(
    "cp",
    [
        0x200E,
        0x200F,
        0x202A,
        0x202E,
        0x2066,
        0x2069,
        0x034F,
        0xFE0F,
        0xE0100,
        0x3164,
        0x061C,
        0x180B,
        0x180F,
        0x115F,
        0xFFA0,
        0x0000,
        0x0001,
        0x001B,
        0x007F,
        0x0085,
    ],
)
def test_invisible_characters_are_removed(cp: int) -> None:
    assert decoders.normalise(chr(cp).join(VALUE)) == VALUE


def test_whitespace_controls_are_kept_by_normalise_and_removed_by_squeeze() -> None:
    text = "\n".join(VALUE)
    assert decoders.normalise(text) == text  # a format rule must not match across lines
    assert decoders.squeeze(text) == VALUE  # a configured literal is still found


def test_tag_characters_read_as_ascii() -> None:
    smuggled = "".join(chr(0xE0000 + ord(c)) for c in VALUE)
    assert decoders.normalise("prefix " + smuggled) == "prefix " + VALUE


def test_printable_ascii_is_returned_as_is() -> None:
    text = "plain text, nothing to do."
    assert decoders.normalise(text) is text


def _runs(text: str) -> list[bytes]:
    data = text.encode()
    out = [d for _, d in decoders.run_decodings(data)]
    out.extend(decoders.text_decodings(data))
    return out


@pytest.mark.parametrize(
    "encoded",
    [
        base64.b64encode(VALUE.encode()).decode(),
        base64.urlsafe_b64encode(VALUE.encode()).decode().rstrip("="),
        VALUE.encode().hex(),
        VALUE.encode().hex().upper(),
        "".join("%%%02x" % b for b in VALUE.encode()),
        VALUE[:5] + "%2D" + VALUE[6:],
        "".join(f"&#{ord(c)};" for c in VALUE),
        "".join(f"&#x{ord(c):X};" for c in VALUE),
        "".join(f"\\x{ord(c):02x}" for c in VALUE),
        "".join(f"\\u{ord(c):04x}" for c in VALUE),
        "".join(f"\\u{{{ord(c):x}}}" for c in VALUE),
    ],
)
def test_encoded_runs_decode(encoded: str) -> None:
    assert any(VALUE.encode() in d for d in _runs(f"see [{encoded}] here"))


def test_short_runs_are_words_not_encodings() -> None:
    assert [d for _, d in decoders.run_decodings(b"short words only 0123abcd")] == []


# --- through the engine ---------------------------------------------------------------


def _engine(decode_budget: float = 4.0) -> Engine:
    engine = build_engine(
        secret_values=[VALUE],
        formats=build_format_set(use_catalogue=True, disable=(), advisory=(), custom=None, detector_modes={}),
        policy_version="t",
    )
    engine.decode_budget = decode_budget
    return engine


def _subject(text: str) -> Subject:
    raw = json.dumps({"model": "gpt-4.1", "messages": [{"role": "user", "content": text}]}).encode()
    parsed = CARRIERS["openai.chat"].parse_request(raw, CarrierLimits())
    return Subject(raw=raw, units=parsed.units)


def test_nested_encoding_one_level_is_read() -> None:
    once = base64.b64encode(VALUE.encode().hex().encode()).decode()
    assert _engine().inspect(_subject(f"x {once} y")).reason_codes == ("secret_value",)


def test_decoding_budget_withholds_instead_of_stopping_silently() -> None:
    # many small encoded runs: each decodes, together they pass a (tiny) budget
    text = " ".join(base64.b64encode(f"harmless-{i:06d}".encode()).decode() for i in range(4000))
    assert _engine().inspect(_subject(text)).allowed
    verdict = _engine(decode_budget=0.0).inspect(_subject(text * 20))
    assert not verdict.allowed and "decode_limit" in verdict.reason_codes


@pytest.mark.parametrize(
    "text",
    [
        f"&#{ord(VALUE[0])}{VALUE[1:]}",  # one reference without its ';'
        "".join(f"&#{ord(c)}" for c in VALUE),  # every one without
        "".join(f"&#x{ord(c):x}" for c in VALUE),
    ],
)
def test_numeric_references_without_a_semicolon_are_read(text: str) -> None:
    assert _engine().inspect(_subject(f"see {text} here")).reason_codes == ("secret_value",)


def test_a_value_written_in_three_encodings_at_once_is_read() -> None:
    """Part a character reference, part percent-encoded, part a backslash escape: decoding
    each kind on its own (and one level again) never shows it whole; all kinds at once do."""
    mixed = f"&#{ord(VALUE[0])};{VALUE[1:4]}%{ord(VALUE[4]):02X}{VALUE[5:8]}\\x{ord(VALUE[8]):02x}{VALUE[9:]}"
    assert _engine().inspect(_subject(f"see {mixed} here")).reason_codes == ("secret_value",)


@pytest.mark.parametrize(
    ("data", "mixed"),
    [
        (b"%FF &amp; x", b"\xff & x"),
        (b"&#65;%C3 %28", b"A\xc3 ("),
        (b"%ED%A0%80&lt;", b"\xed\xa0\x80<"),
        (b"\\xff%FE&#x41;", b"\xff\xfeA"),
        (b"%FF&#xD800;", b"\xff" + "\ufffd".encode()),
    ],
)
def test_mixed_decoding_keeps_bytes_that_are_not_utf8(data: bytes, mixed: bytes) -> None:
    """A percent-encoded byte that is not UTF-8 beside a character reference: the mixed copy
    decodes the references and keeps that byte as it is, never failing the inspection."""
    assert list(decoders.text_decodings(data))[-1] == mixed


def test_a_value_beside_a_byte_that_is_not_utf8_is_read_and_benign_text_is_allowed() -> None:
    assert _engine().inspect(_subject("fee %FF and &amp; more")).allowed
    mixed = f"&#{ord(VALUE[0])};{VALUE[1:4]}%{ord(VALUE[4]):02X}{VALUE[5:]}"
    assert _engine().inspect(_subject(f"%FF see {mixed} here")).reason_codes == ("secret_value",)
