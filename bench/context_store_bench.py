"""Context store benchmark: prepare p50/p99 (with and without receipt), write p50, search p50 per mode.

    .venv/bin/python bench/context_store_bench.py [--sizes 1000,10000,100000] [--backends sqlite,postgres]
        [--corpus pc45|zipf]

In-process (no HTTP). Memories are generated from a fixed-seed 45-word vocabulary like PowerContext's
own pc_bench.py (`--corpus zipf`: a 10,000-word vocabulary drawn by Zipf's law instead, where the
bag-of-words embedder sees none of the words); queries are "What do we know about <2–6 words>?".
Vector and hybrid searches use a deterministic bag-of-words embedder (a stand-in for a provider,
zero latency). Prints a table; no asserts.
The population phase uses synchronous=NORMAL on SQLite to save time; write p50 is measured separately
with the default synchronous=FULL. On PostgreSQL the tables are analysed after each fill (as autovacuum
would be soon after a load that size) so the planner has statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from gateway.context import search
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from gateway.context.store.postgres import PostgresContextStore, PostgresDatabase
from gateway.context.store.sqlite import SqliteContextStore, SqliteDatabase

PG_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test"
VOCAB = [
    "postgres",
    "billing",
    "staging",
    "deploy",
    "friday",
    "pytest",
    "region",
    "token",
    "cluster",
    "cache",
    "latency",
    "queue",
    "retry",
    "schema",
    "index",
    "backup",
    "replica",
    "failover",
    "kafka",
    "redis",
    "docker",
    "kubernetes",
    "helm",
    "terraform",
    "grafana",
    "alert",
    "oncall",
    "incident",
    "rollback",
    "canary",
    "feature",
    "flag",
    "migration",
    "auth",
    "oauth",
    "session",
    "cookie",
    "header",
    "gateway",
    "proxy",
    "upstream",
    "timeout",
    "budget",
    "quota",
    "tenant",
]
DIM = 48


async def embed(texts: list[str]) -> list[list[float]]:
    out = []
    for t in texts:
        words = set(search.tokens(t))
        out.append([1.0 if w in words else 0.0 for w in VOCAB[: DIM - 1]] + [0.1])
    return out


def allow(texts: list[str]) -> tuple[str, ...]:
    return ()


def yes(scope_id: str) -> bool:
    return True


ZIPF_WORDS = 10_000  # `--corpus zipf`: distinct words, drawn with probability ~ 1/rank (natural text's shape)


def zipf_vocabulary(n: int = ZIPF_WORDS) -> tuple[list[str], list[float]]:
    """`n` distinct pronounceable made-up words (fixed seed) and their cumulative Zipf weights."""
    rng = random.Random(2086)
    syllables = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]
    words: dict[str, None] = {}
    while len(words) < n:
        words["".join(rng.choice(syllables) for _ in range(rng.randint(2, 4)))] = None
    cum, total = [], 0.0
    for rank in range(1, n + 1):
        total += 1.0 / rank
        cum.append(total)
    return list(words), cum


class Corpus:
    """What memories and queries are made of: PowerContext's 45 words drawn uniformly (every
    memory holds a third of any query's words, so a search ranks most of the store), or a
    10,000-word vocabulary drawn by Zipf's law, which is closer to what people write."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.words: list[str] = VOCAB
        self.cum: list[float] | None = None
        if kind == "zipf":
            self.words, self.cum = zipf_vocabulary()

    def draw(self, rng: random.Random, k: int) -> str:
        if self.cum is None:
            return " ".join(rng.choice(self.words) for _ in range(k))
        return " ".join(rng.choices(self.words, cum_weights=self.cum, k=k))


CORPORA = ("pc45", "zipf")
CORPUS = Corpus("pc45")


def use_corpus(kind: str) -> None:
    """What `memory_text` and `query` draw from from now on (both benchmarks' `--corpus`)."""
    global CORPUS
    CORPUS = Corpus(kind)
    print(f"corpus: {kind}", flush=True)


def memory_text(rng: random.Random, i: int) -> str:
    return f"Memory {i}: " + CORPUS.draw(rng, rng.randint(8, 20))


def query(rng: random.Random) -> str:
    return "What do we know about " + CORPUS.draw(rng, rng.randint(2, 6)) + "?"


def pct(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] * 1000


