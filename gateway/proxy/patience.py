"""How long the caller will wait for an answer, as its SDK declares it.

Owns: reading the timeout the official SDKs send with every request
(`x-stainless-timeout`, `x-stainless-read-timeout`: seconds, the client's read timeout)
into a monotonic instant after which the caller has given up waiting for response
headers. The flow uses it so that a retry wait (a provider's long `retry-after`) that
would outlast the caller is not slept through: the provider's answer goes back at once.
Must not: do I/O, or lengthen any limit of ours (a declared timeout only shortens waits).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

DECLARED_TIMEOUT_HEADERS = ("x-stainless-timeout", "x-stainless-read-timeout")


def declared_timeout(headers: Mapping[str, str]) -> float | None:
    """The shortest positive, finite timeout the client declares, in seconds, or None
    (absent or unreadable values are ignored: they never shorten anything)."""
    found: list[float] = []
    for name in DECLARED_TIMEOUT_HEADERS:
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value)
        except ValueError:
            continue
        if math.isfinite(seconds) and seconds > 0:
            found.append(seconds)
    return min(found) if found else None


def waits_until(headers: Mapping[str, str], arrived: float, deadline: float) -> float:
    """The monotonic instant by which a retry wait must be over: the call's own deadline,
    or earlier when the client declares it will have given up by then."""
    declared = declared_timeout(headers)
    if declared is None:
        return deadline
    return min(deadline, arrived + declared)
