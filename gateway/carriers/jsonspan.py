"""Byte-exact editing of JSON text: find where a value sits, insert next to it.

Owns: locating the span of the value at a path in a JSON document's text (without
re-serialising anything), and the two edits cache planning needs — adding a member at the
end of an object and replacing a value — so every byte outside the edit stays exactly as
the client sent it. Works on `str` (decoded UTF-8); re-encoding gives back the same bytes
for everything untouched.
Must not: do I/O, or accept documents with duplicate keys (callers refuse those first).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class SpanError(ValueError):
    pass


def _ws(text: str, at: int) -> int:
    end: int = _WS.match(text, at).end()  # type: ignore[union-attr]
    return end


def _value_end(text: str, at: int) -> int:
    try:
        _, end = _DECODER.raw_decode(text, at)
    except ValueError:
        raise SpanError("not a JSON value") from None
    return int(end)


def locate(text: str, path: Sequence[str | int]) -> tuple[int, int]:
    """(start, end) of the value at `path`, end exclusive. Raises SpanError."""
    at = _ws(text, 0)
    for step in path:
        if isinstance(step, str):
            at = _member(text, at, step)
        else:
            at = _element(text, at, step)
    return at, _value_end(text, at)


def _member(text: str, at: int, key: str) -> int:
    if text[at : at + 1] != "{":
        raise SpanError("not an object")
    at = _ws(text, at + 1)
    while text[at : at + 1] == '"':
        name, at = scanstring(text, at + 1)
        at = _ws(text, at)
        if text[at : at + 1] != ":":
            raise SpanError("malformed object")
        at = _ws(text, at + 1)
        if name == key:
            return at
        at = _ws(text, _value_end(text, at))
        if text[at : at + 1] == ",":
            at = _ws(text, at + 1)
    raise SpanError("no such member")


def _element(text: str, at: int, index: int) -> int:
    if text[at : at + 1] != "[":
        raise SpanError("not an array")
    at = _ws(text, at + 1)
    for _ in range(index):
        if text[at : at + 1] == "]":
            raise SpanError("no such element")
        at = _ws(text, _value_end(text, at))
        if text[at : at + 1] != ",":
            raise SpanError("no such element")
        at = _ws(text, at + 1)
    if text[at : at + 1] == "]":
        raise SpanError("no such element")
    return at


Edit = tuple[int, int, str]  # replace text[start:end] with the string


def add_member(text: str, span: tuple[int, int], member: str) -> Edit:
    """An edit appending `member` (`"key":value` JSON text) to the object at `span`."""
    start, end = span
    if text[start] != "{" or text[end - 1] != "}":
        raise SpanError("not an object")
    empty = not text[start + 1 : end - 1].strip()
    return end - 1, end - 1, (member if empty else "," + member)


def apply(text: str, edits: Sequence[Edit]) -> str:
    """Apply non-overlapping edits (any order)."""
    out = text
    for start, end, replacement in sorted(edits, key=lambda e: e[0], reverse=True):
        out = out[:start] + replacement + out[end:]
    return out