async def populate(svc: ContextService, sid: str, start: int, stop: int, rng: random.Random, parallel: int) -> None:
    async def one(i: int) -> None:
        await svc.create_artifact(
            sid, "atomic-memory", {"kind": rng.choice(["fact", "decision"]), "text": memory_text(rng, i)}
        )

    for base in range(start, stop, parallel):
        await asyncio.gather(*(one(i) for i in range(base, min(stop, base + parallel))))


async def timed(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t)
    return out


async def bench_backend(kind: str, sizes: list[int], rows: list[list[str]]) -> None:
    tmp = tempfile.mkdtemp()
    schema = f"wg_bench_{int(time.time())}"
    dbs: list[Any] = []

    def make_store(full: bool) -> ContextStore:
        if kind == "sqlite":
            return SqliteContextStore(
                SqliteDatabase(str(Path(tmp) / "bench.db"), synchronous="FULL" if full else "NORMAL")
            )
        db = PostgresDatabase(PG_DSN, schema=schema)
        dbs.append(db)
        return PostgresContextStore(db)

    store = make_store(False)
    await store.open()
    svc = ContextService(store, check_write=allow, embed=embed)  # writes store vectors; searches per mode
    fts_svc = ContextService(store, check_write=allow)  # prepare as deployed without an embedder: fts
    await svc.start()
    sid = (await svc.create_scope(title="bench", summary="b", idempotency_key="bench", principal=None))[0].scope_id
    rng = random.Random(1435)
    have = 0
    try:
        for size in sizes:
            t0 = time.perf_counter()
            await populate(svc, sid, have, size, rng, 1 if kind == "sqlite" else 8)
            fill = time.perf_counter() - t0
            have = size
            if kind == "postgres":  # the statistics autovacuum would have gathered after a load this size
                with psycopg.connect(PG_DSN, autocommit=True) as conn:
                    for table in ("ctx_artifacts", "ctx_revisions"):
                        conn.execute(f"ANALYZE {schema}.{table}")
            qrng = random.Random(7)
            queries = [query(qrng) for _ in range(60)]
            it = iter(queries * 10)
            for q in queries[:5]:  # warm caches
                await fts_svc.prepare(sid, q, principal_may_read=yes)
            n = 60
            plain = await timed(lambda it=it: fts_svc.prepare(sid, next(it), principal_may_read=yes), n)
            rcpt = await timed(
                lambda it=it: fts_svc.prepare(sid, next(it), include_receipt=True, principal_may_read=yes), n
            )
            per_mode = {}
            for mode in ("fts", "vector", "hybrid"):
                per_mode[mode] = pct(
                    await timed(lambda m=mode, it=it: svc.search(sid, "atomic-memory", next(it), mode=m, limit=10), 30),
                    50,
                )
            rows.append(
                [
                    kind,
                    f"{size:,}",
                    f"{pct(plain, 50):.2f}",
                    f"{pct(plain, 99):.2f}",
                    f"{pct(rcpt, 50):.2f}",
                    f"{pct(rcpt, 99):.2f}",
                    f"{(statistics.median(rcpt) / statistics.median(plain) - 1) * 100:+.0f}%",
                    f"{per_mode['fts']:.2f}",
                    f"{per_mode['vector']:.2f}",
                    f"{per_mode['hybrid']:.2f}",
                    f"{fill:.0f}s",
                ]
            )
            print("  ".join(rows[-1]), flush=True)
        # write p50 with durable settings (SQLite synchronous=FULL), embedding included (zero-latency fake)
        wstore = make_store(True)
        await wstore.open()
        wsvc = ContextService(wstore, check_write=allow, embed=embed)
        wr = random.Random(3)
        writes = await timed(
            lambda: wsvc.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": memory_text(wr, 0)}), 200
        )
        print(f"{kind}: write p50 {pct(writes, 50):.2f} ms  p99 {pct(writes, 99):.2f} ms", flush=True)
        rows.append([kind, "write", f"{pct(writes, 50):.2f}", f"{pct(writes, 99):.2f}"] + [""] * 7)
        await wstore.close()
    finally:
        await store.close()
        if dbs:
            await dbs[0].drop_schema()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--corpus", choices=CORPORA, default="pc45")
    args = ap.parse_args()
    use_corpus(args.corpus)
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[list[str]] = []
    for kind in args.backends.split(","):
        await bench_backend(kind, sizes, rows)
    head = [
        "backend",
        "memories",
        "prep p50",
        "prep p99",
        "+rcpt p50",
        "+rcpt p99",
        "rcpt cost",
        "fts p50",
        "vector p50",
        "hybrid p50",
        "fill",
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("\n(ms)")
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    asyncio.run(main())
