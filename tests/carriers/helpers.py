"""Shared helpers for the carrier tests (bytes in, values out)."""

from __future__ import annotations

from pathlib import Path

from gateway.carriers import CARRIERS, sse
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest

FIX = Path(__file__).parent.parent / "fixtures"
LIMITS = CarrierLimits()


def units(parsed: ParsedRequest | FoldedResponse) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for unit in parsed.units:
        out.setdefault(unit.pointer, set()).add(unit.text)
    return out


def covers(found: dict[str, set[str]], pointer: str, text: str) -> bool:
    """Some unit at `pointer` holds `text` (JSON inside a string is inspected as that
    string when it has no escapes, and as one joined embedded unit when it does)."""
    return any(text in unit for unit in found.get(pointer, ()))


def fold(carrier: str, fixture: str) -> FoldedResponse:
    events, clean = sse.parse_all((FIX / fixture).read_bytes())
    assert clean
    return CARRIERS[carrier].fold_stream(events, LIMITS)
