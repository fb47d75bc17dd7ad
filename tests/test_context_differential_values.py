"""Differential tests, value for value: the same raw HTTP calls against wiregate (HTTPS) and the
real PowerContext 1.4.1 server (tests/pcserver.py), compared where the shape comparison of
tests/test_context_differential.py cannot see — the exact prepared bytes (scope groups taking
turns, topic memory from the current scope only, a topic's detail snippet), lifecycle and merge
status codes and messages, which heads a listing shows, query-parameter statuses, and search
score metadata.

Ids differ between the two servers: each side names what it creates, and the comparison
replaces every id by its name. Skipped when the PowerContext server cannot be installed or
started, unless WIREGATE_REQUIRE_POWERCONTEXT=1 (then it fails).
"""

from __future__ import annotations

import re
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import GatewayFactory
from tests.harness import Env, GatewayThread
from tests.pcserver import PowerContextServer, server_or_skip

_ID = re.compile(r"\b(?:scp|art)_[0-9a-z]+\b")


@dataclass
class Side:
    """One server, and the names of what this test created there (id -> name)."""

    http: httpx.Client
    names: dict[str, str] = field(default_factory=dict)

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        r = self.http.request(method, path, json=body, headers=headers)
        return r.status_code, (r.json() if r.content else None)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, doc = self.call(method, path, body)
        assert status in (200, 201), (method, path, status, doc)
        return doc

    def scope(self, name: str, refs: tuple[str, ...] = ()) -> str:
        body = {"title": name, "summary": "s", "idempotency_key": uuid.uuid4().hex, "context_references": list(refs)}
        sid = str(self.ok("POST", "/v1/scopes", body)["scope_id"])
        self.names[sid] = name
        return sid

    def create(self, sid: str, name: str, family: str, content: dict[str, Any]) -> str:
        aid = str(self.ok("POST", f"/v1/scopes/{sid}/artifacts", {"family": family, "content": content})["artifact_id"])
        self.names[aid] = name
        return aid

    def target(self, sid: str, aid: str) -> dict[str, Any]:
        state = self.ok("GET", f"/v1/scopes/{sid}/artifacts/atomic-memory/{aid}/state")
        return {"artifact": state["artifact"], "state_version": state["state_version"]}

    def named(self, text: str) -> str:
        """`text` with every id this side created written as its name."""
        return _ID.sub(lambda m: self.names.get(m.group(), m.group()), text)


@pytest.fixture(scope="module")
def gw(gateways: GatewayFactory) -> Iterator[tuple[Env, GatewayThread]]:
    with gateways("context-differential-values") as started:
        yield started


@pytest.fixture(scope="module")
def pc() -> Iterator[PowerContextServer]:
    with server_or_skip() as server:
        yield server


@pytest.fixture
def sides(gw: tuple[Env, GatewayThread], pc: PowerContextServer) -> Iterator[tuple[Side, Side]]:
    env, gateway = gw
    ours = httpx.Client(
        base_url=gateway.https_url,
        verify=ssl.create_default_context(cafile=str(env.ca)),
        headers={"authorization": f"Bearer {env.gateway_key}"},
        timeout=30,
    )
    theirs = httpx.Client(base_url=pc.base_url, headers=pc.headers, timeout=30)
    with ours, theirs:
        yield Side(ours), Side(theirs)


def _words(first: str, count: int, rest: str, length: int) -> str:
    """`count` times `first`, then `rest` up to `length` words: equal lengths, distinct term
    frequencies, so BM25 ranks them the same on both servers whatever each index's totals."""
    return " ".join([first] * count + [rest] * (length - count))


PARAGRAPH = "The ledger keeps every amount in integer cents and never rounds."
# A topic whose detail is several chunks, the query's term in one of them, well inside a long paragraph.
LONG_DETAIL = (
    "# Ledger\n\n"
    + " ".join([PARAGRAPH] * 14)
    + "\n\n## Journal\n\n"
    + " ".join([PARAGRAPH] * 8)
    + " Every billing run posts a double-entry journal.   "
    + " ".join([PARAGRAPH] * 8)
    + "\n\n- one item\n- another item\n\n"
    + " ".join([PARAGRAPH] * 14)
)
SHORT_DETAIL = " ".join([PARAGRAPH] * 6) + " Billing closes at midnight. " + " ".join([PARAGRAPH] * 6)


