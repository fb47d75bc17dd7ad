"""The SQLite store's native ranking (gateway/context/store/_fts_native.c: `wg_bm25`, FTS5's
bm25() with one IDF walk per distinct term of the lexical floor) against FTS5's own bm25():
the same score for every row, bit for bit, on random corpora, term sets and floors; a map that
does not fit falls back to bm25()'s walks (same scores) while a wrong map that fits is seen
(so the comparison can fail); the module refuses a connection it cannot vouch for; and a real
store, whose connections get the function, returns exactly what it returns without it."""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from unittest.mock import patch

import pytest

from gateway.context import search
from gateway.context.store import common
from gateway.context.store import sqlite as sqlite_store
from gateway.context.store.common import at_least, at_least_terms, phrase_map
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase, install_ranking
from tests import native_build
from tests.context.test_search import make_service

AVAILABLE = sqlite_store._fts_native is not None
needs_native = native_build.needs(AVAILABLE, "native FTS5 ranking")
TOKENIZER = "tokenize=\"unicode61 remove_diacritics 0 categories 'L* N* M* Co'\""


def test_native_module_is_built_and_installs_when_required() -> None:
    native_build.assert_built(AVAILABLE, "gateway.context.store._fts_native", "native FTS5 ranking")
    conn = sqlite3.connect(":memory:")
    limit = sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH
    before = conn.getlimit(limit)
    assert install_ranking(conn)  # on this interpreter (3.11+, its libsqlite3 shared): it must install
    assert conn.getlimit(limit) == before  # the probe's limit is restored


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("exclusive", [True, False])
def test_phrase_order_is_the_expressions(n: int, exclusive: bool) -> None:
    """`at_least_terms` lists the phrases in the order `at_least` writes them (FTS5 numbers them so)."""
    terms = [f"t{i}" for i in range(n)]
    for k in range(1, n + 1):
        expression = at_least(terms, k, lambda t: f'"{t}"', exclusive=exclusive)
        assert ("NOT" in expression) == (exclusive and 1 < k < n)
        written = re.findall(r'"([^"]*)"', expression)
        assert at_least_terms(terms, k, exclusive=exclusive) == written
        assert phrase_map(terms, k, exclusive=exclusive) == "".join(chr(65 + terms.index(t)) for t in written)
    if n == 5:
        assert len(at_least_terms(terms, 3, exclusive=exclusive)) == (24 if exclusive else 19)


def _corpus(rng: random.Random, words: list[str], rows: int) -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE d USING fts5(t, {TOKENIZER})")
    conn.executemany(
        "INSERT INTO d(rowid, t) VALUES (?, ?)",
        [(r, " ".join(rng.choice(words) for _ in range(rng.randint(1, 14)))) for r in range(1, rows + 1)],
    )
    return conn


@needs_native
def test_scores_equal_bm25_bit_for_bit() -> None:
    """Every row of every match: `wg_bm25` == bm25(), compared as floats (==, not approximately)."""
    rng = random.Random(2086)
    words = [f"w{i}" for i in range(12)] + ["é", "日本", "x1"]
    conn = _corpus(rng, words, 600)
    assert install_ranking(conn)
    checked = differing_idf = 0
    for _ in range(80):
        terms = rng.sample(words, rng.randint(2, 8))
        k = rng.randint(2, len(terms))
        match = at_least(terms, k, lambda t: f'"{t}"')
        ref = conn.execute("SELECT rowid, bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid", (match,)).fetchall()
        got = conn.execute(
            "SELECT rowid, wg_bm25(d, ?) FROM d WHERE d MATCH ? ORDER BY rowid", (phrase_map(terms, k), match)
        ).fetchall()
        assert got == ref
        checked += len(ref)
        hits = {t: conn.execute("SELECT count(*) FROM d WHERE d MATCH ?", (f'"{t}"',)).fetchone()[0] for t in terms}
        differing_idf += len(set(hits.values())) > 1
    assert checked > 3000 and differing_idf > 40  # the maps mattered: the terms' IDFs differ


