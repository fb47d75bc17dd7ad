"""A report never runs on the event loop, and its read is bounded by bytes as well as by count.

The rows are read on the database's side, then decoded and aggregated on a worker thread in
one pass (each row decoded just before it is added), one report at a time in a process. The
read keeps the newest rows up to `max_records` and up to MAX_SCAN_BYTES of stored record
text (at least the newest row); either bound makes the report `limited` ("record_bound").
The figures are those of one pass over the records read, as before. SQLite and PostgreSQL
run the same SQL."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gateway.app import STORE_MIGRATIONS
from gateway.attribution import registry
from gateway.attribution.blocks import Block
from gateway.attribution.ledger import Aggregator, Record, aggregate
from gateway.context.store.database import Database
from gateway.ledgers import attribution as stored
from gateway.ledgers.attribution import AttributionLedger
from gateway.proxy import projections
from gateway.state import ATTRIBUTION, RUNTIME
from tests.conftest import GatewayFactory
from tests.context.conftest import replica_databases
from tests.harness import Env, GatewayThread, raw_client

KEYS: dict[str, str] = {}
PER_GATEWAY = ("window", "scope", "collection")  # what build_report adds to the aggregate


def _principals(env: Env) -> None:
    KEYS["operator"] = env.add_principal("operator", ["observe"], [], ["*"])


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("report-off-loop", prepare=_principals) as (env, gateway):
        yield env, gateway


def _session(start: float, turns: int, session: str = "h:s") -> list[Record]:
    """An agent session: system and tools every turn, the history growing, usage known."""
    out: list[Record] = []
    history: list[Block] = []
    for t in range(turns):
        blocks = (
            Block("prompt.system_instructions", "h:sys", 500),
            Block("prompt.tool_schemas", "h:tools", 800),
            *history,
            Block("prompt.current_user_turn", f"h:c{t}", 50 + t),
        )
        usage = {"input_total": (1350 + 130 * t, "known"), "output": (40, "known")}
        out.append(Record(start + t, blocks, invocation=f"{session}.inv{t}", session=session, usage=usage, profile="p"))
        history += [
            Block("prompt.history.user_turn", f"h:u{t}", 50 + t),
            Block("prompt.history.assistant_turn", f"h:a{t}", 80),
        ]
    return out


def _fill(gw: tuple[Env, GatewayThread], scope: str, records: list[Record]) -> None:
    _, gateway = gw
    assert gateway.running is not None
    app = gateway.running.app

    async def fill() -> None:
        ledger = app[ATTRIBUTION]
        digest = projections.scope_digest(app[RUNTIME].current, scope)
        for record in records:
            ledger.add(digest, record)
        await ledger.flush()

    gateway.call(fill(), timeout=60)


def _report(gw: tuple[Env, GatewayThread], scope: str) -> dict[str, Any]:
    env, gateway = gw
    answer = raw_client(gateway, env).get(
        "/v1/attribution/report", params={"scope": scope}, headers={"authorization": f"Bearer {KEYS['operator']}"}
    )
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def _figures(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in PER_GATEWAY}


def _expected(gw: tuple[Env, GatewayThread], records: list[Record], *, limited: bool) -> dict[str, Any]:
    """The figures of one pass over `records` (the pure aggregate, as the report was made before)."""
    _, gateway = gw
    assert gateway.running is not None
    reg = projections.registry_for(gateway.running.app[RUNTIME].current.config.attribution)
    return aggregate(records, reg, limited_scan=limited)


def test_the_report_is_decoded_and_aggregated_off_the_event_loop(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, gateway = gw

    async def ident() -> int:
        return threading.get_ident()

    loop_thread = gateway.call(ident())
    records = _session(time.time() - 600, 200)
    _fill(gw, "off-loop", records)
    added: list[int] = []
    decoded: list[int] = []
    add = Aggregator.add
    decode: Callable[[stored.Row], Record] | None = getattr(stored, "decode", None)  # absent before the fix

    def spying_add(self: Aggregator, record: Record) -> None:
        added.append(threading.get_ident())
        add(self, record)

    def spying_decode(row: stored.Row) -> Record:
        decoded.append(threading.get_ident())
        assert decode is not None
        return decode(row)

    monkeypatch.setattr(Aggregator, "add", spying_add)
    monkeypatch.setattr(stored, "decode", spying_decode, raising=False)
    body = _report(gw, "off-loop")
    assert body["boundaries"] == 200 and body["limited"] is False
    assert len(added) == 200 and loop_thread not in set(added), "Aggregator.add ran on the event loop"
    assert len(decoded) == 200 and loop_thread not in set(decoded), "records were decoded on the event loop"


def test_a_report_reads_the_newest_records_within_its_byte_budget(
    gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _session(time.time() - 600, 10)
    _fill(gw, "bytes", records)
    sizes = [len(r.as_text()) for r in records]
    assert _figures(_report(gw, "bytes")) == _expected(gw, records, limited=False)  # the default budget: all
    for budget, kept in (
        (sum(sizes[-3:]), 3),  # exactly the newest three
        (sum(sizes[-3:]) - 1, 2),  # the third would pass the budget
        (1, 1),  # at least the newest, however long
        (sum(sizes) - 1, 9),
    ):
        monkeypatch.setattr(stored, "MAX_SCAN_BYTES", budget, raising=False)
        body = _report(gw, "bytes")
        assert body["boundaries"] == kept, budget
        assert body["limited"] is True and body["limitReasons"] == ["record_bound"]
        assert _figures(body) == _expected(gw, records[-kept:], limited=True)  # the newest, in time order
    monkeypatch.setattr(stored, "MAX_SCAN_BYTES", sum(sizes), raising=False)
    body = _report(gw, "bytes")
    assert body["boundaries"] == 10 and body["limited"] is False and body["limitReasons"] == []


def test_the_figures_are_those_of_one_pass_over_the_records(gw: tuple[Env, GatewayThread]) -> None:
    """A small known set: a session, a retry of one of its calls and a call of another session."""
    now = time.time()
    session = _session(now - 300, 3)
    retry = Record(
        now - 250,
        session[1].blocks,
        invocation=session[1].invocation,
        session="h:s",
        usage=session[1].usage,
        profile="p",
    )
    other = _session(now - 200, 1, session="h:t")
    records = [*session, retry, *other]
    _fill(gw, "figures", records)
    body = _report(gw, "figures")
    assert _figures(body) == _expected(gw, records, limited=False)
    assert body["boundaries"] == 4 and body["replaysDeduplicated"] == 1
    assert body["exposure"] == {"status": "supported", "correlatedInvocations": 4, "incompleteInvocations": 0}
    system = next(r for r in body["ledger"] if r["blockId"] == "prompt.system_instructions")
    assert (system["injectionCount"], system["cumulativeMaterializedEstimate"]) == (4, 2000)
    assert body["providerUsage"]["kinds"]["input_total"]["known"] == 1350 + 1480 + 1610 + 1350
    assert body["scope"] == "selected" and body["collection"] == {"collecting": False}


def test_reports_are_computed_one_at_a_time(gw: tuple[Env, GatewayThread], monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(gw, "one-at-a-time", _session(time.time() - 600, 20))
    guard = threading.Lock()
    active = [0, 0]  # now, most at once
    report = Aggregator.report

    def counting_report(self: Aggregator, **kw: Any) -> dict[str, Any]:
        with guard:
            active[0] += 1
            active[1] = max(active)
        try:
            time.sleep(0.05)  # widen the window another report could overlap in
            return report(self, **kw)
        finally:
            with guard:
                active[0] -= 1

    monkeypatch.setattr(Aggregator, "report", counting_report)
    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(lambda _: _report(gw, "one-at-a-time"), range(4)))
    assert [b["boundaries"] for b in bodies] == [20] * 4
    assert active == [0, 1]


# --- the read itself, on SQLite and PostgreSQL ------------------------------------------


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    async with replica_databases(request.param, tmp_path, STORE_MIGRATIONS, "attr_scan") as (one, _):
        yield one


@pytest.mark.asyncio
async def test_the_read_is_bounded_by_count_and_by_bytes(database: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    records = _session(now - 100, 8)
    sizes = [len(r.as_text()) for r in records]
    ledger = AttributionLedger(database, max_records=10, flush_after_s=0.0)
    for record in records:
        ledger.add("h:scope", record)
    ledger.add("h:other", _session(now - 50, 1)[0])  # another scope's bytes never count

    async def read(max_records: int, budget: int) -> tuple[list[Record], bool]:
        ledger.max_records = max_records
        monkeypatch.setattr(stored, "MAX_SCAN_BYTES", budget, raising=False)
        rows, limited = await ledger.rows("h:scope", now, now=now)
        return list(stored.decoded(rows)), limited

    assert await read(10, 10**9) == (records, False)
    assert await read(8, sum(sizes)) == (records, False)  # both bounds met exactly: nothing left out
    assert await read(4, 10**9) == (records[-4:], True)  # the count bound
    assert await read(10, sum(sizes[-3:])) == (records[-3:], True)  # the byte bound
    assert await read(10, sum(sizes[-3:]) + sizes[-4] - 1) == (records[-3:], True)
    assert await read(2, sum(sizes[-3:])) == (records[-2:], True)  # whichever binds first
    assert await read(10, 0) == (records[-1:], True)  # at least the newest row
    assert await ledger.records("h:scope", now, now=now) == (records[-1:], True)  # records() reads the same
    monkeypatch.setattr(stored, "MAX_SCAN_BYTES", 0)
    assert await ledger.records("h:other", now, now=now) == ([_session(now - 50, 1)[0]], False)
    assert await ledger.records("h:none", now, now=now) == ([], False)
    monkeypatch.setattr(stored, "MAX_SCAN_BYTES", 10**9)
    everything, limited = await ledger.records(None, now, now=now)
    assert len(everything) == 9 and not limited
    report = aggregate(records[-3:], registry.build(), limited_scan=True)
    assert report["limited"] is True and report["limitReasons"] == ["record_bound"]
    await ledger.close()