def _prepared(side: Side, asks: list[tuple[str, int]]) -> list[str]:
    out = []
    for sid, max_bytes in asks:
        doc = side.ok("POST", "/v1/context/prepare", {"scope_id": sid, "query": "billing", "max_bytes": max_bytes})
        assert doc["status"] == "ready"
        out.append(side.named(doc["content"]))
    return out


def _groups_scenario(side: Side) -> str:
    """A busy current scope (12 memories, a topic, an experience) referencing a scope with 6
    memories, a topic and an experience."""
    ref = side.scope("REF")
    for i in range(6):
        side.create(ref, f"r{i}", "atomic-memory", {"kind": "fact", "text": _words("billing", 6 - i, "ref", 8)})
    side.create(ref, "ref-topic", "topic-memory", {"title": "Billing", "summary": "billing", "detail": "billing"})
    experience = {"situation": "billing outage", "action": "failover", "outcome": "ok", "lesson": "drill it"}
    side.create(ref, "ref-experience", "experience", experience)
    main = side.scope("MAIN", (ref,))
    for i in range(12):
        side.create(main, f"m{i}", "atomic-memory", {"kind": "fact", "text": _words("billing", 13 - i, "main", 14)})
    side.create(main, "main-topic", "topic-memory", {"title": "Billing", "summary": "in main", "detail": "cents"})
    experience = {"situation": "billing deploy", "action": "rolled back", "outcome": "ok", "lesson": "stage first"}
    side.create(main, "main-experience", "experience", experience)
    return main


def test_prepare_takes_scope_groups_in_turn_and_topics_from_the_current_scope(sides: tuple[Side, Side]) -> None:
    """Item 1: each family's scope groups take turns, current scope first (a busy current scope
    does not starve its reference); topic memory comes from the current scope only."""
    prepared = []
    for side in sides:
        main = _groups_scenario(side)
        prepared.append(_prepared(side, [(main, 8000), (main, 1200)]))
    ours, theirs = prepared
    assert ours == theirs
    full = theirs[0]
    order = re.findall(r'"(?:artifact_id|scope_id)":"([^"]+)"', full)
    assert [n for n in order if n in ("m0", "r0", "m1", "r1")] == ["m0", "r0", "m1", "r1"]  # the groups alternate
    assert "ref-topic" not in full and "main-topic" in full and "ref-experience" in full


def _snippet_scenario(side: Side) -> list[str]:
    """Scopes each holding topics found through their details (a multi-chunk one and a short
    one), and one found through its title only."""
    both = side.scope("BOTH")
    topic = {"title": "Billing ledger", "summary": "How billing is kept", "detail": LONG_DETAIL}
    side.create(both, "detail-and-title-topic", "topic-memory", topic)
    side.create(both, "detail-topic", "topic-memory", {"title": "Ledger", "summary": "Cents", "detail": SHORT_DETAIL})
    only_title = side.scope("TITLE")
    topic = {"title": "Billing only in the title", "summary": "Nothing else", "detail": " ".join([PARAGRAPH] * 12)}
    side.create(only_title, "title-topic", "topic-memory", topic)
    return _prepared(side, [(both, 8000), (both, 1100), (only_title, 8000)])


def test_prepare_renders_the_snippet_of_a_topic_found_through_its_detail(sides: tuple[Side, Side]) -> None:
    """Item 2: a same-scope topic found through its detail renders `{title, summary, snippet}`,
    the snippet 1.4.1's excerpt of the matching chunk; found through its title only, no snippet."""
    ours, theirs = (_snippet_scenario(side) for side in sides)
    assert ours == theirs
    assert theirs[0].count('\\"snippet\\":\\"…') == 2  # both details matched, each excerpt windowed
    assert "Every billing run" in theirs[0] and "Billing closes" in theirs[0]
    assert '\\"snippet\\"' not in theirs[2]