@needs_native
def test_both_forms_match_the_same_rows_and_wg_bm25_scores_them_as_bm25_the_exclusive_one() -> None:
    """The form without NOT names a held term in several matching branches: it matches exactly the
    rows of the exclusive form, and `wg_bm25` (counting each term once) gives each of them bm25()'s
    score of the exclusive form, bit for bit; bm25() itself would count such a term twice."""
    rng = random.Random(1435)
    words = [f"w{i}" for i in range(10)]
    conn = _corpus(rng, words, 700)
    assert install_ranking(conn)
    checked = overcounted = 0
    for _ in range(60):
        terms = rng.sample(words, rng.randint(3, 7))
        k = rng.randint(2, len(terms) - 1)
        exclusive = at_least(terms, k, lambda t: f'"{t}"')
        loose = at_least(terms, k, lambda t: f'"{t}"', exclusive=False)
        ref = conn.execute("SELECT rowid, bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid", (exclusive,)).fetchall()
        got = conn.execute(
            "SELECT rowid, wg_bm25(d, ?) FROM d WHERE d MATCH ? ORDER BY rowid",
            (phrase_map(terms, k, exclusive=False), loose),
        ).fetchall()
        assert got == ref
        doubled = conn.execute("SELECT rowid, bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid", (loose,)).fetchall()
        overcounted += doubled != ref
        checked += len(ref)
    assert checked > 5000 and overcounted > 30  # the loose form needs the per-term count


def _best(rows: list[tuple[int, float]], want: int) -> list[tuple[int, float]]:
    """What the store's cut keeps: every row scoring no worse than the want-th best, ties included."""
    ordered = sorted(rows, key=lambda r: (r[1], r[0]))
    if len(ordered) < want:
        return ordered
    return [r for r in ordered if r[1] <= ordered[want - 1][1]]


@needs_native
def test_pruning_keeps_every_row_the_cut_keeps() -> None:
    """With `want`, a row whose score cannot reach the want-th best so far is not measured and scores
    0.0: the rows no worse than the want-th best (ties included) are exactly bm25()'s, with its scores,
    and every other row is either scored exactly or pruned. Small vocabularies make many ties."""
    rng = random.Random(2086)
    pruned = checked = 0
    for vocabulary, rows in ((6, 900), (14, 1500)):
        words = [f"w{i}" for i in range(vocabulary)]
        conn = _corpus(rng, words, rows)
        assert install_ranking(conn)
        for _ in range(40):
            terms = rng.sample(words, rng.randint(2, min(6, vocabulary)))
            k = rng.randint(1, len(terms))
            want = rng.choice([1, 2, 5, 8, 24, 64, 5000])
            ref = conn.execute(
                "SELECT rowid, bm25(d) FROM d WHERE d MATCH ?", (at_least(terms, k, lambda t: f'"{t}"'),)
            ).fetchall()
            got = conn.execute(
                "SELECT rowid, wg_bm25(d, ?, ?) FROM d WHERE d MATCH ?",
                (phrase_map(terms, k, exclusive=False), want, at_least(terms, k, lambda t: f'"{t}"', exclusive=False)),
            ).fetchall()
            assert _best(got, want) == _best(ref, want)
            exact = dict(ref)
            assert all(score == 0.0 or score == exact[rowid] for rowid, score in got)
            assert sorted(rowid for rowid, _ in got) == sorted(exact)
            pruned += sum(1 for _, score in got if score == 0.0)
            checked += len(_best(ref, want))
    assert pruned > 1000 and checked > 1000  # pruning happened, and the kept rows were compared


@needs_native
def test_a_map_that_does_not_fit_falls_back_and_a_wrong_one_is_seen() -> None:
    rng = random.Random(1)
    words = [f"w{i}" for i in range(30)]  # each in well under half the rows: IDFs positive and different
    conn = _corpus(rng, words, 800)
    assert install_ranking(conn)
    terms = ["w1", "w2", "w3", "w4", "w5"]
    match = at_least(terms, 3, lambda t: f'"{t}"')
    sql_ref = "SELECT rowid, bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid"
    sql = "SELECT rowid, wg_bm25(d, ?) FROM d WHERE d MATCH ? ORDER BY rowid"
    ref = conn.execute(sql_ref, (match,)).fetchall()
    assert len(ref) > 20 and all(score < -0.5 for _, score in ref)
    good = phrase_map(terms, 3)
    for unfit in ("", "A", good + "A", good[:-1] + "~", None):  # wrong length or a byte out of range
        assert conn.execute(sql, (unfit, match)).fetchall() == ref
    assert conn.execute("SELECT rowid, wg_bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid", (match,)).fetchall() == ref
    assert conn.execute(sql, (good.translate(str.maketrans("AB", "BA")), match)).fetchall() == ref  # a relabelling
    wrong = good.replace("B", "A")  # fits, but gives w2's phrases w1's IDF
    assert conn.execute(sql, (wrong, match)).fetchall() != ref


