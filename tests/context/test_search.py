"""Search: analyzer, admission, RRF, fts ranking, vector/hybrid with a fake embedder, auto fallback."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.context import errors, search
from gateway.context.errors import InferenceTimeout, InferenceUnavailable
from gateway.context.model import AtomicMemoryInput
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore, TextQuery
from tests.context.conftest import make_service, yes

VOCAB = ["postgres", "billing", "staging", "deploy", "friday", "pytest", "region", "token"]


def fake_vector(text: str) -> list[float]:
    """A deterministic bag-of-words embedding over VOCAB (a stand-in for an external provider)."""
    words = set(search.tokens(text))
    return [1.0 if w in words else 0.0 for w in VOCAB] + [0.05]


class FakeEmbedder:
    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.calls = 0

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return [fake_vector(t) for t in texts]


def test_analyzer_and_floor() -> None:
    assert search.tokens("Which database does billing-use?") == ["which", "database", "does", "billing", "use"]
    assert search.tokens("STRAẞE Straße") == ["strasse", "strasse"]  # casefold, not lower
    assert search.tokens("数据库 ok") == ["数", "据", "库", "数据", "据库", "ok"]
    assert search.tokens("e\u0301x") == ["éx"]
    assert [search.lexical_floor(n) for n in (1, 2, 3, 8, 9, 20)] == [1, 1, 2, 2, 3, 5]
    assert search.admits_lexically(search.terms("billing database which"), "billing database")
    assert not search.admits_lexically(search.terms("billing database which"), "billing only")
    assert search.pool_size(16) == 64 and search.pool_size(4) == 32


def test_rrf_scores_and_identity_tie_break() -> None:
    fused = search.rrf([("text", [b"b", b"a"]), ("vector", [b"a", b"b"])])
    assert [f.key for f in fused] == [b"a", b"b"]  # equal scores: identity bytes decide
    assert math.isclose(fused[0].score, 1 / 61 + 1 / 62)
    single = search.rrf([("text", [b"z"])])
    assert single[0].score == 1 / 61 and single[0].channels == ("text",)  # 1.4.1's 0.01639344262295082


@pytest.mark.asyncio
async def test_fts_ranking_admission_and_kind(service: ContextService) -> None:
    sid = (await service.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    texts = [
        "billing database billing postgres",
        "billing service",
        "staging region eu-west-1",
        "database of billing and postgres and more words here",
    ]
    ids = [
        (await service.create_artifact(sid, "atomic-memory", {"kind": "k" + str(i % 2), "text": t})).artifact_id
        for i, t in enumerate(texts)
    ]
    res = await service.search(sid, "atomic-memory", "billing postgres database")
    assert res.mode.value == "fts" and res.wire_mode == "text"
    got = [h.head.artifact_id for h in res.hits]
    assert set(got) == {ids[0], ids[3]}  # 3 terms → floor 2: "billing service" is not admitted
    assert got[0] == ids[0]  # BM25 / coverage ranks the denser match first
    assert [h.matched_by for h in res.hits] == [("text",), ("text",)]
    only_k1 = await service.search(sid, "atomic-memory", "billing", kind="k1")
    assert {h.head.artifact_id for h in only_k1.hits} == {ids[1], ids[3]}
    with pytest.raises(errors.CapabilityNotSupported):
        await service.search(sid, "atomic-memory", "billing", mode="vector")
    with pytest.raises(errors.CapabilityNotSupported):
        await service.search(sid, "atomic-memory", "billing", mode="hybrid")


@pytest.mark.asyncio
async def test_vector_hybrid_and_auto_fallback(store: ContextStore) -> None:
    embed = FakeEmbedder()
    svc = make_service(store, embed=embed)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    a = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "Postgres billing cluster"})).artifact_id
    b = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "deploy on friday"})).artifact_id
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.mode.value == "hybrid" and res.fallback_reason == "none"
    assert res.hits[0].head.artifact_id == a and res.hits[0].matched_by == ("text", "vector")
    vec = await svc.search(sid, "atomic-memory", "friday deploy", mode="vector")
    assert [h.head.artifact_id for h in vec.hits] == [b] and vec.hits[0].matched_by == ("vector",)

    embed.fail = InferenceUnavailable()
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.mode.value == "fts" and res.fallback_reason == "inference_unavailable"
    assert [h.head.artifact_id for h in res.hits] == [a]
    with pytest.raises(errors.ContextInferenceUnavailable):
        await svc.search(sid, "atomic-memory", "postgres billing", mode="hybrid")
    embed.fail = InferenceTimeout()
    res = await svc.search(sid, "atomic-memory", "postgres billing", mode="auto")
    assert res.fallback_reason == "inference_timeout"
    with pytest.raises(errors.ContextInferenceTimeout):
        await svc.search(sid, "atomic-memory", "postgres", mode="vector")

    # a write whose embedding fails is still stored; auto then runs fts (vectors incomplete) until backfilled
    c = (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": "pytest in staging"})).artifact_id
    embed.fail = None
    res = await svc.search(sid, "atomic-memory", "pytest staging", mode="auto")
    assert res.mode.value == "fts" and [h.head.artifact_id for h in res.hits] == [c]
    assert await svc.backfill_vectors() == 1
    res = await svc.search(sid, "atomic-memory", "pytest staging", mode="auto")
    assert res.mode.value == "hybrid"

    # prepare under auto records the fallback once, then reuses it
    embed.fail = InferenceUnavailable()
    await svc.create_artifact(sid, "topic-memory", {"title": "Billing", "summary": "postgres billing", "detail": "d"})
    embed.fail = None
    await svc.backfill_vectors()
    embed.fail = InferenceUnavailable()
    out = await svc.prepare(sid, "postgres billing", include_receipt=True, principal_may_read=yes)
    assert out.context["status"] == "ready" and out.receipt is not None
    searches = out.receipt["retrieval"]["searches"]
    reasons = {(s["family"], s["fallback_reason"]) for s in searches}
    assert ("atomic-memory", "inference_unavailable") in reasons
    assert ("topic-memory", "reused_fts_fallback") in reasons
    assert all(s["mode"] == "fts" for s in searches)


@pytest.mark.asyncio
async def test_fts_top_rows_are_the_exact_prefix_of_the_full_ranking_ties_included(store: ContextStore) -> None:
    """The store ranks by (score, artifact_id) and may cut before reading bodies; a small limit must give
    exactly the first rows of the full ranking, also when many rows tie at the cut and when a kind filters."""
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    other = (await svc.create_scope(title="o", summary="s", idempotency_key="o", principal=None))[0].scope_id
    for i in range(30):  # 30 identical texts tie; a few denser ones rank above them
        await svc.create_artifact(sid, "atomic-memory", {"kind": "k" + str(i % 3), "text": "billing postgres"})
    for i in range(4):
        text = "billing postgres billing postgres " + "x" * (i + 1)
        await svc.create_artifact(sid, "atomic-memory", {"kind": "k0", "text": text})
    await svc.create_artifact(other, "atomic-memory", {"kind": "k0", "text": "billing postgres"})
    terms = search.terms("billing postgres")
    for kind in (None, "k0", "k2"):
        full = await store.search_text(sid, "atomic-memory", terms, 1000, kind)
        assert len(full) == (34 if kind is None else 14 if kind == "k0" else 10)
        order = [(r.score, r.head.artifact_id) for r in full]
        assert order == sorted(order) and len({s for s, _ in order}) < len(order)  # ranked, with ties
        for limit in (1, 3, 5, 12, 33, 34, 35):
            cut = await store.search_text(sid, "atomic-memory", terms, limit, kind)
            assert [(r.score, r.head.artifact_id, r.head.content) for r in cut] == [
                (r.score, r.head.artifact_id, r.head.content) for r in full[:limit]
            ]


@pytest.mark.asyncio
async def test_sqlite_fts_index_migrates_from_the_two_column_layout(tmp_path: Path) -> None:
    """Version 1 kept one FTS row of (scope-and-family key, tokens); version 2 prefixes the key to every token.
    A database written under version 1 searches the same after the migration."""
    from gateway.context.store.common import fts_key
    from gateway.context.store.sqlite import CONTEXT_MIGRATIONS, SqliteContextStore, SqliteDatabase

    path = str(tmp_path / "ctx.db")
    store = SqliteContextStore(SqliteDatabase(path))
    await store.open()
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    texts = ["billing database billing postgres", "billing service", "数据库 billing", "staging region", ""]
    for t in texts:
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": t or "-"})
    await svc.create_artifact(sid, "topic-memory", {"title": "Billing", "summary": "postgres", "detail": "x"})
    queries = ["billing postgres database", "数据库", "region staging", "billing"]
    before = {q: await svc.search(sid, "atomic-memory", q) for q in queries}
    before["topic"] = await svc.search(sid, "topic-memory", "billing")
    await store.close()

    with sqlite3.connect(path) as conn:  # rewrite the index in the version-1 layout, as a v1 gateway left it
        rows = conn.execute(
            "SELECT a.rid, a.scope_id, a.family, t.t FROM ctx_terms t JOIN ctx_artifacts a ON a.rid = t.rowid"
        ).fetchall()
        assert len(rows) == len(texts) + 1
        conn.execute(CONTEXT_MIGRATIONS[0].sqlite[-1])
        for rid, scope_id, family, tagged in rows:
            key = fts_key(scope_id, family)
            conn.execute("INSERT INTO ctx_fts(rowid, k, t) VALUES (?, ?, ?)", (rid, key, tagged.replace(key, "")))
        conn.execute("DROP TABLE ctx_terms")
        conn.execute("DELETE FROM wg_schema_migrations WHERE component = 'context' AND version = 2")

    store = SqliteContextStore(SqliteDatabase(path))
    await store.open()
    try:
        svc = make_service(store)
        after = {q: await svc.search(sid, "atomic-memory", q) for q in queries}
        after["topic"] = await svc.search(sid, "topic-memory", "billing")
        for q, res in before.items():
            assert res.hits and [(h.head.artifact_id, h.score) for h in after[q].hits] == [
                (h.head.artifact_id, h.score) for h in res.hits
            ], q
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT max(version) FROM wg_schema_migrations WHERE component = 'context'").fetchone() == (
            2,
        )
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "ctx_terms" in names and "ctx_fts" not in names


def test_present_terms_remember_only_presence_and_stay_bounded() -> None:
    from gateway.context.store.common import PresentTerms

    memo = PresentTerms(capacity=3)
    probed: list[str] = []
    index = {"billing", "postgres"}

    def probe(term: str) -> bool:
        probed.append(term)
        return term in index

    class Memo:  # how a store uses it: probe the unknown terms, settle on what was found
        @staticmethod
        def present(scope_id: str, family: str, terms: list[str], probe: Callable[[str], bool]) -> list[str]:
            unknown = memo.unknown(scope_id, family, terms)
            return memo.settle(scope_id, family, terms, unknown, {t for t in unknown if probe(t)})

    assert Memo.present("s", "f", ["billing", "what", "postgres"], probe) == ["billing", "postgres"]
    assert probed == ["billing", "what", "postgres"]
    probed.clear()
    index.add("what")  # a later write adds a term that was absent: it is probed again, never dropped
    index.discard("postgres")  # a term that left the index stays in the query (harmless: same result)
    assert Memo.present("s", "f", ["billing", "what", "postgres"], probe) == ["billing", "what", "postgres"]
    assert probed == ["what"]
    assert memo.unknown("s", "other-family", ["billing"]) == ["billing"]  # per scope and family
    memo.remember("s", "f", ["a", "b"])  # capacity 3: the least recently used go first
    assert memo.unknown("s", "f", ["billing", "postgres", "what", "a", "b"]) == ["billing", "postgres"]


@pytest.mark.asyncio
async def test_search_after_the_index_changes_under_remembered_terms(store: ContextStore) -> None:
    """Remembered terms never change a result: a term that leaves the index and one that joins it later."""
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    a = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "billing postgres"})).artifact_id
    b = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "billing staging"})).artifact_id
    assert {h.head.artifact_id for h in (await svc.search(sid, "atomic-memory", "postgres staging")).hits} == {a, b}
    state = await svc.get_atomic_state(sid, a)
    await svc.change_lifecycle(sid, AtomicMemoryInput(state.artifact, 0), "forgotten")  # "postgres" leaves
    assert [h.head.artifact_id for h in (await svc.search(sid, "atomic-memory", "postgres staging")).hits] == [b]
    assert (await svc.search(sid, "atomic-memory", "postgres")).hits == ()
    assert (await svc.search(sid, "atomic-memory", "region")).hits == ()  # absent: probed, not remembered
    c = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "region eu"})).artifact_id
    assert [h.head.artifact_id for h in (await svc.search(sid, "atomic-memory", "region")).hits] == [c]
    # "billing region deploy": 3 terms, floor 2; c holds only "region", b only "billing"; d holds two
    d = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "deploy region"})).artifact_id
    assert [h.head.artifact_id for h in (await svc.search(sid, "atomic-memory", "billing region deploy")).hits] == [d]


@pytest.mark.asyncio
async def test_fts_results_do_not_depend_on_how_many_ranked_rows_are_rechecked(
    store: ContextStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one channel the service re-tokenises ranked rows only until it has as many admitted
    ones as it keeps: searches and prepares give exactly what rechecking every row gives, also
    when the recheck rejects rows the index matched (here: a deterministic third of them)."""
    import random

    from gateway.context import service as service_module

    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    rng = random.Random(5)
    for i in range(150):
        text = " ".join(rng.choice(VOCAB) for _ in range(rng.randint(2, 7)))
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"{text} n{i}"})
    admits = search.admits_lexically

    def pickier(terms: object, text: str, floor: int | None = None) -> bool:
        return admits(terms, text, floor) and sum(map(ord, text)) % 3 != 0  # type: ignore[arg-type]

    monkeypatch.setattr(search, "admits_lexically", pickier)
    queries = [" ".join(rng.choice(VOCAB) for _ in range(rng.randint(1, 5))) for _ in range(25)]

    async def outcomes() -> list[object]:
        out: list[object] = []
        for q in queries:
            for limit in (1, 3, 10, 40):
                found = await svc.search(sid, "atomic-memory", q, mode="fts", limit=limit)
                out.append([(h.head.artifact_id, h.score, h.matched_by, dict(h.channel_scores)) for h in found.hits])
            prepared = await svc.prepare(sid, q, principal_may_read=yes)
            out.append((prepared.context, prepared.dependencies))
        return out

    capped = await outcomes()
    whole = service_module._admitted

    def every_row(fam: object, rows: object, terms: object, need: int, enough: int | None) -> object:
        return whole(fam, rows, terms, need, None)  # type: ignore[arg-type]

    monkeypatch.setattr(service_module, "_admitted", every_row)
    assert await outcomes() == capped
    assert any(capped[i] for i in range(0, len(capped), 5))  # the searches found something