def _codes(side: Side) -> list[Any]:
    """A lifecycle, merge, edit and listing sequence: what each step answers."""
    out: list[Any] = []
    sid = side.scope("LIFE")
    m = [side.create(sid, f"m{i}", "atomic-memory", {"kind": "fact", "text": f"memory {i} billing"}) for i in range(6)]
    topic = side.create(sid, "topic", "topic-memory", {"title": "T", "summary": "S", "detail": "D"})
    t = [side.target(sid, a) for a in m]
    content = {"kind": "fact", "text": "merged billing"}

    def merge(inputs: list[dict[str, Any]]) -> tuple[int, Any]:
        return side.call("POST", "/v1/atomic-memory/merges", {"scope_id": sid, "inputs": inputs, "content": content})

    def forget(target: dict[str, Any]) -> tuple[int, Any]:
        return side.call(
            "POST", "/v1/atomic-memory/lifecycle", {"scope_id": sid, "state": "forgotten", "target": target}
        )

    def error(answer: tuple[int, Any], whole: bool = True) -> Any:
        status, doc = answer
        if status >= 400 and not whole:  # a schema violation: 1.4.1's own error list, in its own words
            return status, doc["error"]["code"]
        return status, doc["error"] if status >= 400 else None

    other_family = {"artifact": {"family": "topic-memory", "artifact_id": topic, "revision": 1}, "state_version": 0}
    missing = {"artifact": {**t[0]["artifact"], "artifact_id": "art_" + "0" * 32}, "state_version": 0}
    out.append(("merge duplicate inputs", error(merge([t[0], t[0]]))))
    out.append(("merge another family", error(merge([t[0], other_family]), whole=False)))
    out.append(("merge a missing input", error(merge([t[0], missing]))))
    out.append(("forget", error(forget(t[1]))))
    out.append(("merge a forgotten input", error(merge([side.target(sid, m[1]), t[2]]))))
    status, merged = merge([t[2], t[3]])
    records = merged["records"]
    side.names[next(r["artifact"]["artifact_id"] for r in records if r["state"] == "active")] = "new"
    out.append(("merge", status, sorted((side.named(r["artifact"]["artifact_id"]), r["state"]) for r in records)))
    out.append(("forget a merged memory", error(forget(side.target(sid, m[2])))))
    out.append(("forget with a stale state version", error(forget(t[2]))))
    out.append(("forget a stale revision", error(forget({**t[4], "artifact": {**t[4]["artifact"], "revision": 2}}))))
    out.append(("forget another family", error(forget(other_family))))
    out.append(("forget a missing memory", error(forget(missing))))
    edit = {"content": {"kind": "fact", "text": "edited billing"}}
    url = f"/v1/scopes/{sid}/artifacts/atomic-memory"
    out.append(("edit merged, stale etag", side.call("PUT", f"{url}/{m[2]}", edit, **{"if-match": '"revision:9"'})[0]))
    out.append(("edit merged", error(side.call("PUT", f"{url}/{m[2]}", edit, **{"if-match": '"revision:1"'}))))
    out.append(("edit forgotten", side.call("PUT", f"{url}/{m[1]}", edit, **{"if-match": '"revision:1"'})[0]))
    state = side.ok("GET", f"{url}/{m[1]}/state")
    out.append(("forgotten after edit", state["state"], state["state_version"], state["artifact"]["revision"]))
    out.append(("listed heads", sorted(side.named(i["artifact_id"]) for i in side.ok("GET", url)["items"])))
    for body in ({"states": []}, {"states": ["active", "active"]}, {"tag_match": "any"}):
        out.append(("list", body, error(side.call("POST", "/v1/atomic-memory/list", {"scope_id": sid, **body}))))
    search = {"scope_id": sid, "query": "billing", "tag_match": "any"}
    out.append(("search tag_match only", error(side.call("POST", "/v1/atomic-memory/search", search))))
    return out


def test_lifecycle_merge_and_edit_answer_as_1_4_1(sides: tuple[Side, Side]) -> None:
    """Item 3: each step's status, code and message (or the heads a listing shows)."""
    ours, theirs = (_codes(side) for side in sides)
    assert ours == theirs
    assert ("listed heads", ["m0", "m1", "m4", "m5", "new"]) in theirs  # merged heads are not listed


