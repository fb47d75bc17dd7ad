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
from dataclasses import dataclass

from gateway.inspection import decoders


class LiteralError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SecretValue:
    """One configured literal. `ignore_case`: match ASCII letters in any case (for values
    people retype, such as internal project code names)."""

    value: str
    ignore_case: bool = False

    def __repr__(self) -> str:  # never the value
        return f"SecretValue(<{len(self.value)} chars>, ignore_case={self.ignore_case})"


def validate(values: list[str | SecretValue], *, min_length: int) -> tuple[SecretValue, ...]:
    """Distinct literals in first-seen order (a value configured both ways is matched
    case-insensitively). Too short or containing NUL → LiteralError naming the position
    only (never the value)."""
    seen: dict[str, bool] = {}
    for i, item in enumerate(values):
        value = item.value if isinstance(item, SecretValue) else item
        ignore_case = item.ignore_case if isinstance(item, SecretValue) else False
        if len(value) < min_length:
            raise LiteralError(f"secret value #{i + 1} is shorter than secret_values.min_length={min_length}")
        if "\x00" in value:
            raise LiteralError(f"secret value #{i + 1} contains a NUL character")
        seen[value] = seen.get(value, False) or ignore_case
    return tuple(SecretValue(v, c) for v, c in seen.items())


def _escaped(text: str) -> set[str]:
    forms = {json.dumps(text, ensure_ascii=False)[1:-1], json.dumps(text, ensure_ascii=True)[1:-1]}
    forms |= {f.replace("/", "\\/") for f in forms}
    return forms


def variants(value: str) -> tuple[bytes, ...]:
    """Every byte form of `value` to match, the plain UTF-8 form first."""
    forms: dict[str, None] = {value: None}
    normal = unicodedata.normalize("NFKC", value)
    forms.setdefault(normal, None)
    forms.setdefault(decoders.unmarked(value), None)  # its accents gone, as marks after each letter leave it
    for form in list(forms):  # look-alike letters, digits and dashes, as the normalised copy reads them
        forms.setdefault(decoders.fold_forms(form), None)
    once = set().union(*(_escaped(f) for f in list(forms)))
    for form in sorted(once):
        forms.setdefault(form, None)
    for form in sorted(set().union(*(_escaped(f) for f in once))):
        forms.setdefault(form, None)
    return tuple(f.encode("utf-8", "surrogatepass") for f in forms)