@pytest.mark.asyncio
async def test_sqlite_probes_the_unknown_terms_of_a_query_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unknown query terms are probed with one OR first: when none is in the index (the usual case once
    the present ones are remembered) that one probe is all; otherwise each is probed, as before."""
    from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

    probes: list[str] = []
    connect = SqliteDatabase._connect

    def traced(self: SqliteDatabase, *, read_only: bool) -> sqlite3.Connection:
        conn = connect(self, read_only=read_only)
        conn.set_trace_callback(lambda sql: probes.append(sql) if sql.startswith("SELECT 1 FROM ctx_terms") else None)
        return conn

    monkeypatch.setattr(SqliteDatabase, "_connect", traced)
    store = SqliteContextStore(SqliteDatabase(str(tmp_path / "probe.db")))
    await store.open()
    try:
        svc = make_service(store)
        await svc.start()
        sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
        a = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "billing postgres"})).artifact_id

        async def hits(query: str) -> list[str]:
            probes.clear()
            return [h.head.artifact_id for h in (await svc.search(sid, "atomic-memory", query)).hits]

        assert await hits("what billing") == [a]
        assert len(probes) == 3  # together (something is there), then each: "billing" is remembered
        assert await hits("what billing") == [a]
        assert len(probes) == 1  # only "what" is unknown: probed alone
        assert await hits("what do we know about billing") == []  # floor 2: a holds only "billing"
        assert len(probes) == 1  # five unknown terms, none in the index: one probe
        assert await hits("what do we know") == []
        assert len(probes) == 1
        b = (await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "what we know"})).artifact_id
        assert await hits("what do we know about billing") == [b]
        assert len(probes) == 6  # together, then each of the five
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_sqlite_bm25_counts_each_query_term_once_whatever_the_floor(tmp_path: Path) -> None:
    """PowerContext ranks by BM25 over the OR of the query's terms and uses the lexical floor only to
    choose the rows. Pushing the floor into the index must not change a row's score: as an OR of k-term
    groups, "≥ 2 of 5 terms" would count a term once per matching pair (a row holding m of the terms
    scored m - 1 times over). This corpus ranks differently under the two, and the store must give
    PowerContext's order and exactly its scores."""
    import itertools

    from gateway.context.store.common import fts_key
    from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

    path = str(tmp_path / "rank.db")
    store = SqliteContextStore(SqliteDatabase(path))
    await store.open()
    try:
        svc = make_service(store)
        await svc.start()
        sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
        texts = ["alpha beta", "gamma delta epsilon", "gamma other1", "delta other2", "epsilon other3"]
        texts += [f"noise{i}" for i in range(40)]
        ids = {}
        for text in texts:
            ids[(await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": text})).artifact_id] = text
        query = "alpha beta gamma delta epsilon"
        terms = search.terms(query)
        assert search.lexical_floor(len(terms)) == 2

        key = fts_key(sid, "atomic-memory")
        plain = " OR ".join(f'"{key}{t}"' for t in terms)
        pairs = " OR ".join(f'("{key}{a}" AND "{key}{b}")' for a, b in itertools.combinations(terms, 2))
        sql = (
            "SELECT a.artifact_id, bm25(ctx_terms) FROM ctx_terms JOIN ctx_artifacts a ON a.rid = ctx_terms.rowid "
            "WHERE ctx_terms MATCH ? ORDER BY 2, 1"
        )
        with sqlite3.connect(path) as conn:
            by_or = dict(conn.execute(sql, (plain,)).fetchall())
            by_pairs = [ids[i] for i, _ in conn.execute(sql, (pairs,)).fetchall()]
        assert by_pairs == ["gamma delta epsilon", "alpha beta"]  # the corpus tells the two rankings apart

        rows = await store.search_text(sid, "atomic-memory", terms, 10, min_match=2)
        assert [r.head.content["text"] for r in rows] == ["alpha beta", "gamma delta epsilon"]
        assert [r.score for r in rows] == [by_or[r.head.artifact_id] for r in rows]
        found = await svc.search(sid, "atomic-memory", query, mode="fts", limit=10)
        assert [ids[h.head.artifact_id] for h in found.hits] == ["alpha beta", "gamma delta epsilon"]
    finally:
        await store.close()


def test_at_least_matches_the_floor_and_scores_as_the_plain_or_bit_for_bit() -> None:
    """`at_least(terms, k)` as an FTS5 MATCH: exactly the rows holding at least k of the terms, each
    scored by BM25 exactly as under the plain OR of the terms (random corpora and term sets)."""
    import random

    from gateway.context.store.common import at_least

    rng = random.Random(1435)
    words = [f"w{i}" for i in range(9)]
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE d USING fts5(t)")
    docs = {}
    for rowid in range(1, 400):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 9)))
        docs[rowid] = set(text.split())
        conn.execute("INSERT INTO d(rowid, t) VALUES (?, ?)", (rowid, text))
    sql = "SELECT rowid, bm25(d) FROM d WHERE d MATCH ?"
    checked = 0
    for _ in range(60):
        terms = rng.sample(words, rng.randint(1, 7))
        k = rng.randint(1, len(terms))
        expected = {r for r, held in docs.items() if len(held & set(terms)) >= k}
        plain = dict(conn.execute(sql, (" OR ".join(terms),)).fetchall())
        found = dict(conn.execute(sql, (at_least(terms, k, lambda t: f'"{t}"'),)).fetchall())
        assert set(found) == expected
        assert all(found[r] == plain[r] for r in found)  # bit for bit, not approximately
        checked += len(found)
    assert checked > 1000


