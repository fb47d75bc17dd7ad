"""A search or prepare reads each candidate row's text once per request, and off the event loop.

Topic memory's detail is up to 125,000 characters: it used to be chunked and tokenised in pure
Python on the event loop two or three times per candidate row (admission, channels, snippet),
so one request stalled every other for seconds. Now each row's tokenisation, admission, channels
and best chunk are computed once per request (`service._Scans`) in a worker thread
(`service._rank_text`, `service._snippets`). No timing here: which thread does the work, and how
often.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from gateway.context import excerpt, search
from gateway.context import service as service_module
from gateway.context.service import ContextService
from gateway.context.store.base import ContextStore
from tests.context.conftest import make_service, yes

N_TOPICS = 12
QUERY = "billing ledger 가나 cents"


def _detail(seed: int) -> str:
    rnd = random.Random(seed)
    words = ["billing", "ledger", "cents", "invoice", "가나다", "나가", "refund", "tax"]
    sentences = [" ".join(rnd.choice(words) for _ in range(rnd.randint(4, 14))) + "." for _ in range(220)]
    return "\n\n".join(" ".join(sentences[i : i + 5]) for i in range(0, len(sentences), 5))


async def _seeded(service: ContextService) -> str:
    sid = (await service.create_scope(title="t", summary="s", idempotency_key="k", principal=None))[0].scope_id
    for i in range(N_TOPICS):
        content = {"title": f"topic {i} billing", "summary": f"summary {i}", "detail": _detail(i)}
        await service.create_artifact(sid, "topic-memory", content)
    for i in range(4):
        await service.create_artifact(sid, "atomic-memory", {"kind": "fact", "text": f"billing ledger fact {i} 가나"})
        situation = {"situation": f"billing {i}", "action": "ledger", "outcome": "cents", "lesson": f"가나 {i}"}
        await service.create_artifact(sid, "experience", situation)
    return sid


def _recording(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, record: Callable[[str, tuple[Any, ...]], None]
) -> None:
    original = getattr(module, name, None)
    if original is None:  # not in this version of the module
        return

    def recorded(*args: Any, **kwargs: Any) -> Any:
        record(name, args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)


@pytest.mark.asyncio
async def test_scoring_and_snippets_run_off_the_event_loop(
    service: ContextService, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await _seeded(service)
    threads: list[tuple[str, int]] = []

    def record(name: str, args: tuple[Any, ...]) -> None:
        threads.append((name, threading.get_ident()))

    for name in ("chunks", "matched_terms", "detail_match", "snippet"):
        _recording(monkeypatch, excerpt, name, record)
    _recording(monkeypatch, search, "admits_lexically", record)
    loop_thread = threading.get_ident()

    for family in ("topic-memory", "atomic-memory", "experience"):
        found = await service.search(sid, family, QUERY, mode="fts", limit=5)
        assert found.hits
    prepared = await service.prepare(sid, QUERY, principal_may_read=yes)
    assert prepared.context["status"] == "ready"

    names = {name for name, _ in threads}
    assert {"chunks", "snippet"} <= names  # the topic details were chunked and snipped
    assert names & {"matched_terms", "admits_lexically"}  # and rows admitted
    on_loop = sorted({name for name, ident in threads if ident == loop_thread})
    assert not on_loop, f"ran on the event loop's thread: {on_loop}"


@pytest.mark.asyncio
async def test_each_row_is_chunked_and_tokenised_once_per_request(
    service: ContextService, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await _seeded(service)
    chunked: Counter[str] = Counter()
    tokenised: Counter[str] = Counter()
    inside = threading.local()  # in a matched_terms call (which may call search.tokens on its text)

    def record(name: str, args: tuple[Any, ...]) -> None:
        if name == "chunks":
            chunked[args[0]] += 1
        elif not getattr(inside, "on", False):  # the text a tokeniser reads
            tokenised[args[-1]] += 1

    _recording(monkeypatch, excerpt, "chunks", record)
    _recording(monkeypatch, search, "tokens", record)
    matched = getattr(excerpt, "matched_terms", None)
    if matched is not None:

        def matched_once(terms: Any, text: str) -> int:
            record("matched_terms", (terms, text))
            inside.on = True
            try:
                return int(matched(terms, text))
            finally:
                inside.on = False

        monkeypatch.setattr(excerpt, "matched_terms", matched_once)
    details = {_detail(i) for i in range(N_TOPICS)}

    def check(what: str) -> None:
        assert set(chunked) == details, f"{what}: every topic is a candidate and chunked"
        twice = {text[:40]: n for text, n in (chunked + tokenised).items() if n > 1 and text != QUERY}
        assert not twice, f"{what}: {len(twice)} texts chunked or tokenised more than once: {sorted(twice.items())[:3]}"
        chunked.clear()
        tokenised.clear()

    found = await service.search(sid, "topic-memory", QUERY, mode="fts", limit=5)  # reads a pool of 32 rows
    assert len(found.hits) == 5
    check("search")
    prepared = await service.prepare(sid, QUERY, principal_may_read=yes)
    assert prepared.context["status"] == "ready"
    check("prepare")  # its search and its snippets share the rows' chunks


@pytest.mark.asyncio
async def test_the_scan_memo_keeps_results(store: ContextStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh service per query and one reused give the same answers, and so does a service
    whose admission is pickier than the store's match (rows the store returns but the service
    rejects: the memo must not admit them through another path)."""
    service = make_service(store)
    await service.start()
    sid = await _seeded(service)
    queries = [QUERY, "ledger", "가나다 refund tax", "invoice cents billing nothing", "나가"]

    async def outcomes() -> list[object]:
        out: list[object] = []
        for q in queries:
            for family in ("topic-memory", "atomic-memory", "experience"):
                for limit in (1, 3, 20):
                    found = await service.search(sid, family, q, mode="fts", limit=limit)
                    out.append(
                        [(h.head.artifact_id, h.score, h.matched_by, dict(h.channel_scores)) for h in found.hits]
                    )
            prepared = await service.prepare(sid, q, principal_may_read=yes)
            out.append((prepared.context, prepared.dependencies))
        return out

    plain = await outcomes()
    assert any(plain)
    matched = excerpt.matched_terms

    def pickier(terms: Any, text: str) -> int:
        return matched(terms, text) if sum(map(ord, text)) % 3 else 0

    monkeypatch.setattr(excerpt, "matched_terms", pickier)
    picky = await outcomes()
    assert picky != plain  # some rows are rejected now
    whole = service_module._admitted

    def every_row(fam: Any, rows: Any, scans: Any, need: int, enough: int | None) -> Any:
        return whole(fam, rows, scans, need, None)

    monkeypatch.setattr(service_module, "_admitted", every_row)
    assert await outcomes() == picky
