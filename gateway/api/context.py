"""The context routes (SPEC §10, PowerContext 1.4.1 compatible): scopes, artifacts, atomic
memory, search and prepare, on the context service.

Owns: request validation in 1.4.1's schemas, authorisation per principal and scope, the
write check hook, 1.4.1's status codes, headers (ETag, Location) and error shape, and the
reuse envelope (the binding is sealed here, by the key ring).
Must not: touch the database (the service does), or put content in logs, metrics or errors.
"""

from __future__ import annotations

from aiohttp import web

from gateway.checks.store import refusal_reasons, write_verdict
from gateway.context.service import ContextService, ContextSettings
from gateway.context.store.database import Database
from gateway.state import RUNTIME


def service(app: web.Application, db: Database) -> ContextService:
    """The context service on `db`; every write is checked under the runtime current then."""
    holder = app[RUNTIME]

    def check_write(texts: list[str]) -> tuple[str, ...]:
        return refusal_reasons(write_verdict(holder.current, texts))

    cfg = holder.current.config.context
    return ContextService(
        db.context, check_write=check_write, settings=ContextSettings(embed_timeout_s=cfg.embed_timeout_s)
    )
