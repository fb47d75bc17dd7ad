"""Whole numbers a client writes in a query string, a header or a path segment.

Owns: `ascii_int`, the one reading of such a number: ASCII digits only, bounded in length
(`str.isdigit` also takes "²" and "٣": the first made `int()` raise, a 500; the second was
read as 3), and `ascii_number`, the same for a decimal (`float()` also reads "٥", "５",
"1_000" and " 5 ").
Must not: decide what range a number may take (the caller does).
"""

from __future__ import annotations

import re

_DIGITS = re.compile(r"[0-9]+")


def ascii_int(text: str, max_digits: int) -> int | None:
    """`text` as a whole number when it is 1 to `max_digits` ASCII digits; else None."""
    if not 0 < len(text) <= max_digits or _DIGITS.fullmatch(text) is None:
        return None
    return int(text)


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def ascii_number(text: str, max_chars: int = 64) -> float | None:
    """`text` as a number when it is a plain ASCII decimal (sign, digits, point, exponent)
    of at most `max_chars` characters; else None. Not finite (1e999) is the caller's to refuse."""
    if not 0 < len(text) <= max_chars or _DECIMAL.fullmatch(text) is None:
        return None
    return float(text)
