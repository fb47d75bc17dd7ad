"""The release ledger: each send binding admits exactly one released payload.

Owns: the `ReleaseLedger` interface (re-checking the same payload is idempotent; a
different payload under the same send binding is refused) and its in-memory form, bounded
and per process (entries leave when their correlation deadline has passed, or the oldest
first at the bound).
Must not: know about checks or content (it sees a binding id and a payload digest).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

# An entry outlives its binding's deadline by this much before it is purged: a request that
# read its clock before an await (or another replica's clock, a little behind) may still
# admit under the binding, and must find the payload it holds, never an empty slot.
PURGE_GRACE_S = 300.0


class ReleaseLedger(Protocol):
    async def admit(self, binding_id: str, payload_digest: str, until: float, now: float) -> bool:
        """True when `payload_digest` is (or already was) the one payload released under
        `binding_id`; `until` is when the binding's correlation ends."""
        ...


class MemoryReleaseLedger:
    """In one process. At 100,000 entries (the default bound) it holds about 40 MB."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._seen)

    async def admit(self, binding_id: str, payload_digest: str, until: float, now: float) -> bool:
        known = self._seen.get(binding_id)
        if known is not None:
            return known[0] == payload_digest
        expired = now - PURGE_GRACE_S
        while self._seen and (len(self._seen) >= self._capacity or next(iter(self._seen.values()))[1] < expired):
            self._seen.popitem(last=False)
        self._seen[binding_id] = (payload_digest, until)
        return True