@needs_native
def test_refuses_what_it_cannot_vouch_for() -> None:
    from gateway.context.store import _fts_native

    conn = sqlite3.connect(":memory:")
    limit = sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH
    conn.setlimit(limit, 4321)
    assert not _fts_native.install(conn, "0.0.1", 4321)  # not the interpreter's SQLite version
    assert not _fts_native.install(conn, sqlite3.sqlite_version, 4322)  # the handle does not read back
    assert _fts_native.install(conn, sqlite3.sqlite_version, 4321)

    class NotAConnection(sqlite3.Connection):
        pass

    assert not install_ranking(sqlite3.connect(":memory:", factory=NotAConnection))
    for wrong in (sqlite3.connect(":memory:", factory=NotAConnection), object(), b"x" * 64):
        assert not _fts_native.install(wrong, sqlite3.sqlite_version, 4321)  # never read as a connection
    other = sqlite3.connect(":memory:")
    other.execute("CREATE VIRTUAL TABLE d USING fts5(t)")
    with pytest.raises(sqlite3.OperationalError):  # never installed there: the name is unknown
        other.execute("SELECT wg_bm25(d, 'A') FROM d WHERE d MATCH 'x'").fetchall()


def test_other_interpreters_rank_with_bm25(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "version_info", (3, 15, 0, "final", 0))
    assert not install_ranking(sqlite3.connect(":memory:"))
    monkeypatch.setattr(sqlite_store, "_fts_native", None)
    monkeypatch.setattr(sys, "version_info", (3, 11, 7, "final", 0))
    assert not install_ranking(sqlite3.connect(":memory:"))


