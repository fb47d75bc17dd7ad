"""OpenAI Embeddings (`POST /v1/embeddings`).

Owns: the request's inputs (strings are text, read like every other string — JSON held in
them decoded again; token-id arrays cannot be read as text and are opaque content) and the
response, whose vectors — float lists, or base64 float32 when `encoding_format: "base64"`
(the openai SDK's default) — are model output numbers, not text. In the one shape the API
defines (`data` a list of objects whose `embedding` is a list of numbers or a base64 string
of whole float32 values) float lists are left out of the text units and the raw scan
(digits only give false positives), while a base64 vector is a unit like any string, so
the engine decodes it and scans the bytes (anything could be hidden in "floats"). Any other
shape is inspected in full, raw bytes included.
Must not: do I/O or judge content.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gateway.carriers import base, common, jsonraw
from gateway.carriers.base import CarrierLimits, FoldedResponse, ParsedRequest, PromptLayout, PromptPart, UsageReport
from gateway.carriers.jsonraw import JsonError
from gateway.carriers.jsonspan import Edit
from gateway.carriers.sse import SSEEvent
from gateway.usage import Count, all_unknown, known
from gateway.vocab import Dialect, ReasonCode


class OpenAIEmbeddings(base.NoEdits):
    name = "openai.embeddings"
    short_name = "embeddings"
    provider: Literal["openai", "anthropic"] = "openai"
    dialect = Dialect.OPENAI
    cache_style: Literal["markers", "key"] | None = None
    path = "/embeddings"
    route = "/v1/embeddings"  # the gateway route clients call

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        doc = base.require_object(raw, limits)
        model = base.require_model(doc)
        if doc.get("stream") not in (None, False):
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        fmt = doc.get("encoding_format")
        if fmt not in (None, "float", "base64"):
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        inputs = doc.get("input")
        opaque: list[str] = []
        # Token-id arrays are left out of the units (opaque): they can be millions of ints.
        found = base.units_of(jsonraw.without(doc, ("input",)), limits)
        if type(inputs) is str:
            found.extend(base.units_of(inputs, limits, ("input",)))
        elif isinstance(inputs, list) and inputs:
            for i, item in enumerate(inputs):
                if type(item) is str:
                    found.extend(base.units_of(item, limits, ("input", i)))
                elif type(item) is int or (isinstance(item, list) and all(type(t) is int for t in item)):
                    opaque.append("/input" if type(item) is int else f"/input/{i}")
                else:
                    raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
            if "/input" in opaque:
                opaque = ["/input"]
        else:
            raise JsonError(ReasonCode.UNSUPPORTED_CARRIER)
        return ParsedRequest(
            carrier=self.name,
            doc=doc,
            model=model,
            stream=False,
            units=tuple(found.units),
            opaque=tuple(opaque),
            duplicate_keys=tuple(found.dups),
            too_deep=tuple(found.deep),
        )

    def parse_response(self, raw: bytes, limits: CarrierLimits) -> FoldedResponse:
        try:
            doc = jsonraw.loads(raw, max_depth=limits.max_depth, check_depth=False)
            if not isinstance(doc, dict):
                raise JsonError(ReasonCode.JSON_INVALID)
            vectors = _well_formed_vectors(doc.get("data"))
            if vectors:
                # Everything but the vectors is text to inspect (object, model, index, ...).
                found = base.units_of(jsonraw.without(doc, ("data",)), limits)
                for i, item in enumerate(doc["data"]):
                    vector = item["embedding"] if type(item["embedding"]) is str else None
                    meta = item if vector is not None else jsonraw.without(item, ("embedding",))
                    found.extend(base.units_of(meta, limits, ("data", i)))
            else:
                found = base.units_of(doc, limits)  # not the shape we know: read all of it
        except JsonError as exc:
            return FoldedResponse.unreadable(exc.reason)
        usage = doc.get("usage")
        return FoldedResponse(
            units=tuple(found.units),
            complete=True,
            usage=UsageReport(dict(usage)) if isinstance(usage, dict) else None,
            response_id=None,
            is_error="error" in doc,
            duplicate_keys=tuple(found.dups),
            too_deep=tuple(found.deep),
            # The raw bytes of well-formed vectors are digits / base64 floats: matching
            # credential formats or digit literals there yields only false positives. Every
            # non-vector value is covered by the decoded units above.
            raw_scan=not vectors,
        )

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        return 0  # embeddings produce no output tokens

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        if not usage:
            return all_unknown()
        prompt = known(usage.get("prompt_tokens"))
        zero = Count(0, "known")  # embeddings are never cached and produce no output tokens
        return {
            "input_total": prompt,
            "input_uncached": prompt,
            "cache_read": zero,
            "cache_write": zero,
            "cache_write_5m": zero,
            "cache_write_1h": zero,
            "output": zero,
            "reasoning": zero,
        }

    def prompt_layout(self, doc: Mapping[str, Any]) -> PromptLayout:
        inputs = doc.get("input")
        texts = (
            [inputs]
            if isinstance(inputs, str)
            else [t for t in inputs or () if isinstance(t, str)]
            if isinstance(inputs, list)
            else []
        )
        return PromptLayout(
            tuple(PromptPart(("input", i), "message", i, "user", "text", t, True) for i, t in enumerate(texts))
        )

    def marker_edit(self, text: str, part: PromptPart, ttl: str) -> Edit:
        raise NotImplementedError("embeddings are not cached")

    def fold_stream(self, events: Sequence[SSEEvent], limits: CarrierLimits) -> FoldedResponse:
        return common.fold(_NoStream(limits), events)

    def stream_folder(self, limits: CarrierLimits) -> common.StreamFolder:
        return _NoStream(limits)

    def stream_error_event(self, code: str, reason_codes: Sequence[str], message: str, error_type: str) -> bytes:
        raise NotImplementedError("embeddings do not stream")


class _NoStream(common.StreamFolder):
    """Embeddings never stream: a stream here is not something we can vouch for."""

    def __init__(self, limits: CarrierLimits) -> None:
        super().__init__(limits)
        self.broken = ReasonCode.UNSUPPORTED_CARRIER


def _is_vector(value: Any) -> bool:
    if isinstance(value, list):
        return all(type(x) is int or type(x) is jsonraw.JsonFloat for x in value)
    if type(value) is str:
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
        return len(decoded) % 4 == 0
    return False


def _well_formed_vectors(data: Any) -> bool:
    """`data` is a non-empty list of objects each holding an `embedding` vector."""
    if not isinstance(data, list) or not data:
        return False
    return all(isinstance(item, dict) and _is_vector(item.get("embedding")) for item in data)