@pytest.mark.asyncio
async def test_search_hits_carry_the_state_the_store_holds(store: ContextStore) -> None:
    """Every mode's hits carry the state version read with them, equal to what a state read says;
    forgotten and merged memories are not hits, a replaced one is found at its new head."""
    embed = FakeEmbedder()
    svc = make_service(store, embed=embed)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    ids = [
        (await svc.create_artifact(sid, "atomic-memory", {"kind": "f", "text": text})).artifact_id
        for text in ("postgres billing one", "postgres billing two", "postgres billing three", "postgres billing four")
    ]
    head = await svc.get_artifact(sid, "atomic-memory", ids[0])
    revised = {"kind": "f", "text": "postgres billing one, revised"}
    await svc.replace_artifact(sid, "atomic-memory", ids[0], revised, if_match=head.etag)
    state = await svc.get_atomic_state(sid, ids[1])
    await svc.change_lifecycle(sid, AtomicMemoryInput(state.artifact, state.state_version), "forgotten")
    for mode in ("fts", "vector", "hybrid"):
        found = await svc.search(sid, "atomic-memory", "postgres billing", mode=mode)
        assert {h.head.artifact_id for h in found.hits} == {ids[0], ids[2], ids[3]}
        states = await svc.get_atomic_states(sid, [h.head.artifact_id for h in found.hits])
        for hit, held in zip(found.hits, states, strict=True):
            assert hit.state_version == held.state_version and held.state.value == "active"
            assert hit.head.ref == held.artifact and held.merged_into_id is None
        assert next(h for h in found.hits if h.head.artifact_id == ids[0]).head.revision == 2


