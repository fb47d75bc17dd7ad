"""Tokens longer than PostgreSQL's 2,047-byte lexeme bound: both stores find them, exactly.

Analyzer v1 keeps an unbroken run of letters and marks as one token, so one sentence of a script
written without spaces (Thai, Lao, Khmer, Myanmar) is one token of kilobytes. SQLite indexes it
whole; PostgreSQL indexes and looks it up as a fixed-length stand-in. Searches, the lexical floor
(which counts the real terms) and prepare give the same answers on both stores, and a PostgreSQL
database indexed before the stand-ins existed is indexed again by context migration 2.
"""

from __future__ import annotations

import secrets

import psycopg
import pytest

from gateway.context import search
from gateway.context.model import etag_for
from gateway.context.service import ContextService
from gateway.context.store.postgres import PostgresContextStore, PostgresDatabase
from tests.context.conftest import PG_DSN, drop_schema, make_service, require_pg, yes

pytestmark = pytest.mark.asyncio

LONG = "x" * 2100  # one token of 2,100 bytes
NEAR = "x" * 2099 + "y"  # another token of the same length: must not match LONG
# One run of letters and marks (no space, no punctuation): one token of 2,304 bytes.
THAI = "การประชุมทีมจะจัดขึ้นทุกวันอังคารเวลาสิบโมงเช้า" * 16


async def test_the_tokens_pass_the_bound() -> None:
    for token in (LONG, NEAR, THAI):
        assert search.terms(token) == (token,) and len(token.encode("utf-8")) > 2047


async def _scope(svc: ContextService) -> str:
    return (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id


async def _ids(svc: ContextService, sid: str, family: str, query: str) -> list[str]:
    res = await svc.search(sid, family, query, mode="fts", limit=10)
    return [h.head.artifact_id for h in res.hits]


async def _prepared(svc: ContextService, sid: str, query: str) -> tuple[str, list[str]]:
    out = await svc.prepare(sid, query, principal_may_read=yes)
    return out.context["status"], [d.artifact.artifact_id for d in out.dependencies]


async def test_a_long_token_is_found_exactly(service: ContextService) -> None:
    sid = await _scope(service)
    long_mem = (
        await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"alpha {LONG}"})
    ).artifact_id
    near_mem = (
        await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"alpha {NEAR}"})
    ).artifact_id
    short = (await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "alpha beta"})).artifact_id

    assert await _ids(service, sid, "atomic-memory", LONG) == [long_mem]
    assert await _ids(service, sid, "atomic-memory", NEAR) == [near_mem]
    # two terms (floor 1): the memory holding both ranks first, the others hold "alpha"
    both = await _ids(service, sid, "atomic-memory", f"{LONG} alpha")
    assert both[0] == long_mem and sorted(both) == sorted([long_mem, near_mem, short])
    # three terms (floor 2): only the memories holding a long token and "alpha" are admitted
    floor = await _ids(service, sid, "atomic-memory", f"{LONG} {NEAR} alpha")
    assert sorted(floor) == sorted([long_mem, near_mem])
    assert await _prepared(service, sid, LONG) == ("ready", [long_mem])

    lesson = f"the lesson {LONG}"
    exp = await service.create_artifact(
        sid, "experience", {"situation": "s", "action": "a", "outcome": "o", "lesson": lesson}
    )
    assert await _ids(service, sid, "experience", LONG) == [exp.artifact_id]


async def test_a_sentence_of_an_unspaced_script_is_found(service: ContextService) -> None:
    sid = await _scope(service)
    mem = (await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": THAI})).artifact_id
    await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "การประชุม ทีม"})
    assert await _ids(service, sid, "atomic-memory", THAI) == [mem]
    assert await _prepared(service, sid, THAI) == ("ready", [mem])


async def test_a_replace_indexes_its_long_tokens_again(service: ContextService) -> None:
    sid = await _scope(service)
    head = await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "alpha"})
    assert await _ids(service, sid, "atomic-memory", LONG) == []
    head = await service.replace_artifact(
        sid,
        "atomic-memory",
        head.artifact_id,
        {"kind": "fact", "text": f"alpha {LONG}"},
        if_match=etag_for(head.revision),
    )
    assert await _ids(service, sid, "atomic-memory", LONG) == [head.artifact_id]
    await service.replace_artifact(
        sid, "atomic-memory", head.artifact_id, {"kind": "fact", "text": "alpha"}, if_match=etag_for(head.revision)
    )
    assert await _ids(service, sid, "atomic-memory", LONG) == []


async def test_postgres_migration_indexes_rows_written_without_long_tokens() -> None:
    """A database whose rows were indexed under context v1 (long tokens left out of `tsv`) finds
    them after migration 2; other rows' lexemes are left as they were."""
    require_pg()
    schema = "wgt_" + secrets.token_hex(6)
    try:
        store = PostgresContextStore(PostgresDatabase(PG_DSN, schema=schema))
        await store.open()
        svc = make_service(store)
        await svc.start()
        sid = await _scope(svc)
        long_mem = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"a {LONG}"})).artifact_id
        thai_mem = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": THAI})).artifact_id
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "a " + "ก" * 300})
        await store.close()

        with psycopg.connect(PG_DSN, autocommit=True) as conn:  # as a v1 gateway left it
            conn.execute(f'SET search_path = "{schema}"')
            before = conn.execute("SELECT rid, tsv::text FROM ctx_artifacts ORDER BY rid").fetchall()
            conn.execute(
                "UPDATE ctx_artifacts SET tsv = array_to_tsvector(ARRAY(SELECT l FROM "
                "unnest(tsvector_to_array(tsv)) AS u(l) WHERE l NOT LIKE '#sha256:%'))"
            )
            conn.execute("DELETE FROM wg_schema_migrations WHERE component = 'context' AND version = 2")
            stripped = conn.execute("SELECT rid, tsv::text FROM ctx_artifacts ORDER BY rid").fetchall()
            assert stripped != before

        store = PostgresContextStore(PostgresDatabase(PG_DSN, schema=schema))
        await store.open()
        try:
            svc = make_service(store)
            await svc.start()
            assert await _ids(svc, sid, "atomic-memory", LONG) == [long_mem]
            assert await _ids(svc, sid, "atomic-memory", THAI) == [thai_mem]
        finally:
            await store.close()
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{schema}"')
            assert conn.execute("SELECT rid, tsv::text FROM ctx_artifacts ORDER BY rid").fetchall() == before
            version = conn.execute("SELECT max(version) FROM wg_schema_migrations WHERE component = 'context'")
            assert version.fetchone() == (2,)
    finally:
        drop_schema(schema)
