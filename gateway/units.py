"""Text units: the currency between carriers (which produce them) and inspection (which
reads them), and the key vocabulary of the wire schemas that both need.

Owns: `TextUnit` (a piece of text the provider will read, or the client receive, with its
path), `Path`, RFC 6901 `pointer`, `location` (a pointer safe to log), `SCHEMA_KEYS` and
`STRUCTURAL_FIELDS`.
Must not: import anything from the gateway but `vocab`.
"""

from __future__ import annotations

from typing import NamedTuple

Path = tuple[str | int, ...]

KIND_STRING = "string"
KIND_KEY = "key"
KIND_NUMBER = "number"
KIND_VALUES = "values"


class TextUnit(NamedTuple):
    """One piece of text, with the path of where it sits. A plain tuple: payloads produce
    thousands of these. `kind`: string | key | number (a number's lexical form) |
    embedded (inside JSON held in a string) | joined (text parts of one message) | folded
    (a reassembled stream) | values (the string values of JSON held in a string, read in
    order: for configured values only, like the engine's own joined reading)."""

    path: Path
    text: str
    kind: str

    @property
    def pointer(self) -> str:
        return pointer(self.path)


def pointer(path: Path) -> str:
    """RFC 6901 JSON pointer for a path."""
    if not path:
        return ""
    parts = []
    for p in path:
        s = str(p)
        if "~" in s or "/" in s:
            s = s.replace("~", "~0").replace("/", "~1")
        parts.append(s)
    return "/" + "/".join(parts)


# Object keys of the wire schemas wiregate knows (compile-time constants). A logged
# location keeps a key segment only when it is one of these; any other key — client or
# model text, which can be a secret itself — is written as `*`. Array indexes stay.
SCHEMA_KEYS: frozenset[str] = frozenset(
    {
        "~events",
        "~headers",
        "model",
        "messages",
        "role",
        "content",
        "text",
        "type",
        "name",
        "tool_calls",
        "function",
        "function_call",
        "arguments",
        "tools",
        "parameters",
        "description",
        "properties",
        "items",
        "system",
        "input",
        "instructions",
        "metadata",
        "user",
        "output",
        "delta",
        "choices",
        "message",
        "input_schema",
        "tool_result",
        "tool_use",
        "tool_use_id",
        "tool_call_id",
        "id",
        "source",
        "data",
        "media_type",
        "partial_json",
        "thinking",
        "reasoning",
        "reasoning_content",
        "refusal",
        "response",
        "item",
        "summary",
        "error",
        "custom",
        "audio",
        "transcript",
        "content_block",
        "usage",
        "embedding",
        "object",
        "call_id",
        "output_text",
        "prompt",
        "stop",
        "logit_bias",
        "response_format",
        "json_schema",
        "schema",
        "required",
        "enum",
        "title",
        "default",
        "examples",
        "anyOf",
        "oneOf",
        "allOf",
    }
)

# Members whose string values label the structure rather than carry text a reader reads
# on (roles, types, ids, model names, statuses). When the text of a document is read in
# order, across units, these are left out: a value split across two messages has a role
# between its halves.
STRUCTURAL_FIELDS: frozenset[str] = frozenset(
    {
        "role",
        "type",
        "model",
        "id",
        "object",
        "status",
        "tool_call_id",
        "tool_use_id",
        "call_id",
        "item_id",
        "media_type",
        "stop_reason",
        "finish_reason",
        "encoding_format",
        "detail",
        "format",
        "ttl",  # a cache marker's lifetime ("5m", "1h"), between two text parts
    }
)
# Folded stream fields that label structure (a role, a type, an id, a tool's name): a windowed
# release sends them whole, unheld. A field of model text never takes one of these names.
LABEL_FIELDS: frozenset[str] = STRUCTURAL_FIELDS | {"name"}


def location(path: Path) -> str:
    """A JSON pointer safe to log: schema keys and array indexes only, other keys `*`."""
    parts = [str(p) if type(p) is int or p in SCHEMA_KEYS else "*" for p in path]
    return "/" + "/".join(parts) if parts else ""