def _contract(side: Side) -> list[Any]:
    out: list[Any] = []
    sid = side.scope("CONTRACT")
    aid = side.create(sid, "m", "atomic-memory", {"kind": "fact", "text": "billing runs nightly"})

    def brief(answer: tuple[int, Any]) -> Any:
        status, doc = answer
        if status < 400:
            return status, doc
        error = doc["error"]
        fields = [(e["loc"] or [None])[-1] for e in (error["details"] or {}).get("errors", [])]  # 1.4.1 omits "body"
        return status, error["code"], fields

    prepare = {"scope_id": sid, "query": "billing", "assembly": None}
    out.append(("assembly null", brief(side.call("POST", "/v1/context/prepare", prepare))[:2]))
    head = f"/v1/scopes/{sid}/artifacts/atomic-memory/{aid}"
    out.append(("head, If-None-Match *", side.call("GET", head, **{"if-none-match": "*"})[0]))
    out.append(("head, If-None-Match etag", side.call("GET", head, **{"if-none-match": 'W/"revision:1"'})[0]))
    out.append(("state, If-None-Match *", side.call("GET", f"{head}/state", **{"if-none-match": "*"})[0]))
    for url in (f"/v1/scopes/{sid}/artifacts/atomic-memory", f"{head}/revisions", "/v1/scopes"):
        for limit in ("0", "101", "abc"):
            out.append((side.named(url), limit, brief(side.call("GET", f"{url}?limit={limit}"))))
    out.append(
        ("cursor too long", brief(side.call("GET", f"/v1/scopes/{sid}/artifacts/atomic-memory?cursor={'a' * 4097}")))
    )
    skill = f"/v1/scopes/{sid}/artifacts/skill/search"
    out.append(("skill search", brief(side.call("POST", skill, {"query": "billing", "include_scores": True}))))
    out.append(("skill search, hybrid", brief(side.call("POST", skill, {"query": "billing", "mode": "hybrid"}))))
    return out


def test_smaller_contract_points_answer_as_1_4_1(sides: tuple[Side, Side]) -> None:
    """Item 4: `assembly: null`, `If-None-Match: *`, query-parameter statuses, skill search."""
    ours, theirs = (_contract(side) for side in sides)
    assert ours == theirs
    assert ("head, If-None-Match *", 200) in theirs and ("state, If-None-Match *", 304) in theirs


def _scores(side: Side) -> list[Any]:
    out: list[Any] = []
    sid = side.scope("SCORES")
    side.create(sid, "m", "atomic-memory", {"kind": "fact", "text": "billing runs nightly"})
    both = {"title": "Billing", "summary": "billing ledger", "detail": "billing details live here"}
    side.create(sid, "both", "topic-memory", both)
    side.create(sid, "detail", "topic-memory", {"title": "Ledger", "summary": "cents", "detail": "the billing run"})
    side.create(sid, "title", "topic-memory", {"title": "Billing notes", "summary": "notes", "detail": "nothing"})
    experience = {"situation": "billing outage", "action": "failover", "outcome": "ok", "lesson": "drill"}
    side.create(sid, "experience", "experience", experience)
    for family in ("atomic-memory", "topic-memory", "experience"):
        found = side.ok(
            "POST", f"/v1/scopes/{sid}/artifacts/{family}/search", {"query": "billing", "include_scores": True}
        )
        channels = {
            side.named(r["artifact_id"]): [
                (n, c["metric"], c["higher_is_better"]) for n, c in r["scores"]["channels"].items()
            ]
            for r in found["results"]
        }
        out.append((family, channels))
    for family, limit in (("topic-memory", 20), ("topic-memory", 21), ("experience", 150), ("atomic-memory", 101)):
        out.append(
            (
                family,
                limit,
                side.call("POST", f"/v1/scopes/{sid}/artifacts/{family}/search", {"query": "billing", "limit": limit})[
                    0
                ],
            )
        )
    return out


def test_search_scores_name_1_4_1_channels_and_metrics(sides: tuple[Side, Side]) -> None:
    """Item 5: channel names, metrics and directions of `include_scores`; topic search `limit` ≤ 20."""
    ours, theirs = (_scores(side) for side in sides)
    assert ours == theirs
    topics = next(found[1] for found in theirs if found[0] == "topic-memory" and len(found) == 2)
    assert [n for n, _, _ in topics["both"]] == ["topic_fts", "detail_fts"] and topics["title"][0][0] == "topic_fts"
