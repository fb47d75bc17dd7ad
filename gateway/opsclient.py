"""A small client for a running gateway's operational routes (the CLI's `attribution`
commands): over its Unix socket (named by the configuration) or HTTPS.

Owns: one authenticated JSON request. The gateway key comes from the environment
(`WIREGATE_KEY`), never from the command line (where `ps` would show it).
Must not: print or log the key, or follow redirects.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

KEY_ENV = "WIREGATE_KEY"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def call(
    method: str,
    path: str,
    key: str,
    *,
    body: Any = None,
    uds: str | None = None,
    url: str | None = None,
    cafile: str | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """One request; returns (status, decoded JSON body or None)."""
    conn: http.client.HTTPConnection
    if uds is not None:
        conn = _UnixConnection(uds, timeout)
    else:
        if url is None:
            raise ValueError("a Unix socket or a URL is needed")
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("the gateway URL must be https://host[:port]")
        context = ssl.create_default_context(cafile=cafile)
        conn = http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=timeout, context=context)
    data = json.dumps(body).encode() if body is not None else None
    headers = {"authorization": f"Bearer {key}", "accept": "application/json"}
    if data is not None:
        headers["content-type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    finally:
        conn.close()
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = None
    return response.status, decoded
