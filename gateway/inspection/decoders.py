"""Decoders: the copies of a text the matcher must also see, because a provider (or the
person reading a response) would read through them.

Owns:

* `normalise` — the normalised copy: Unicode tag characters (U+E0020–U+E007E, "ASCII
  smuggling") mapped to the ASCII they stand for, then every Default_Ignorable code point
  and every control (Cc) or format (Cf) character removed, then every combining mark
  (Mn, Me) and the parenthesised letters and digits (U+2474–U+24B5, U+1F110–U+1F129)
  mapped to the letter or digit they enclose, then NFKC. A value interleaved with
  zero-width or bidi controls, variation selectors, fillers, NUL or any other C0/C1
  control, with a strike-through or underline mark after each character, or written in
  tag characters or parenthesised letters, reads as the value again.
* `encoded_runs` — runs of base64, base64url, hex, percent-encoding, HTML character
  references and backslash escapes (`\\xHH`, `\\uHHHH`, `\\u{H…}`, `\\UHHHHHHHH`) inside
  a text, each decoded. Bounded: a minimum run length (short runs are ordinary words and
  cannot hold a configured value of the minimum length), and the caller caps the total
  decoded bytes and the nesting depth.

Must not: do I/O, keep decoded text beyond the call, or decide anything (the engine scans
the copies and reports findings at the original unit's location).
"""

from __future__ import annotations

import base64
import html
import re
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any, cast

# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) ∪ Cf ∪ Cc. The test suite
# checks this class against `unicodedata` for every code point.
_IGNORABLE_RANGES = (
    (0x0000, 0x001F),
    (0x007F, 0x009F),
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    parts = []
    for lo, hi in ranges:
        parts.append(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}")
    return "[" + "".join(parts) + "]"


IGNORABLE = re.compile(_class(_IGNORABLE_RANGES))
# The same without the whitespace controls (TAB, LF, VT, FF, CR): removing those joins
# lines, which lets a format rule match across them (a false positive); they are removed
# only in the copy that configured literals alone are matched against (`squeeze`).
_INVISIBLE_RANGES = ((0x00, 0x08), (0x0E, 0x1F)) + _IGNORABLE_RANGES[1:]
_INVISIBLE = re.compile(_class(_INVISIBLE_RANGES))
_ASCII_INVISIBLE = re.compile("[\x00-\x08\x0e-\x1f\x7f]")  # the ASCII part of _INVISIBLE
_DELETE_WHITESPACE_CONTROLS = str.maketrans("", "", "\t\n\x0b\x0c\r\u2028\u2029")
_TAG = re.compile("[\U000e0020-\U000e007e]")
# What does not count towards a stream's release window: everything `squeeze` removes
# (ignorable, control and format characters, whitespace controls, the line and paragraph
# separators), but not tag characters, which normalise to the ASCII they stand for.
INSIGNIFICANT = re.compile(_class(_IGNORABLE_RANGES[:-1] + ((0x2028, 0x2029), (0xE0000, 0xE001F), (0xE007F, 0xE0FFF))))


def _mark_ranges() -> tuple[tuple[int, int], ...]:
    """Every combining mark (general category Mn or Me) of this interpreter's Unicode, as
    ranges: the same database NFKC uses."""
    ranges: list[tuple[int, int]] = []
    for cp in range(0x300, 0x110000):
        if unicodedata.category(chr(cp)) in ("Mn", "Me"):
            if ranges and ranges[-1][1] == cp - 1:
                ranges[-1] = (ranges[-1][0], cp)
            else:
                ranges.append((cp, cp))
    return tuple(ranges)


# A mark after each character (U+0336 strike-through, U+0332 underline, an acute accent)
# leaves the text readable as the letters under it; NFKC alone would keep most of them, and
# compose some into new letters. Removed before NFKC (a precomposed accented letter stays).
# Two classes: one of BMP ranges only compiles to a table (a lookup per character); with the
# supplementary planes' ranges beside it the class is tried range by range, some fifty times
# as slow. Supplementary characters are rare in text (an emoji), and each is judged alone.
_BMP_MARK_RANGES = tuple((lo, min(hi, 0xFFFF)) for lo, hi in _mark_ranges() if lo <= 0xFFFF)
_MARK_BMP = re.compile(_class(_BMP_MARK_RANGES))
_SUPPLEMENTARY = re.compile("[\U00010000-\U0010ffff]")
_MARK_CATEGORIES = ("Mn", "Me")


def _has_mark(text: str) -> bool:
    if _MARK_BMP.search(text) is not None:
        return True
    return any(unicodedata.category(m.group()) in _MARK_CATEGORIES for m in _SUPPLEMENTARY.finditer(text))


def _unmark_supplementary(m: re.Match[str]) -> str:
    return "" if unicodedata.category(m.group()) in _MARK_CATEGORIES else m.group()


def _without_marks(text: str) -> str:
    text = _MARK_BMP.sub("", text)
    return _SUPPLEMENTARY.sub(_unmark_supplementary, text) if _SUPPLEMENTARY.search(text) else text


# Letters and digits written in parentheses ("⒫⒧⒜", "⑴"): NFKC spells them "(p)(l)(a)".
_PARENTHESISED = {
    **{0x249C + i: chr(0x61 + i) for i in range(26)},  # ⒜–⒵
    **{0x1F110 + i: chr(0x41 + i) for i in range(26)},  # 🄐–🄩
    **{0x2474 + i: str(i + 1) for i in range(20)},  # ⑴–⒇
    **{0x2488 + i: str(i + 1) for i in range(20)},  # ⒈–⒛ (the digit and a full stop)
}
# Letters, digits and dashes a reader takes for ASCII ones and NFKC leaves as they are:
# Cyrillic, Greek and Armenian letters drawn like Latin ones, every other script's decimal
# digits, hyphens, dashes and the minus sign, and negative circled, negative squared and
# regional-indicator capitals. The normalised copy reads each as that ASCII character
# ("рlаіn" written with Cyrillic letters reads "plain"; configured values are matched in
# that form too, see `literals.variants`): one character for one, so what the release
# window counts is unchanged.
_LOOKALIKE_LETTERS = (
    "аa еe һh іi јj кk оo рp сc уy хx ѕs ԁd ԛq ԝw ӏl үy "  # Cyrillic
    "АA ВB ЕE КK МM НH ОO РP СC ТT ХX УY ІI ЈJ ЅS ҮY ԚQ ԜW ӀI "
    "ΑA ΒB ΕE ΖZ ΗH ΙI ΚK ΜM ΝN ΟO ΡP ΤT ΥY ΧX αa ιi κk νv οo ρp υu χx ϲc ϳj "  # Greek
    "օo սu"  # Armenian
)
_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2043\u02d7\u2e3a\u2e3b"


def _digit_forms() -> dict[int, str]:
    """Every decimal digit of this interpreter's Unicode (none lies past U+1FFFF) that NFKC
    leaves as it is, as its ASCII digit."""
    out: dict[int, str] = {}
    for cp in range(0x80, 0x20000):
        if unicodedata.decimal(chr(cp), -1) == 0:
            for d in range(10):
                if unicodedata.decimal(chr(cp + d), -1) == d and unicodedata.normalize("NFKC", chr(cp + d)) == chr(
                    cp + d
                ):
                    out[cp + d] = str(d)
    return out


_LOOKALIKE: dict[int, str] = {
    **{ord(pair[0]): pair[1] for pair in _LOOKALIKE_LETTERS.split()},
    **{ord(dash): "-" for dash in _DASHES},
    **_digit_forms(),
    **{base + i: chr(0x41 + i) for base in (0x1F150, 0x1F170, 0x1F1E6) for i in range(26)},  # 🅐 🅰 🇦
}
_LOOKALIKE_CHAR = re.compile(_class(tuple((cp, cp) for cp in sorted(_LOOKALIKE))))


def fold_forms(text: str) -> str:
    """`text` with every look-alike character (`_LOOKALIKE`) read as its ASCII one."""
    if _native is not None:
        return cast(str, _native.fold_forms(text))
    return text.translate(_LOOKALIKE)


# One pass finds whether a text needs either (a BMP mark, a parenthesised form) or holds a
# supplementary character (which may be a mark or a parenthesised capital).
_MARK_OR_FORM_BMP_RANGES = (*_BMP_MARK_RANGES, (0x2474, 0x24B5))
_MARK_OR_FORM = re.compile(_class((*_MARK_OR_FORM_BMP_RANGES, (0x10000, 0x10FFFF))))
# Line and paragraph separators end a line as LF does: the copy for configured values
# removes them with the whitespace controls (`squeeze`).
_SEPARATORS_UTF8 = ("\u2028".encode(), "\u2029".encode())


def unmarked(text: str) -> str:
    """`text` with every combining mark removed from its canonical decomposition, then NFKC:
    what `normalise` reads a copy of it with marks after each letter as (a configured value
    with accents is matched in this form too)."""
    return unicodedata.normalize("NFKC", _without_marks(unicodedata.normalize("NFD", text)))


def is_ignorable(ch: str) -> bool:
    return IGNORABLE.fullmatch(ch) is not None


def _untag(m: re.Match[str]) -> str:
    return chr(ord(m.group()) - 0xE0000)


def invisible_flags(text: str) -> int:
    """1 when `text` holds an invisible character (`_INVISIBLE`: ignorable, control or
    format, whitespace controls excepted), 3 when one of them is a tag character."""
    if _native is not None:
        return cast(int, _native.invisible_flags(text))
    if _INVISIBLE.search(text) is None:
        return 0
    return 3 if _TAG.search(text) else 1


MARK_OR_FORM = 4
LOOKALIKE = 8


def text_flags(text: str) -> int:
    """`invisible_flags`, `MARK_OR_FORM` when `text` holds a character of `_MARK_OR_FORM`
    (a combining mark, a parenthesised form, or any character above the BMP) and
    `LOOKALIKE` when it holds one of `_LOOKALIKE`: what `normalise` must do to a non-ASCII
    text, found in one pass."""
    if _native is not None:
        return cast(int, _native.text_flags(text))
    flags = invisible_flags(text)
    if _MARK_OR_FORM.search(text) is not None:
        flags |= MARK_OR_FORM
    return flags | LOOKALIKE if _LOOKALIKE_CHAR.search(text) is not None else flags


def normalise(text: str) -> str:
    """The normalised copy (see the module docstring), keeping whitespace controls. Cheap
    when nothing applies: printable ASCII is returned as is."""
    if text.isascii():  # NFKC leaves ASCII alone; only its controls can go
        return _ASCII_INVISIBLE.sub("", text) if _ASCII_INVISIBLE.search(text) else text
    flags = text_flags(text)
    if flags & 3:
        if flags & 2:
            text = _TAG.sub(_untag, text)
        text = _INVISIBLE.sub("", text)
    if flags & MARK_OR_FORM:  # removing invisible characters adds none; the passes re-check
        if _has_mark(text):
            text = _without_marks(text)
        text = text.translate(_PARENTHESISED)
    if flags & LOOKALIKE:
        text = fold_forms(text)
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
        if invisible_flags(text):  # NFKC never produces these today; stay safe if it does
            text = _INVISIBLE.sub("", text)
    return text


_ASCII_INVISIBLE_BYTES = bytes(range(0x00, 0x09)) + bytes(range(0x0E, 0x20)) + b"\x7f"
_WHITESPACE_CONTROL_BYTES = b"\t\n\x0b\x0c\r"


def normalise_encoded(data: bytes, text: str) -> bytes:
    """`normalise` for a text already encoded as UTF-8 (`data`): ASCII text, the common
    case, is handled on the bytes (deleting ASCII controls never splits a UTF-8 sequence)."""
    if data.isascii():
        return _normalise_ascii(data)
    return normalise(text).encode("utf-8", "surrogatepass")


def _normalise_ascii(data: bytes) -> bytes:
    """`normalise` of an ASCII text: its controls removed, whitespace controls kept."""
    return data.translate(None, _ASCII_INVISIBLE_BYTES)


def squeeze_encoded(normalised: bytes) -> bytes:
    """`squeeze` of an already normalised UTF-8 text."""
    out = normalised.translate(None, _WHITESPACE_CONTROL_BYTES)
    if not out.isascii():
        for separator in _SEPARATORS_UTF8:
            if separator in out:
                out = out.replace(separator, b"")
    return out


def ascii_forms(encoded: list[bytes]) -> tuple[list[bytes | None], list[bytes | None]]:
    """For each ASCII text (UTF-8 `encoded`) its normalised copy and that copy squeezed
    (`normalise_encoded` and `squeeze_encoded`, the same object where nothing is removed);
    None in both for a text that is not ASCII (it needs `normalise`)."""
    if _native is not None:
        return cast(tuple[list[bytes | None], list[bytes | None]], _native.ascii_forms(encoded))
    normals: list[bytes | None] = []
    squeezeds: list[bytes | None] = []
    for data in encoded:
        if data.isascii():
            normal = _normalise_ascii(data)
            normals.append(normal)
            squeezeds.append(squeeze_encoded(normal))
        else:
            normals.append(None)
            squeezeds.append(None)
    return normals, squeezeds


def encoded_forms(texts: Sequence[str], encoded: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    """`normalise_encoded` of every text (`encoded`: their UTF-8) and `squeeze_encoded` of
    that, for all of them at once: the ASCII ones in one call (`ascii_forms`), the rest by
    `normalise`."""
    normals, squeezeds = ascii_forms(encoded)
    out_normals: list[bytes] = []
    out_squeezeds: list[bytes] = []
    for text, normal, squeezed in zip(texts, normals, squeezeds, strict=True):
        if normal is None or squeezed is None:  # not ASCII
            normal = normalise(text).encode("utf-8", "surrogatepass")
            squeezed = squeeze_encoded(normal)
        out_normals.append(normal)
        out_squeezeds.append(squeezed)
    return out_normals, out_squeezeds


def squeeze(text: str) -> str:
    """`normalise`, and whitespace controls and the line and paragraph separators removed
    too: the copy configured literals are matched against (a value interleaved with
    newlines or tabs reads as the value)."""
    return normalise(text).translate(_DELETE_WHITESPACE_CONTROLS)


# --- encoded runs ---------------------------------------------------------------------

# The shortest run worth decoding: a configured value is at least 8 characters by default
# (secret_values.min_length, which may go down to 4: values shorter than 8 are not read
# from their base64 or hex); 8 bytes are 11 base64 characters (and a '=', often dropped)
# and 16 hex digits. Shorter runs are words, ids and numbers.
MIN_B64_RUN = 11
MIN_HEX_RUN = 16

# Maximal runs of the base64 alphabet. Only those with both letter cases are decoded (at
# every alignment, see `_run_decodings`): base64 of any text (or key) mixes them, while
# words, identifiers in one case and numbers (most such runs in ordinary text and code) do
# not.
_B64_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}={0,2}" % MIN_B64_RUN)
_HEX_RUN = re.compile(rb"[0-9A-Fa-f]{%d,}" % MIN_HEX_RUN)
_PERCENT = re.compile(rb"%[0-9A-Fa-f]{2}")
# A numeric reference needs no ';' (`html.unescape`, and every browser, read "&#119g" as "wg").
_ENTITY = re.compile(rb"&(?:#[0-9]{1,8};?|#[xX][0-9A-Fa-f]{1,7};?|[A-Za-z][A-Za-z0-9]{1,31};)")
# A UTF-16 surrogate pair written as two escapes (any case) is one character: it is read
# first, as a whole, else each half would decode to a lone surrogate.
_BACKSLASH = re.compile(
    rb"\\u[dD][89abAB][0-9A-Fa-f]{2}\\u[dD][c-fC-F][0-9A-Fa-f]{2}"
    rb"|\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|u\{[0-9A-Fa-f]{1,6}\}|U[0-9A-Fa-f]{8}|[0-7]{3})"
)


# Base64 and base64url differ only in the characters for 62 and 63; reading `-` and `_` as
# `+` and `/` decodes either, and a run that mixes them (a base64url id, a `-` or `_`, then
# standard base64 holding `+` or `/`) reads every part of it that is one alphabet alone as
# that part's own decoding would (see `_run_decodings`).
_URL_AS_STD = bytes.maketrans(b"-_", b"+/")


def _b64(body: bytes) -> bytes:
    """The decoding of `body`, base64-alphabet characters only (either alphabet or both).
    One dangling character carries no whole byte and is dropped; so are the bits of an
    incomplete last group (as binascii does)."""
    if len(body) % 4 == 1:
        body = body[:-1]
    return base64.b64decode(body.translate(_URL_AS_STD) + b"=" * (-len(body) % 4), validate=True)


def _hex(digits: bytes) -> bytes:
    """The bytes of hex `digits`; an odd last digit carries no whole byte."""
    return bytes.fromhex((digits[:-1] if len(digits) % 2 else digits).decode())


def _percent(text: bytes) -> bytes:
    return _PERCENT.sub(lambda m: bytes([int(m.group()[1:], 16)]), text)


def _entities(text: bytes) -> bytes:
    """Character references decoded; every other byte kept as it is. The text may hold bytes
    that are not UTF-8 (a percent-decoded `%FF` before it, in the mixed decoding): each
    such byte reads as its own escape and is written back unchanged (`html.unescape` turns
    a reference to a surrogate into U+FFFD, so every surrogate it returns is one of those)."""
    return html.unescape(text.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def _escape_value(m: re.Match[bytes]) -> bytes:
    token = m.group()
    kind = token[1:2]
    if kind in b"01234567":
        return bytes([int(token[1:], 8) & 0xFF])
    if kind == b"x":
        return bytes([int(token[2:], 16)])
    if len(token) == 12:  # a surrogate pair
        high, low = int(token[2:6], 16), int(token[8:12], 16)
        return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)).encode("utf-8")
    digits = token[3:-1] if token[2:3] == b"{" else token[2:]
    code = int(digits, 16)
    if code > 0x10FFFF:
        return token
    return chr(code).encode("utf-8", "surrogatepass")


