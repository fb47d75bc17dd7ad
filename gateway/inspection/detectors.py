"""Optional personal-data detectors (SPEC §6.3): email, phone, payment card, IBAN, US SSN.

Owns: each detector's Hyperscan-compatible candidate pattern, its confirmation regex
(with boundaries), and its validator (Luhn for cards, ISO 13616 mod-97 for IBANs, the SSA
rules for SSNs, digit counts for phones). A policy turns each on as `advisory` (recorded,
never blocks) or `required` (a finding blocks with `pii:<kind>`; a detector that fails
withholds with `detector_unavailable`).
Must not: do I/O or keep matched text.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_sre: Any = importlib.import_module("re._parser")  # the bounded width of a pattern


class DetectorFailure(Exception):
    """A detector could not do its job; the engine withholds (`detector_unavailable`)."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


@dataclass(frozen=True)
class Detector:
    kind: str
    pattern: str  # Hyperscan candidate pattern (bounded, no look-around)
    confirm: re.Pattern[bytes]  # the same with boundaries, for the window
    validate: Callable[[bytes], bool]
    max_width: int


def _digits(data: bytes) -> bytes:
    return bytes(c for c in data if 0x30 <= c <= 0x39)


def luhn_ok(digits: bytes) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = c - 0x30
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card(data: bytes) -> bool:
    digits = _digits(data)
    if not 13 <= len(digits) <= 19:
        return False
    prefix = digits.decode()
    known = (
        prefix.startswith("4")  # Visa
        or prefix[:2] in ("34", "37")  # Amex
        or 51 <= int(prefix[:2]) <= 55
        or 2221 <= int(prefix[:4]) <= 2720  # Mastercard
        or prefix.startswith(("6011", "65", "644", "645", "646", "647", "648", "649"))  # Discover
        or 3528 <= int(prefix[:4]) <= 3589  # JCB
        or prefix[:2] in ("36", "38", "39", "30")  # Diners
        or prefix.startswith(
            ("62", "50", "56", "57", "58", "6304", "6759", "6761", "6762", "6763")
        )  # UnionPay, Maestro
    )
    return known and luhn_ok(digits)


def iban_ok(data: bytes) -> bool:
    text = data.replace(b" ", b"").upper().decode("ascii")
    if not 15 <= len(text) <= 34:
        return False
    rotated = text[4:] + text[:4]
    number = "".join(str(int(ch, 36)) for ch in rotated)
    return int(number) % 97 == 1


def _ssn(data: bytes) -> bool:
    area, group, serial = data[:3], data[4:6], data[7:11]
    return area not in (b"000", b"666") and area[:1] != b"9" and group != b"00" and serial != b"0000"


def _phone(data: bytes) -> bool:
    digits = _digits(data)
    return 10 <= len(digits) <= 15 and len(set(digits)) >= 3


def _email(data: bytes) -> bool:
    domain = data.rsplit(b"@", 1)[-1]
    tld = domain.rsplit(b".", 1)[-1]
    return len(tld) >= 2 and tld.isalpha() and b".." not in domain


_NOT_WORD_LEFT = rb"(?<![A-Za-z0-9_])"
_NOT_WORD_RIGHT = rb"(?![A-Za-z0-9_])"
_NOT_DIGIT_LEFT = rb"(?<![0-9])"
_NOT_DIGIT_RIGHT = rb"(?![0-9])"

_EMAIL = r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63}){1,4}"
_PHONE = r"(\+[1-9][0-9]{0,2}[ .-]?)?(\([0-9]{2,4}\)|[0-9]{2,4})[ .-][0-9]{3,4}[ .-][0-9]{3,4}"
_CARD = r"[0-9]([ -]?[0-9]){12,18}"
_IBAN = r"[A-Z]{2}[0-9]{2}( ?[A-Z0-9]){11,30}"
_SSN = r"[0-9]{3}-[0-9]{2}-[0-9]{4}"


def _make(kind: str, pattern: str, left: bytes, right: bytes, validate: Callable[[bytes], bool]) -> Detector:
    confirm = re.compile(left + pattern.encode() + right)
    _, hi = _sre.parse(pattern.encode()).getwidth()
    return Detector(kind, pattern, confirm, validate, int(hi))


DETECTORS: dict[str, Detector] = {
    "email": _make("email", _EMAIL, _NOT_WORD_LEFT.replace(b"_]", b"_.%+-]"), _NOT_WORD_RIGHT, _email),
    "phone": _make("phone", _PHONE, _NOT_DIGIT_LEFT, _NOT_DIGIT_RIGHT, _phone),
    "card": _make("card", _CARD, _NOT_DIGIT_LEFT, _NOT_DIGIT_RIGHT, _card),
    "iban": _make("iban", _IBAN, _NOT_WORD_LEFT, _NOT_WORD_RIGHT, iban_ok),
    "us_ssn": _make("us_ssn", _SSN, _NOT_DIGIT_LEFT, _NOT_DIGIT_RIGHT, _ssn),
}


def confirm_in_window(detector: Detector, data: bytes, end: int) -> list[tuple[int, int]]:
    """Validated matches ending at `end` (the candidate end Hyperscan reported)."""
    lo = max(0, end - detector.max_width - 1)
    hi = min(len(data), end + 1)
    out: list[tuple[int, int]] = []
    pos = lo
    while pos < end:
        m = detector.confirm.search(data, pos, hi)
        if m is None or m.start() >= end:
            break
        if m.end() == end:
            try:
                valid = detector.validate(m.group(0))
            except Exception as exc:  # a validator that breaks must not pass silently
                raise DetectorFailure(detector.kind) from exc
            if valid:
                out.append((m.start(), m.end()))
                break
        pos = m.start() + 1
    return out


def full_scan(detector: Detector, data: bytes) -> list[tuple[int, int]]:
    """The slow engine: every validated match."""
    found: dict[int, int] = {}
    pos = 0
    while True:
        m = detector.confirm.search(data, pos)
        if m is None:
            return [(s, e) for e, s in found.items()]
        try:
            valid = detector.validate(m.group(0))
        except Exception as exc:
            raise DetectorFailure(detector.kind) from exc
        if valid and m.end() not in found:
            found[m.end()] = m.start()
        pos = m.start() + 1
