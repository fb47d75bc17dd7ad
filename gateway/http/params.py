"""Whole numbers a client writes in a query string, a header or a path segment.

Owns: `ascii_int`, the one reading of such a number: ASCII digits only, bounded in length.
(`str.isdigit` also takes "²" and "٣": the first made `int()` raise, a 500; the second was
read as 3.)
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
