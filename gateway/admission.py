"""Token estimation and context-window admission (SPEC §9). PURE: values in, values out.

Owns: the named, versioned estimators (`runes/4` v1: ceil(Unicode characters / 4);
`character:weighted` v1, PowerContext's: an ASCII character counts 1 unit, any other 4,
tokens = ceil(units / 4)), the input estimate of a parsed request, and the admission rule:
estimated input × the profile's safety margin + requested output must fit the profile's
context window, else the request is withheld (`window_exceeded`) —
never truncated, never trimmed of tool exchanges, never re-recalled to fit.
Must not: do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gateway.units import TextUnit


@dataclass(frozen=True, slots=True)
class Estimator:
    name: str
    version: str
    count: Callable[[str], int]

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


def runes_div4(text: str) -> int:
    return math.ceil(len(text) / 4)


def character_weighted(text: str) -> int:
    if text.isascii():
        return math.ceil(len(text) / 4)
    units = sum(1 if ord(ch) < 128 else 4 for ch in text)
    return math.ceil(units / 4)


ESTIMATORS: dict[str, Estimator] = {
    "runes/4": Estimator("runes/4", "1", runes_div4),
    "character:weighted": Estimator("character:weighted", "1", character_weighted),
}


def estimate_input(units: Iterable[TextUnit], estimator: Estimator) -> int:
    """Tokens the provider will read, estimated from what the carrier says it reads.
    Joined units repeat their parts, so only the parts are counted."""
    count = estimator.count
    return sum(count(u.text) for u in units if u.kind in ("string", "key", "number"))


@dataclass(frozen=True, slots=True)
class Admission:
    admitted: bool
    estimated_input: int
    requested_output: int
    budget: int | None  # the context window, None when the profile sets none
    estimator: str


def admit(
    units: Iterable[TextUnit],
    *,
    requested: int | None,
    estimator: Estimator,
    margin: float,
    context_window: int | None,
    default_output: int | None,
) -> Admission:
    estimated = estimate_input(units, estimator)
    output = requested if requested is not None else (default_output or 0)
    if context_window is None:
        return Admission(True, estimated, output, None, estimator.label)
    fits = math.ceil(estimated * margin) + output <= context_window
    return Admission(fits, estimated, output, context_window, estimator.label)