def _backslashes(text: bytes) -> bytes:
    return _BACKSLASH.sub(_escape_value, text)


# Anything that starts a whole-text encoding (percent, entity or backslash escape).
TEXT_TRIGGER = re.compile(
    rb"%[0-9A-Fa-f]{2}|&(?:#[0-9]|#[xX][0-9A-Fa-f]|[A-Za-z][A-Za-z0-9]{1,31};)|\\(?:[xuU]|[0-7]{3})"
)

# The words a stream's release window is counted in (checks/window). A word is a maximal
# run of the characters some decoding here reads as part of an encoded run: the base64,
# base64url and hex alphabets, percent-encoding, character references as `html.unescape`
# reads them (a number, or a name of letters and digits, `;` optional), backslash escapes,
# and JSON's string escapes (`\"`, `\/`; tool-call arguments are read through them). Every
# other character reads as itself in every copy, at every level of nesting: no run reaches
# across it, so each word decodes on its own.
WORD = re.compile(r'[A-Za-z0-9%&#;\\{}"/+=_-]+')
# Where a text decoding can start. A word holding none reads as itself in every text
# decoding at every level (a base64 or hex copy holds that run alone); a word holding one
# may read as any number of characters, none included.
DECODING_START = re.compile(r"[%&\\]")


def run_decodings(data: bytes) -> list[tuple[int, bytes]]:
    """(offset in `data`, decoded bytes) for every base64/base64url and hex run. One pass
    over the base64-alphabet runs finds both (a hex run lies inside one)."""
    if _native is not None:
        return cast(list[tuple[int, bytes]], _native.run_decodings(data))
    return list(_run_decodings(data))


