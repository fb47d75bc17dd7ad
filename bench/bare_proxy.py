"""The floor under the wire benchmark: the least a strict reverse proxy built on wiregate's own
stack can add to a call.

    .venv/bin/python bench/bare_proxy.py --upstream URL --upstream-key KEY --port P --uds PATH \
        --cert server.pem --key server.key

Same stack as `wiregate serve` (aiohttp server and client, uvloop, the same TLS context from
`gateway.listeners.server_tls_context`, keep-alive to the upstream), and the same shape of work
a strict call has: read the whole request, send it, read the whole response (SSE included),
then release it. Nothing else: no authentication, no parsing, no checks, no limits, no logs,
no metrics. It is a measuring instrument for `floor_bench.py`, never a product: it listens on
loopback and a Unix socket only and forwards to one fixed upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import uvloop
from aiohttp import web

from gateway.listeners import server_tls_context

CHAT_PATH = "/v1/chat/completions"


def make_app(upstream: str, key: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    sessions: list[aiohttp.ClientSession] = []

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)))
        yield
        await sessions[0].close()

    async def chat(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        async with sessions[0].post(upstream + CHAT_PATH, data=body, headers=headers) as resp:
            payload = await resp.read()
            return web.Response(body=payload, status=resp.status, headers={"content-type": resp.content_type})

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.cleanup_ctx.append(session_ctx)
    app.router.add_post(CHAT_PATH, chat)
    app.router.add_get("/healthz", healthz)
    return app


async def serve(args: argparse.Namespace) -> None:
    runner = web.AppRunner(make_app(args.upstream, args.upstream_key), access_log=None)
    await runner.setup()
    tls = server_tls_context(Path(args.cert), Path(args.key))
    await web.TCPSite(runner, "127.0.0.1", args.port, ssl_context=tls).start()
    await web.UnixSite(runner, args.uds).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--upstream-key", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--uds", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    uvloop.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
