"""Container health check for wiregate, standard library only (the image has no curl).

GET /healthz (or the path in WIREGATE_HEALTH_PATH, e.g. /readyz) and exit 0 on HTTP 200,
1 otherwise, printing one short line either way.

Where it asks, in this order:
  * WIREGATE_HEALTH_URL=https://127.0.0.1:8443 — over TLS, verified against the CA in
    WIREGATE_HEALTH_CA (never unverified; the server name is the URL's host unless
    WIREGATE_HEALTH_SERVER_NAME names the one on the certificate);
  * otherwise the Unix socket at WIREGATE_HEALTH_SOCKET (default /run/wiregate/wiregate.sock),
    which needs no certificate and works whatever names the certificate carries.
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import sys
from urllib.parse import urlsplit

TIMEOUT_S = float(os.environ.get("WIREGATE_HEALTH_TIMEOUT", "3"))


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class VerifiedHTTPSConnection(http.client.HTTPConnection):
    """TLS to host:port, the certificate verified against `ctx` for `server_name`."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, server_name: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._ctx, self._server_name = ctx, server_name

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        try:
            self.sock = self._ctx.wrap_socket(raw, server_hostname=self._server_name)
        except BaseException:
            raw.close()
            raise


def connection() -> tuple[http.client.HTTPConnection, str]:
    url = os.environ.get("WIREGATE_HEALTH_URL")
    if url:
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("WIREGATE_HEALTH_URL must be an https:// URL")
        ca = os.environ.get("WIREGATE_HEALTH_CA")
        if not ca:
            raise ValueError("WIREGATE_HEALTH_URL needs WIREGATE_HEALTH_CA (the CA that signed the gateway certificate)")
        ctx = ssl.create_default_context(cafile=ca)
        server_name = os.environ.get("WIREGATE_HEALTH_SERVER_NAME") or parts.hostname
        conn = VerifiedHTTPSConnection(parts.hostname, parts.port or 443, ctx, server_name, TIMEOUT_S)
        return conn, url.rstrip("/")
    path = os.environ.get("WIREGATE_HEALTH_SOCKET", "/run/wiregate/wiregate.sock")
    return UnixHTTPConnection(path, TIMEOUT_S), f"unix:{path}"


def main() -> int:
    route = os.environ.get("WIREGATE_HEALTH_PATH", "/healthz")
    try:
        conn, where = connection()
        try:
            conn.request("GET", route, headers={"Host": "localhost", "User-Agent": "wiregate-healthcheck"})
            status = conn.getresponse().status
        finally:
            conn.close()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        print(f"unhealthy: {route}: {type(exc).__name__}: {exc}")
        return 1
    if status != 200:
        print(f"unhealthy: GET {route} via {where} answered {status}")
        return 1
    print(f"healthy: GET {route} via {where} answered 200")
    return 0


if __name__ == "__main__":
    sys.exit(main())