@pytest.mark.asyncio
async def test_a_store_returns_only_enough_rows_when_its_match_enforces_the_floor(store: ContextStore) -> None:
    """`enough`: when the match itself leaves out every head below the floor (floor 1, or the floor pushed
    into the match), the store returns only the first `enough` rows of its ranking; under a plain OR that
    admission must still filter (too many term groups), it returns up to `limit`, because admission will
    drop some. The service's one-channel searches keep the same hits either way."""
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    words = [f"w{i}" for i in range(9)]
    for i in range(60):  # each text holds 1 to 4 of the words, in a fixed pattern
        held = [words[(i + j * 2) % 9] for j in range(1 + i % 4)]
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": " ".join(held)})

    few = search.terms("w0 w1 w2 w3")  # floor 2 pushed into the match: C(4, 2) groups
    for floor in (1, 2):
        full = await store.search_text(sid, "atomic-memory", few, 40, min_match=floor)
        assert len(full) > 5
        cut = await store.search_text(sid, "atomic-memory", few, 40, min_match=floor, enough=5)
        assert [(r.score, r.head.artifact_id) for r in cut] == [(r.score, r.head.artifact_id) for r in full[:5]]

    many = search.terms(" ".join(words))  # floor 3 over 9 terms: C(9, 3) = 84 groups, so a plain OR
    rows = await store.search_text(sid, "atomic-memory", many, 40, min_match=3, enough=5)
    below = [r for r in rows if search.matched_terms(many, r.head.content["text"]) < 3]
    assert len(rows) > 5 and below  # admission drops some: the store did not stop at `enough`

    for query in ("w0 w1 w2 w3", "w0 w1 w2 w3 w4 w5 w6 w7 w8", "w4"):
        wide = await svc.search(sid, "atomic-memory", query, mode="fts", limit=50)
        assert all(search.admits_lexically(search.terms(query), h.head.content["text"]) for h in wide.hits)
        for limit in (1, 3, 7):
            narrow = await svc.search(sid, "atomic-memory", query, mode="fts", limit=limit)
            assert [h.head.artifact_id for h in narrow.hits] == [h.head.artifact_id for h in wide.hits[:limit]]


