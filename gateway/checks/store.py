"""Nothing sensitive at rest: the check every context-store write passes (SPEC §10.2).

A write is inspected with the same engine and policy as a request: the exact request body
as received (every string, key and number, decoded like any request) and the normalised
texts the store would keep. Any finding — or anything the engine cannot vouch for, such as
duplicate keys — refuses the write; there is no observe mode for what would be stored.
Must not: store, log or return any of the text.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.carriers import jsonraw
from gateway.carriers.jsonraw import JsonError
from gateway.checks import inspect
from gateway.config.runtime import Runtime
from gateway.inspection.engine import Subject
from gateway.inspection.verdict import Verdict, withhold
from gateway.units import TextUnit
from gateway.vocab import ReasonCode

STORE_PROFILE = "~context-store"  # the inspection's profile label for writes (never an opaque allowance)


def write_verdict(runtime: Runtime, texts: Sequence[str], body: bytes | None = None) -> Verdict:
    """The verdict on one write: `texts` as the store would keep them, `body` as received."""
    units = [TextUnit(("~store", i), text, "string") for i, text in enumerate(texts)]
    dups: list[str] = []
    if body is not None:
        try:
            _, body_units, duplicate_paths = jsonraw.decode_units(body, (), runtime.carrier_limits.max_depth)
        except JsonError as exc:
            return withhold(exc.reason, runtime.policy.version)
        units.extend(body_units)
        dups = ["/".join(str(p) for p in path) or "/" for path in duplicate_paths]
    subject = Subject(raw=body, units=units, duplicate_keys=dups)
    return inspect.inspect(runtime, subject, STORE_PROFILE)


def refusal_reasons(verdict: Verdict) -> tuple[str, ...]:
    """Content-free reasons a write is refused for (empty: it may be stored)."""
    if verdict.allowed:
        return ()
    return tuple(verdict.reason_codes) or (ReasonCode.INSPECTION_ERROR,)
