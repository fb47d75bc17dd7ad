"""Helpers several carriers share: non-stream response decoding and event decoding.

Must not: do I/O or know any one provider's schema.
"""

from __future__ import annotations

from typing import Any

from gateway.carriers import jsonraw
from gateway.carriers.base import CarrierLimits, FoldedResponse, TextUnit, UsageReport, parse_document, units_of
from gateway.carriers.jsonraw import JsonError, Path
from gateway.inspection import verdict as rc


def json_response(
    raw: bytes,
    limits: CarrierLimits,
    *,
    error_key: str | None,
    skip: frozenset[str] = frozenset(),
) -> FoldedResponse:
    """Decode a complete non-stream JSON response. `skip` names top-level members whose
    values are not text (embedding vectors) and are left out of the units."""
    try:
        if skip:
            doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
            if not isinstance(doc, dict):
                raise JsonError(rc.JSON_INVALID)
            units, dups = units_of({k: v for k, v in doc.items() if k not in skip}, limits)
        else:
            doc, units, dups = parse_document(raw, limits)
            if not isinstance(doc, dict):
                raise JsonError(rc.JSON_INVALID)
    except JsonError as exc:
        return FoldedResponse(units=(), complete=False, incomplete_reason=exc.reason)
    usage = doc.get("usage")
    rid = doc.get("id")
    return FoldedResponse(
        units=tuple(units),
        complete=True,
        usage=UsageReport(dict(usage)) if isinstance(usage, dict) else None,
        response_id=rid if jsonraw.is_str(rid) else None,
        is_error=error_key is not None and error_key in doc,
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
        base: Path = ("~events", index)
        if data.isascii() and "\\" not in data:
            doc, has_dups = jsonraw.decode_shape(data, self.limits.max_depth)
            if has_dups:
                self.dups.append(jsonraw.pointer(base))
            return doc
        doc, units, dups = parse_document(data, self.limits, base)
        self.units.extend(units)
        self.dups.extend(dups)
        return doc


def get_int(obj: Any, key: str) -> int | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if type(value) is int else None


def get_str(obj: Any, key: str) -> str | None:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if jsonraw.is_str(value) else None