Write = Callable[[random.Random, list[str], int, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def _store(path: Path) -> AsyncIterator[tuple[SqliteDatabase, SqliteContextStore, str, Write]]:
    """An open store, its one scope's id, and `write(rng, words, n, longest)`: n atomic memories of 3 to
    `longest` words drawn from `words`."""
    db = SqliteDatabase(str(path))
    store = SqliteContextStore(db)
    await store.open()
    try:
        svc = make_service(store)
        await svc.start()
        sid = (await svc.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id

        async def write(rng: random.Random, words: list[str], n: int, longest: int) -> None:
            for _ in range(n):
                text = " ".join(rng.choice(words) for _ in range(rng.randint(3, longest)))
                await svc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": text})

        yield db, store, sid, write
    finally:
        await store.close()


@needs_native
@pytest.mark.asyncio
async def test_a_store_searches_the_same_with_and_without_it(tmp_path: Path) -> None:
    """One store, the same floors searched with its connections' `wg_bm25` and with bm25(): the same
    rows, order and scores; the native ranking was the one used."""
    async with _store(tmp_path / "rank.db") as (db, store, sid, write):
        rng = random.Random(45)
        words = [f"word{i}" for i in range(20)]
        await write(rng, words, 300, 12)
        used: list[str] = []
        real = common.phrase_map

        def recorded(terms: list[str], k: int, *, exclusive: bool = True) -> str:
            used.append(real(terms, k, exclusive=exclusive))
            return used[-1]

        compared = 0
        for _ in range(25):
            terms = search.terms(" ".join(rng.sample(words, rng.randint(3, 7))))
            floor = rng.randint(2, min(4, len(terms)))
            with patch.object(sqlite_store, "phrase_map", recorded):
                native = await store.search_text(sid, "atomic-memory", terms, 30, min_match=floor)
            with patch.object(db, "ranks_natively", lambda conn: False):
                plain = await store.search_text(sid, "atomic-memory", terms, 30, min_match=floor)
            assert [(r.head.artifact_id, r.score) for r in native] == [(r.head.artifact_id, r.score) for r in plain]
            compared += len(native)
        assert compared > 200 and len(used) == 25


@needs_native
def test_known_counts_replace_the_walks_and_only_when_they_fit() -> None:
    """`wg_df` counts the rows holding each phrase (what count(*) says); those counts given to
    `wg_bm25` give bm25()'s scores to the bit; counts that do not fit are ignored (the same scores),
    while wrong counts that fit are used (so the comparison can fail)."""
    rng = random.Random(7)
    words = [f"w{i}" for i in range(30)]
    conn = _corpus(rng, words, 800)
    assert install_ranking(conn)
    terms = ["w1", "w2", "w3", "w4", "w5"]
    counts = [conn.execute("SELECT count(*) FROM d WHERE d MATCH ?", (f'"{t}"',)).fetchone()[0] for t in terms]
    assert all(0 < n < 400 for n in counts) and len(set(counts)) > 1
    either = " OR ".join(f'"{t}"' for t in terms)
    df = conn.execute("SELECT wg_df(d) FROM d WHERE d MATCH ? LIMIT 1", (either,)).fetchone()[0]
    assert df == ",".join(map(str, counts))
    assert conn.execute("SELECT wg_df(d) FROM d WHERE d MATCH '\"absent\"'").fetchall() == []
    match = at_least(terms, 3, lambda t: f'"{t}"', exclusive=False)
    good = phrase_map(terms, 3, exclusive=False)
    ref = conn.execute(
        "SELECT rowid, bm25(d) FROM d WHERE d MATCH ? ORDER BY rowid", (at_least(terms, 3, lambda t: f'"{t}"'),)
    ).fetchall()
    sql = "SELECT rowid, wg_bm25(d, ?, 0, ?) FROM d WHERE d MATCH ? ORDER BY rowid"
    assert len(ref) > 20
    assert conn.execute(sql, (good, df, match)).fetchall() == ref
    too_many = ",".join(map(str, [*counts, 1]))
    unfit = ("", "1,2", df + ",", "," + df, df.replace(",", ";"), too_many, "1" * 19 + df[1:], "9999," + df[2:], None)
    for known in unfit:  # short, long, malformed, overlong digits, above the row count, absent
        assert conn.execute(sql, (good, known, match)).fetchall() == ref, known
    wrong = ",".join(map(str, [counts[1], counts[0], *counts[2:]]))  # fits, but swaps two terms' counts
    assert conn.execute(sql, (good, wrong, match)).fetchall() != ref


@needs_native
@pytest.mark.asyncio
async def test_a_store_keeps_term_counts_per_snapshot(tmp_path: Path) -> None:
    """The store counts each term's rows once per reader snapshot: a search repeated without a write
    asks `wg_df` nothing more, and after a write (a new snapshot) its scores are again bm25()'s, the
    counts taken afresh."""
    async with _store(tmp_path / "counts.db") as (db, store, sid, write):
        rng = random.Random(46)
        words = [f"word{i}" for i in range(12)]
        counted: list[int] = []
        real = SqliteContextStore._rows_holding

        def spy(self: SqliteContextStore, conn: sqlite3.Connection, phrases: list[str]) -> list[int]:
            """How many counts this call added to its reader's (a new snapshot starts from none)."""
            held = getattr(self._doc_counts, "held", None)
            before = held[2] if held is not None else None
            size = len(before) if before is not None else 0
            out = real(self, conn, phrases)
            after = self._doc_counts.held[2]
            counted.append(len(after) - (size if after is before else 0))
            return out

        terms = search.terms("word1 word2 word3 word4")
        await write(rng, words, 150, 10)
        for _ in range(3):
            with patch.object(SqliteContextStore, "_rows_holding", spy):
                native = await store.search_text(sid, "atomic-memory", terms, 40, min_match=2)
            with patch.object(db, "ranks_natively", lambda conn: False):
                plain = await store.search_text(sid, "atomic-memory", terms, 40, min_match=2)
            assert [(r.head.artifact_id, r.score) for r in native] == [(r.head.artifact_id, r.score) for r in plain]
            assert len(native) > 20
            await write(rng, words, 20, 10)  # a new snapshot: every count changes or may
        assert counted[0] == 4  # the first search counted its four terms
        # Repeated without a write in between: nothing counted again (both readers may have served it).
        again = []
        for _ in range(4):
            with patch.object(SqliteContextStore, "_rows_holding", spy):
                await store.search_text(sid, "atomic-memory", terms, 40, min_match=2)
            again.append(counted[-1])
        assert again.count(0) >= 2 and set(again) <= {0, 4}