async def _written_store(path: Path, merge_idle_s: float | None, count: int) -> tuple[Any, ContextService, str]:
    from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

    store = SqliteContextStore(SqliteDatabase(path, synchronous="NORMAL"), merge_idle_s=merge_idle_s)
    await store.open()
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    for i in range(count):  # one write transaction each, as the memory routes write
        text = " ".join(VOCAB[(i * j + j) % len(VOCAB)] for j in range(1, 2 + i % 5)) + f" note{i}"
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": text})
    return store, svc, sid


@pytest.mark.asyncio
async def test_sqlite_fts_segments_merge_and_ranking_stays_bit_for_bit(tmp_path: Path) -> None:
    """Memories written one transaction each leave FTS5 segments to merge; merging changes no row, score or
    order of any search, and once merged there is nothing left to merge."""
    store, svc, sid = await _written_store(str(tmp_path / "ctx.db"), None, 300)
    try:
        queries = ["postgres billing", "staging deploy friday", "pytest region token billing", "note7 postgres"]

        async def rankings() -> list[list[tuple[str, float]]]:
            out = []
            for q in queries:
                terms = search.terms(q)
                for floor in (1, search.lexical_floor(len(terms))):
                    rows = await store.search_text(sid, "atomic-memory", terms, 500, min_match=floor)
                    out.append([(r.head.artifact_id, r.score) for r in rows])
            return out

        before = await rankings()
        assert sum(len(r) for r in before) > 300
        assert await store.merge_index() >= 1  # the segments the writes left were merged
        assert await rankings() == before  # same rows, same order, scores equal as floats
        assert await store.merge_index() == 0  # one segment: nothing left
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_sqlite_fts_index_is_merged_once_writes_pause_and_close_leaves_nothing_running(tmp_path: Path) -> None:
    store, svc, sid = await _written_store(str(tmp_path / "idle.db"), 0.05, 120)
    try:
        # the idle pass runs 0.05 s after the last write (later when an earlier pass is still
        # in its last step); a slow or busy machine may take seconds, so wait on a deadline
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            merging = store._merging
            if store._merge_timer is None and merging is not None and merging.done():
                break  # the pass the last write armed has run (not an earlier one a write ended)
        assert merging is not None and merging.done()
        # the idle passes left one segment (120 one-write transactions leave several: see
        # the test above, where nothing merges on its own and the first pass has work)
        assert await store.merge_index() == 0
        # a write re-arms it; closing before it fires, or while it runs, leaves no task behind
        await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "postgres again"})
        assert store._merge_timer is not None
    finally:
        await store.close()
    assert store._merge_timer is None
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "context-fts-merge" and not t.done()]

    store2, svc2, sid2 = await _written_store(str(tmp_path / "busy.db"), 0.0, 60)
    await asyncio.sleep(0)  # the timer fires: a pass starts on the writer thread
    await asyncio.sleep(0)
    await store2.close()  # cancels the pass; a step already running ends before the database closes
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "context-fts-merge" and not t.done()]


