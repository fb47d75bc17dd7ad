"""Helpers several carriers share: non-stream response decoding and event decoding.

Must not: do I/O or know any one provider's schema.
"""

from __future__ import annotations

from typing import Any

from gateway.carriers import jsonraw
from gateway.carriers.base import CarrierLimits, FoldedResponse, TextUnit, UsageReport, units_of
from gateway.carriers.jsonraw import JsonError, Path
from gateway.inspection import verdict as rc


def json_response(
    raw: bytes,
    limits: CarrierLimits,
    *,
    error_key: str,
    skip: frozenset[str] = frozenset(),
) -> FoldedResponse:
    """Decode a complete non-stream JSON response. `skip` names top-level members whose
    values are not text (embedding vectors) and are left out of the units."""
    try:
        doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
        if not isinstance(doc, dict):
            raise JsonError(rc.JSON_INVALID)
        target: Any = doc
        if skip:
            target = {k: v for k, v in doc.items() if k not in skip}
        units, dups = units_of(target, limits)
    except JsonError as exc:
        return FoldedResponse(units=(), complete=False, incomplete_reason=exc.reason)
    usage = doc.get("usage")
    rid = doc.get("id")
    return FoldedResponse(
        units=tuple(units),
        complete=True,
        usage=UsageReport(dict(usage)) if isinstance(usage, dict) else None,
        response_id=rid if jsonraw.is_str(rid) else None,
        is_error=error_key in doc,
        duplicate_keys=tuple(dups),
    )


class EventDecoder:
    """Decodes each event's JSON payload, collecting every string it holds as units (every
    raw event is inspected decoded, not only the folded result).

    An event whose payload is ASCII without a single backslash holds every string, key
    and number verbatim: the scan of the raw (re-framed) stream already sees exactly what
    its decoded units would say, so they are not built again. Any escape, or any
    non-ASCII character (which gets an NFKC copy), takes the full path."""

    def __init__(self, limits: CarrierLimits) -> None:
        self.limits = limits
        self.units: list[TextUnit] = []
        self.dups: list[str] = []

    def decode(self, data: str, index: int) -> Any:
        doc = jsonraw.loads_text(data, max_depth=self.limits.max_depth, check_depth=False)
        base: Path = ("~events", index)
        if data.isascii() and "\\" not in data:
            if jsonraw.check_shape(doc, self.limits.max_depth):
                self.dups.append(jsonraw.pointer(base))
            return doc
        units, dups = units_of(doc, self.limits, base)
        self.units.extend(units)
        self.dups.extend(dups)
        return doc


def get_int(obj: Any, key: str) -> int | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if type(value) is int else None


def get_str(obj: Any, key: str) -> str | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if jsonraw.is_str(value) else None
