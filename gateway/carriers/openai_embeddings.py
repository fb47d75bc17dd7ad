"""OpenAI Embeddings (`POST /v1/embeddings`).

Owns: the request's inputs (strings are text; token-id arrays cannot be read as text and
are opaque content) and the response, whose vectors — float lists, or base64 float32 when
`encoding_format: "base64"` (the openai SDK's default) — are model output numbers, not text:
they are released byte-for-byte and left out of the text units.
Must not: do I/O or judge content.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from gateway.carriers import base, jsonraw
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest, TextUnit, UsageReport
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.sse import SSEEvent
from gateway.inspection import verdict as rc


class OpenAIEmbeddings:
    name = "openai.embeddings"
    provider: Literal["openai", "anthropic"] = "openai"
    path = "/embeddings"

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        doc = base.require_object(raw, limits)
        model = base.require_model(doc)
        if doc.get("stream") not in (None, False):
            raise JsonError(rc.UNSUPPORTED_CARRIER)
        fmt = doc.get("encoding_format")
        if fmt not in (None, "float", "base64"):
            raise JsonError(rc.UNSUPPORTED_CARRIER)
        inputs = doc.get("input")
        opaque: list[str] = []
        rest = {k: v for k, v in doc.items() if k != "input"}
        units, dups = base.units_of(rest, limits)
        if isinstance(inputs, str):
            units.append(TextUnit(("input",), inputs, "string"))
        elif isinstance(inputs, list) and inputs:
            for i, item in enumerate(inputs):
                if type(item) is str:
                    units.append(TextUnit(("input", i), item, "string"))
                elif type(item) is int or (isinstance(item, list) and all(type(t) is int for t in item)):
                    opaque.append("/input" if type(item) is int else f"/input/{i}")
                else:
                    raise JsonError(rc.UNSUPPORTED_CARRIER)
            if "/input" in opaque:
                opaque = ["/input"]
        else:
            raise JsonError(rc.UNSUPPORTED_CARRIER)
        return ParsedRequest(
            carrier=self.name,
            doc=doc,
            model=model,
            stream=False,
            units=tuple(units),
            opaque=tuple(opaque),
            duplicate_keys=tuple(dups),
        )

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse:
        try:
            doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
        except JsonError as exc:
            return FoldedResponse(units=(), complete=False, incomplete_reason=exc.reason)
        if not isinstance(doc, dict):
            return FoldedResponse(units=(), complete=False, incomplete_reason=rc.JSON_INVALID)
        # Everything but the vectors is text to inspect (object, model, index, error, ...).
        rest = {k: v for k, v in doc.items() if k != "data"}
        units, dups = base.units_of(rest, limits)
        data = doc.get("data")
        for i, item in enumerate(data if isinstance(data, list) else ()):
            if not isinstance(item, dict):
                return FoldedResponse(units=(), complete=False, incomplete_reason=rc.JSON_INVALID)
            meta = {k: v for k, v in item.items() if k != "embedding"}
            more, more_dups = base.units_of(meta, limits, ("data", i))
            units.extend(more)
            dups.extend(more_dups)
        usage = doc.get("usage")
        return FoldedResponse(
            units=tuple(units),
            complete=True,
            usage=UsageReport(dict(usage)) if isinstance(usage, dict) else None,
            response_id=None,
            is_error="error" in doc,
            duplicate_keys=tuple(dups),
            # The raw bytes are mostly vector digits / base64 floats: matching credential
            # formats or digit literals there yields only false positives. Every non-vector
            # value is covered by the decoded units above.
            raw_scan=False,
        )

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse:
        # Embeddings never stream; a stream here is not something we can vouch for.
        return FoldedResponse(units=(), complete=False, incomplete_reason=rc.UNSUPPORTED_CARRIER)

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str) -> bytes:
        raise NotImplementedError("embeddings do not stream")