@pytest.mark.asyncio
async def test_an_idle_timer_that_finds_a_pass_still_running_tries_again(tmp_path: Path) -> None:
    """The write that armed the timer ends the running pass only after its current step; the
    timer must not be dropped then, or the writes since stay unmerged until the next write."""
    store, _svc, _sid = await _written_store(str(tmp_path / "late.db"), None, 60)
    try:
        store._merge_idle_s = 0.01
        release = asyncio.Event()
        store._merging = asyncio.create_task(release.wait(), name="context-fts-merge")  # a pass in its last step
        store._start_merge()  # the timer fires meanwhile
        assert store._merge_timer is not None  # re-armed, not dropped
        release.set()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if store._merge_timer is None and store._merging.done():
                break
        assert store._merging.done() and store._merging.result() >= 1  # the pass after the pause merged
        assert await store.merge_index() == 0
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_a_merge_pass_on_a_closed_database_ends_quietly_and_other_errors_are_not_swallowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge pass swallows only what ends it for a reason merging may ignore (a closed
    database, a lock held past the busy timeout), not any RuntimeError of its own step."""
    from gateway.context.store import sqlite as sqlite_store

    store, _svc, _sid = await _written_store(str(tmp_path / "closed.db"), None, 20)
    db = store._db
    await store.close()
    with pytest.raises(sqlite_store.DatabaseClosed):
        await db.write(lambda conn: None)
    with pytest.raises(sqlite_store.DatabaseClosed):
        await db.read(lambda conn: None)
    assert await store.merge_index() == 0  # closed: the pass ends, nothing raised

    def broken(conn: object) -> bool:
        raise RuntimeError("a bug in a merge step")

    store, _svc, _sid = await _written_store(str(tmp_path / "broken.db"), None, 20)
    try:
        monkeypatch.setattr(sqlite_store, "_merge_step", broken)
        with pytest.raises(RuntimeError, match="a bug in a merge step"):
            await store.merge_index()
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_search_text_many_is_search_text_of_each_query(store: ContextStore) -> None:
    """One read for several queries gives exactly what each `search_text` call gives, in order:
    floors, `enough`, a kind filter, another family, an unknown scope and no terms included."""
    svc = make_service(store)
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    words = [f"w{i}" for i in range(7)]
    for i in range(40):
        held = [words[(i + j * 3) % 7] for j in range(1 + i % 3)]
        await svc.create_artifact(
            sid, "atomic-memory", {"kind": "fact" if i % 2 else "decision", "text": " ".join(held)}
        )
    await svc.create_artifact(sid, "topic-memory", {"title": "w1 notes", "summary": "w1 w2", "detail": "d"})
    few, many = search.terms("w0 w1 w2"), search.terms(" ".join(words))
    queries = [
        TextQuery(sid, "atomic-memory", few, 40),
        TextQuery(sid, "atomic-memory", few, 40, min_match=2, enough=5),
        TextQuery(sid, "atomic-memory", many, 12, kind="fact", min_match=2),
        TextQuery(sid, "topic-memory", few, 10),
        TextQuery(sid, "experience", few, 10),
        TextQuery("no-such-scope", "atomic-memory", few, 10),
        TextQuery(sid, "atomic-memory", (), 10),
    ]
    together = await store.search_text_many(queries)
    assert len(together) == len(queries) and all(r.seconds >= 0 for r in together)
    for q, got in zip(queries, together, strict=True):
        alone = await store.search_text(q.scope_id, q.family, q.terms, q.limit, q.kind, q.min_match, q.enough)
        assert [(r.head, r.score, r.state_version) for r in got.rows] == [
            (r.head, r.score, r.state_version) for r in alone
        ]
    assert together[0].rows and together[3].rows and not together[4].rows and not together[5].rows


@pytest.mark.asyncio
async def test_channel_scores_carry_1_4_1s_names_metrics_and_directions(store: ContextStore) -> None:
    """Text: SQLite's FTS5 score is `sqlite_bm25` (lower first), as 1.4.1 names it; PostgreSQL's
    ts_rank keeps its own name, `postgres_ts_rank` (higher first, the raw rank, not negated).
    Vector: the L2 distance between unit vectors, `l2_distance` (lower first). Topic memory:
    the channels that admit it, `topic_fts` (title, summary) and `detail_fts`, and `topic_vector`."""
    svc = make_service(store, embed=FakeEmbedder())
    await svc.start()
    sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": "billing runs on postgres"})
    both = {"title": "Billing", "summary": "billing notes", "detail": "billing runs nightly"}
    detail_only = {"title": "Notes", "summary": "cents", "detail": "the billing run"}
    for content in (both, detail_only):
        await svc.create_artifact(sid, "topic-memory", content)
    from gateway.context.store.sqlite import SqliteContextStore

    name, higher = store.text_metric
    assert (name, higher) == (
        ("sqlite_bm25", False) if isinstance(store, SqliteContextStore) else ("postgres_ts_rank", True)
    )
    found = await svc.search(sid, "atomic-memory", "billing friday postgres", mode="hybrid")
    (hit,) = found.hits
    text_raw, metric, up = hit.channel_scores["text"]
    assert (metric, up) == (name, higher) and (text_raw > 0 if higher else text_raw < 0)
    query, held = (search.unit(fake_vector(x)) or () for x in ("billing friday postgres", hit.head.content["text"]))
    distance = math.sqrt(2 - 2 * sum(a * b for a, b in zip(query, held, strict=True)))
    assert hit.channel_scores["vector"][1:] == ("l2_distance", False)
    assert hit.channel_scores["vector"][0] == pytest.approx(distance, abs=1e-6) and distance > 0.1
    topics = await svc.search(sid, "topic-memory", "billing", mode="hybrid")
    channels = {h.head.content["title"]: list(h.channel_scores) for h in topics.hits}
    assert channels == {"Billing": ["topic_fts", "topic_vector", "detail_fts"], "Notes": ["topic_vector", "detail_fts"]}
    assert topics.hits[0].head.content["title"] == "Billing"  # in both lexical channels: ranked first (RRF)
    fts = await svc.search(sid, "topic-memory", "billing", mode="fts")
    assert {h.head.content["title"]: h.matched_by for h in fts.hits} == {
        "Billing": ("detail_fts", "topic_fts"),
        "Notes": ("detail_fts",),
    }