def trigger_segments(buf: bytes) -> list[tuple[int, int]]:
    """(start, end) of every NUL-separated segment of `buf` that holds a `TEXT_TRIGGER`."""
    if _native is not None:
        return cast(list[tuple[int, int]], _native.trigger_segments(buf))
    segments: list[tuple[int, int]] = []
    at = 0
    while (m := TEXT_TRIGGER.search(buf, at)) is not None:
        start = buf.rfind(b"\x00", 0, m.start()) + 1
        end = buf.find(b"\x00", m.end())
        end = len(buf) if end < 0 else end
        segments.append((start, end))
        at = end
    return segments


def _run_decodings(data: bytes) -> Iterator[tuple[int, bytes]]:
    """The reference for `run_decodings` (and for the native module).

    A run is decoded from its first character, and again from its second, third and fourth
    while at least `MIN_B64_RUN` characters are left: an encoded value preceded inside the
    run by k alphabet characters (a URL path `…org/d/<base64>`, `id-<base64>`, any word glued
    to it) reads whole only from the alignment k % 4, since every fourth character starts a
    group of three bytes; a value whose encoding is a run on its own (`MIN_B64_RUN`
    characters or more) is so read after any prefix. Each copy's offset is where its
    decoding starts in `data` (inside the run, so in the run's unit). The copies from the
    first character come first, in the order of the runs, with each run's hex runs after
    it, as a value split in runs each encoded on its own is read by joining the copies in
    order. Then every hex run of more than `MIN_HEX_RUN` digits again from its second digit
    (a value behind an odd number of hex digits reads whole only so); then the base64
    copies from the second character (run by run), then those from the third, then from
    the fourth. The four copies are at most three times the run's length
    together (the three extra ones about 2.25 times), and count against the caller's budget
    as any copy does."""
    hex_run = _HEX_RUN.search
    misaligned: list[tuple[int, bytes]] = []  # (start, body) of the runs decoded again
    shifted: list[tuple[int, bytes]] = []  # (start, digits) of the hex runs read from their second digit
    for m in _B64_RUN.finditer(data):
        run = m.group()
        one_case = run.islower() or run.isupper()
        if not one_case:
            body = run.rstrip(b"=")
            decoded = _b64(body)
            if decoded:
                yield m.start(), decoded
            if len(body) > MIN_B64_RUN:
                misaligned.append((m.start(), body))
        if len(run) >= MIN_HEX_RUN and not run.isalpha():  # hex of text has digits
            at = 0
            while (h := hex_run(run, at)) is not None:
                digits = h.group()
                yield m.start() + h.start(), _hex(digits)
                if len(digits) > MIN_HEX_RUN:  # a value behind an odd number of hex digits
                    shifted.append((m.start() + h.start() + 1, digits[1:]))
                at = h.end()
    for start, digits in shifted:
        yield start, _hex(digits)
    for skip in (1, 2, 3):
        for start, body in misaligned:
            if len(body) - skip >= MIN_B64_RUN:
                yield start + skip, _b64(body[skip:])


