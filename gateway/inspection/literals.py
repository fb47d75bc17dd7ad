"""Configured secret values: validation and the byte forms each one can take on the wire.

Owns: turning one configured literal into every byte sequence that must be matched — its
UTF-8 bytes, its JSON-escaped forms (as a JSON encoder with and without `ensure_ascii`
writes it, with and without escaped slashes), those escaped once more (JSON carried inside
a JSON string, e.g. tool-call arguments seen raw), and its NFKC form.
Must not: log, print or otherwise expose a literal. Errors name the literal's position.
"""

from __future__ import annotations

import json
import unicodedata


class LiteralError(ValueError):
    pass


def validate(values: list[str], *, min_length: int) -> tuple[str, ...]:
    """Distinct literals in first-seen order. Too short or containing NUL → LiteralError
    naming the position only (never the value)."""
    seen: dict[str, None] = {}
    for i, value in enumerate(values):
        if len(value) < min_length:
            raise LiteralError(f"secret value #{i + 1} is shorter than secret_values.min_length={min_length}")
        if "\x00" in value:
            raise LiteralError(f"secret value #{i + 1} contains a NUL character")
        seen.setdefault(value, None)
    return tuple(seen)


def _escaped(text: str) -> set[str]:
    forms = {json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text, ensure_ascii=True)[1:-1]}
    forms |= {f.replace("/", "\\/") for f in forms}
    return forms


def variants(value: str) -> tuple[bytes, ...]:
    """Every byte form of `value` to match, the plain UTF-8 form first."""
    forms: dict[str, None] = {value: None}
    normal = unicodedata.normalize("NFKC", value)
    forms.setdefault(normal, None)
    once = set().union(*(_escaped(f) for f in list(forms)))
    for form in sorted(once):
        forms.setdefault(form, None)
    for form in sorted(set().union(*(_escaped(f) for f in once))):
        forms.setdefault(form, None)
    return tuple(f.encode("utf-8", "surrogatepass") for f in forms)
