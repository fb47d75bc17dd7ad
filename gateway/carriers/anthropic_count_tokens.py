"""Anthropic token counting (`POST /v1/messages/count_tokens`): the Messages request body,
answered with `{"input_tokens": N}`.

Owns: what differs from Messages — the route, no prompt caching (the provider ignores
`cache_control` here, so no marker is planned and the body leaves as the client sent it),
no output asked for, never a stream (a reused Messages body's `stream` is not a request
for one: the answer is one JSON body), and a response that reports what the prompt would
cost rather than usage (counting is free: its usage record says zero tokens, known).
Everything the provider reads is read exactly as for Messages (same body, same units,
same opaque content): the request goes through the same before_send checks, and its
response through before_release like any other.
Must not: do I/O or judge content.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from gateway.carriers.anthropic_messages import AnthropicMessages
from gateway.carriers.base import CarrierLimits, ParsedRequest
from gateway.usage import KINDS, Count, known


class AnthropicCountTokens(AnthropicMessages):
    name = "anthropic.count_tokens"
    # A profile that carries Anthropic Messages carries its token counting too.
    short_name = "messages"
    cache_style: Literal["markers", "key"] | None = None
    path = "/v1/messages/count_tokens"
    route = "/v1/messages/count_tokens"

    def parse_request(self, raw: bytes, limits: CarrierLimits) -> ParsedRequest:
        """As Messages reads it, but never a stream: counting answers with one JSON body
        whatever a reused Messages body says about `stream`."""
        return dataclasses.replace(super().parse_request(raw, limits), stream=False)

    def requested_output(self, doc: Mapping[str, Any]) -> int | None:
        return 0

    def usage_counts(self, usage: Mapping[str, Any] | None) -> dict[str, Count]:
        """Counting is not billed as input or output: every kind is a known zero."""
        return {kind: known(0) for kind in KINDS}
