"""Hop-by-hop header fields (RFC 9110 §7.6.1): what an intermediary never forwards.

Owns: the names that belong to one connection rather than to the message (the fixed ones,
and those a message's `Connection` header lists), and the names a profile may never pass
from a client to a provider.
Must not: import anything of wiregate's or do I/O. It is pure so that the profile model
(imported by the pure packages) and the proxy (both directions) share one list.
"""

from __future__ import annotations

from collections.abc import Mapping

# Connection-specific whatever a Connection header says: never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)

# Names a profile may not pass from a client to a provider: the hop-by-hop ones, the framing,
# coding and media type of the body (wiregate frames and sends the bytes it checked, as the
# JSON it read them as) and credentials (the provider gets the profile's own).
NEVER_PASSED = HOP_BY_HOP | frozenset(
    {"content-length", "content-encoding", "content-type", "expect", "host", "authorization", "x-api-key", "cookie"}
)


def connection_listed(headers: Mapping[str, str]) -> frozenset[str]:
    """The lower-cased names a message's Connection header(s) list: comma-separated tokens
    across every `Connection` line (a multidict's `items()` yields each line), empty list
    elements ignored. An intermediary drops these fields, and Connection itself."""
    names: set[str] = set()
    for name, value in headers.items():
        if name.lower() == "connection":
            names.update(token for part in value.split(",") if (token := part.strip(" \t").lower()))
    return frozenset(names)