# Base64 wrapped in lines (MIME's 76 columns, PEM's 64, `base64` without `-w 0`): a line
# break between two lines of the alphabet, the first at least 16 characters long. Its lines
# are runs of their own, each decoded alone: a value whose encoding crosses a break, or sits
# in a last line shorter than `MIN_B64_RUN`, reads whole only once the lines are joined. The
# pattern starts at the break (a literal), so a text of prose is passed over fast.
_WRAP = re.compile(rb"\n(?:(?<=[A-Za-z0-9+/]{16}\n)|(?<=[A-Za-z0-9+/]{16}\r\n))[A-Za-z0-9+/]")
_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2}")
_LINE_END = re.compile(rb"[A-Za-z0-9+/]+$")
_BREAK = re.compile(rb"\r?\n(?=[A-Za-z0-9+/])")
MAX_WRAPPED_LINE = 4096  # how far back a wrapped block's first line is read


def wrapped_blocks(data: bytes) -> list[tuple[int, bytes]]:
    """(offset in `data`, the lines joined) for every block of base64 wrapped in lines (see
    `_WRAP`): lines of the alphabet, each but the last at least 16 characters and a whole
    number of groups of four, joined at their line breaks. The joined copy's own runs are
    then decoded as any text's are (`run_decodings`)."""
    blocks: list[tuple[int, bytes]] = []
    taken = 0
    for m in _WRAP.finditer(data):
        brk = m.start()
        if brk < taken:
            continue  # a break inside a block already read
        end = brk - 1 if data[brk - 1 : brk] == b"\r" else brk
        first = _LINE_END.search(data, max(taken, end - MAX_WRAPPED_LINE), end)
        if first is None:
            continue
        lines = [first.group()]
        at = brk + 1
        while (line := _LINE.match(data, at)) is not None:
            lines.append(line.group())
            at = line.end()
            more = _BREAK.match(data, at)
            if more is None or len(lines[-1]) < 16 or len(lines[-1]) % 4 or lines[-1].endswith(b"="):
                break
            at = more.end()
        taken = at
        blocks.append((first.start(), b"".join(lines)))
    return blocks


