"""The transport-neutral answer (`Reply`) and its JSON / SSE encodings.

Wire modules build a `Reply` -- status, headers and either a complete body or a list
of already-framed SSE events -- and `delivery` writes it (with timing and faults).
JSON is always compact UTF-8 with non-ASCII characters left unescaped, so multi-byte
characters really appear as multi-byte sequences on the wire.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON_CONTENT_TYPE = "application/json"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
SSE_DONE = b"data: [DONE]\n\n"


class WireError(Exception):
    """The request cannot be answered normally; becomes a provider-shaped error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Reply:
    """A complete answer: a body (`events` is None) or an SSE stream (`events` set)."""

    status: int = 200
    content_type: str = JSON_CONTENT_TYPE
    body: bytes = b""
    events: tuple[bytes, ...] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_stream(self) -> bool:
        return self.events is not None


def json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def json_reply(payload: Any, status: int = 200) -> Reply:
    return Reply(status=status, content_type=JSON_CONTENT_TYPE, body=json_bytes(payload))


def sse_data(payload: Any) -> bytes:
    """A data-only event (OpenAI Chat Completions framing)."""
    return b"data: " + json_bytes(payload) + b"\n\n"


def sse_named(event_type: str, payload: Any) -> bytes:
    """A named event (OpenAI Responses and Anthropic framing)."""
    return b"event: " + event_type.encode() + b"\ndata: " + json_bytes(payload) + b"\n\n"


def sse_reply(events: Sequence[bytes]) -> Reply:
    return Reply(status=200, content_type=SSE_CONTENT_TYPE, events=tuple(events))
