"""Replayed prepared context on the proxy path (SPEC §7, §10): the header a request names
its replays with, and the store lookups that vouch for their dependencies.

A host that injects a prepared context into a provider request names it, one header value
per replayed block (at most 16, repeated headers or comma-separated):

    x-wiregate-prepared-context: binding=<reuse binding>; pointer=<RFC 6901 pointer,
        percent-encoded>; start=<first byte>; end=<end byte>

`start`/`end` are a half-open UTF-8 byte range of the decoded string at `pointer`.
before_send then verifies each replay exactly as `POST /v1/context/check` does
(checks/prepared.py). What it cannot know by itself — whether every dependency is still
the live head, and whether the principal may still read its scope — is looked up here,
before the check, and handed to it as plain answers.

Owns: the header's grammar, the lookups.
Must not: decide (prepared.verify does), or log the binding or pointer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from urllib.parse import unquote

from gateway import auth
from gateway.checks import prepared
from gateway.config.runtime import Principal, Runtime
from gateway.context.model import ArtifactAddress
from gateway.context.service import ContextService
from gateway.errors import ClientError
from gateway.http.params import ascii_int
from gateway.vocab import ReasonCode

HEADER = "x-wiregate-prepared-context"
MAX_REPLAYS = 16
_MAX_VALUE = 8192


def _bad() -> ClientError:
    return ClientError(422, "invalid_request", (ReasonCode.PREPARED_CONTEXT_MISMATCH,))


def parse(values: Sequence[str]) -> tuple[prepared.Replay, ...]:
    """The replays a request names (none: the header is absent). A malformed value is a
    422 — a replay that cannot be read is never ignored."""
    out: list[prepared.Replay] = []
    for value in values:
        if len(value) > _MAX_VALUE:
            raise _bad()
        for entry in value.split(","):
            if not entry.strip():
                continue
            fields: dict[str, str] = {}
            for part in entry.split(";"):
                name, sep, raw = part.strip().partition("=")
                if not sep or name in fields or name not in ("binding", "pointer", "start", "end"):
                    raise _bad()
                fields[name] = raw.strip()
            if set(fields) != {"binding", "pointer", "start", "end"}:
                raise _bad()
            start, end = ascii_int(fields["start"], 12), ascii_int(fields["end"], 12)
            if start is None or end is None:
                raise _bad()
            out.append(prepared.Replay(fields["binding"], unquote(fields["pointer"]), start, end))
            if len(out) > MAX_REPLAYS:
                raise _bad()
    return tuple(out)


async def eligibility(
    service: ContextService | None,
    runtime: Runtime,
    replays: Sequence[prepared.Replay],
    principal: Principal,
) -> Mapping[str, bool]:
    """For every dependency the replays' bindings name: is it still the live head, and may
    the principal still read its scope? (No context store: nothing is eligible.)"""
    answers: dict[str, bool] = {}
    if service is None or not replays:
        return answers
    now = time.time()
    readable: dict[str, bool] = {}

    async def may_read(scope_id: str) -> bool:
        if scope_id not in readable:
            record = await service.find_scope(scope_id)
            readable[scope_id] = record is not None and auth.may_on_scope(
                principal, scope_id, "context.read", record.created_by
            )
        return readable[scope_id]

    for replay in replays:
        scope, deps = prepared.dependencies(
            runtime.keyring, replay.binding, audience=runtime.config.deployment_id, now=now
        )
        scope_ok = bool(scope) and await may_read(scope)
        for dep in deps:
            key = prepared.dependency_key(dep)
            if key in answers:
                continue
            try:
                address = ArtifactAddress.from_wire(dep)
            except (ValueError, TypeError, KeyError):
                answers[key] = False
                continue
            ok = scope_ok and await may_read(address.scope_id)
            answers[key] = ok and (await service.dependencies_eligible([address])) is True
    return answers
