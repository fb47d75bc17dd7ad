"""Validate context-route responses against PowerContext 1.4.1's published OpenAPI document.

The document ships inside the official client package (`powercontext.http._generated.schema`,
byte-identical to what a 1.4.1 server serves at /openapi.json). OpenAPI 3.0 schemas become
JSON Schema (draft 2020-12) here: `nullable` → a null alternative, `$ref`s resolved against
the document. Known defects of the document itself (SkillProposal's undeclared
`description`) are irrelevant to the routes wiregate serves.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from typing import Any

import jsonschema
from powercontext.http._generated.schema import OPENAPI_SCHEMA


def _convert(node: Any) -> Any:
    if isinstance(node, list):
        return [_convert(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _convert(v) for k, v in node.items() if k not in ("nullable", "discriminator", "example")}
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/$defs/")
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _defs() -> dict[str, Any]:
    return {name: _convert(schema) for name, schema in OPENAPI_SCHEMA["components"]["schemas"].items()}


@cache
def _routes() -> list[tuple[re.Pattern[str], str, str]]:
    out = []
    for path in OPENAPI_SCHEMA["paths"]:
        pattern = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(path)) + "$"
        out.append((re.compile(pattern), path, path))
    # literal paths before templated ones (e.g. /v1/scopes/default before /v1/scopes/{scope_id})
    out.sort(key=lambda item: item[1].count("{"))
    return out


def operation(method: str, path: str) -> dict[str, Any]:
    for pattern, template, _ in _routes():
        if pattern.match(path):
            op = OPENAPI_SCHEMA["paths"][template].get(method.lower())
            if op is not None:
                return op
    raise AssertionError(f"{method} {path} is not a PowerContext 1.4.1 operation")


def response_schema(method: str, path: str, status: int) -> dict[str, Any] | None:
    op = operation(method, path)
    responses = op["responses"]
    spec = responses.get(str(status)) or responses.get(f"{str(status)[0]}XX") or responses.get("default")
    if spec is None:
        raise AssertionError(f"{method} {path}: 1.4.1 declares no {status} response")
    content = spec.get("content", {}).get("application/json")
    return None if content is None else content.get("schema")


def validate_response(method: str, path: str, status: int, body: Any) -> None:
    """Raise when `body` does not match what 1.4.1 declares for this operation and status.
    Error bodies are checked against the error envelope 1.4.1 uses for every error."""
    if status >= 400:
        schema: dict[str, Any] = {"$ref": "#/$defs/ErrorResponse"}
    else:
        found = response_schema(method, path, status)
        if found is None:
            assert body in (None, b"", ""), f"{method} {path} {status}: 1.4.1 declares no body"
            return
        schema = copy.deepcopy(_convert(found))
    schema["$defs"] = _defs()
    jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
