"""The provider routes: one handler per carrier, each the wire path of proxy/flow.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.carriers.base import Carrier
from gateway.proxy import flow

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def handler_for(carrier: Carrier) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await flow.handle(request, carrier)

    return handler