def text_decodings(text: bytes) -> Iterator[bytes]:
    """The whole text with its percent-encoding, HTML character references or backslash
    escapes decoded (each kind on its own), and, where it mixes kinds, all of them at once
    (a value written part as a reference, part percent-encoded, part escaped reads whole
    only then; a second round of decoding would need a third)."""
    present = []
    if b"%" in text and _PERCENT.search(text):
        present.append(_percent)
    if b"&" in text and _ENTITY.search(text):
        present.append(_entities)
    if b"\\" in text and _BACKSLASH.search(text):
        present.append(_backslashes)
    for decode in present:
        yield decode(text)
    if len(present) > 1:
        mixed = text
        for decode in present:
            mixed = decode(mixed)
        yield mixed


# --- the native path ------------------------------------------------------------------
# gateway/inspection/_decode_native.c, built by the package's install (setup.py; optional:
# without a C compiler the functions above run on their own). The Python code above is the
# specification; tests/test_decode_native.py checks the two against each other.
_native: Any = None
try:
    from gateway.inspection import _decode_native
except ImportError:  # pragma: no cover - a machine without a C compiler
    NATIVE_AVAILABLE = False
else:
    _decode_native.configure_invisible(_INVISIBLE_RANGES)
    _decode_native.configure_marks(_MARK_OR_FORM_BMP_RANGES)
    _decode_native.configure_forms([(cp, ord(to)) for cp, to in sorted(_LOOKALIKE.items())])
    NATIVE_AVAILABLE = True
    _native = _decode_native


def use_native(enabled: bool) -> None:
    """Choose the native finder (when it is built) or the reference (tests and benchmarks
    compare them)."""
    global _native
    _native = _decode_native if enabled and NATIVE_AVAILABLE else None
