"""The attribution formulas on hand-computed sessions (SPEC §11): retries counted once,
lifetimes across a session, replacement and compaction, targets, the partition, the
evidence status and the bounds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.attribution import registry
from gateway.attribution.blocks import Block
from gateway.attribution.ledger import TOP_N, Aggregator, Record, aggregate

REG = registry.build()
SYS, TOOLS, PREP = "prompt.system_instructions", "prompt.tool_schemas", "wiregate.prepared_context"
CUR, HUSER, HASSIST, RESULT = (
    "prompt.current_user_turn",
    "prompt.history.user_turn",
    "prompt.history.assistant_turn",
    "prompt.tool_result",
)


def b(block_id: str, instance: str, estimate: int) -> Block:
    return Block(block_id, instance, estimate)


def row(report: dict[str, Any], block_id: str) -> dict[str, Any]:
    return next(r for r in report["ledger"] if r["blockId"] == block_id)


def test_retries_of_one_invocation_count_once_and_formulas_hold() -> None:
    first = Record(1.0, (b(SYS, "A", 100), b(TOOLS, "T", 40), b(CUR, "U1", 10)), invocation="i1", session="s")
    second = Record(
        3.0,
        (b(SYS, "A", 100), b(TOOLS, "T", 40), b(HUSER, "U1h", 10), b(HASSIST, "H1", 20), b(CUR, "U2", 5)),
        invocation="i2",
        session="s",
    )
    report = aggregate([first, Record(2.0, first.blocks, invocation="i1", session="s"), second], REG)
    assert report["boundaries"] == 2 and report["replaysDeduplicated"] == 1
    assert report["exposure"]["status"] == "supported"
    sys = row(report, SYS)
    assert sys["cumulativeMaterializedEstimate"] == 200
    assert sys["injectionCount"] == 2 and sys["injectionCoverage"] == 1.0
    assert sys["meanTokensWhenInjected"] == 100
    assert sys["cumulativeExposureEstimate"] == 200
    assert sys["cumulativeControllableExposureEstimate"] == 200
    assert sys["estimator"] == "exposure_contribution"
    assert "cumulativeAddressableExposureEstimate" not in sys  # no target: absent, not zero
    assert "cumulativeTargetExposureEstimate" not in sys
    huser = row(report, HUSER)
    assert huser["injectionCount"] == 1 and huser["injectionCoverage"] == 0.5
    cur = row(report, CUR)
    assert cur["cumulativeMaterializedEstimate"] == 15 and cur["cumulativeExposureEstimate"] == 15
    assert cur["cumulativeControllableExposureEstimate"] == 0  # user payload is never controllable
    part = report["partition"]
    assert part == {
        "compiledMaterialized": 325,
        "owned": 300,
        "workspaceConfiguration": 0,
        "userTaskPayload": 25,
        "unknown": 0,
    }
    assert report["controllableMaterialized"] == 300
    assert [o["blockId"] for o in report["opportunities"]] == [SYS, TOOLS, HASSIST]


def test_a_replay_adding_a_block_counts_only_the_new_identity() -> None:
    one = Record(1.0, (b(SYS, "A", 100),), invocation="i1")
    again = Record(2.0, (b(SYS, "A", 100), b(TOOLS, "T", 8)), invocation="i1")
    report = aggregate([one, again], REG)
    assert report["boundaries"] == 1
    assert row(report, SYS)["cumulativeMaterializedEstimate"] == 100
    assert row(report, TOOLS)["cumulativeMaterializedEstimate"] == 8
    assert row(report, TOOLS)["injectionCount"] == 1
    assert row(report, SYS)["cumulativeExposureEstimate"] == 100


def test_until_replaced_carries_across_a_session_until_a_new_instance_replaces_it() -> None:
    # Responses-style continuation: later calls hold only what is new (server state).
    records = [
        Record(1.0, (b(SYS, "A", 100), b(PREP, "P1", 300), b(CUR, "U1", 10)), invocation="i1", session="s"),
        Record(2.0, (b(CUR, "U2", 10),), invocation="i2", session="s", full_context=False),
        Record(3.0, (b(PREP, "P2", 200), b(CUR, "U3", 10)), invocation="i3", session="s", full_context=False),
    ]
    report = aggregate(records, REG)
    assert report["exposure"]["status"] == "supported"
    prep = row(report, PREP)
    assert prep["cumulativeMaterializedEstimate"] == 500
    assert prep["injectionCount"] == 2 and prep["injectionCoverage"] == round(2 / 3, 6)
    assert prep["meanTokensWhenInjected"] == 250
    assert prep["cumulativeExposureEstimate"] == 300 + 300 + 200  # P1, P1 carried, P2 replaced it
    assert prep["activeInvocations"] == 3
    assert prep["cumulativeTargetExposureEstimate"] == 256 * 3
    assert prep["cumulativeControllableExposureEstimate"] == 800
    assert prep["cumulativeAddressableExposureEstimate"] == 800 - 768
    assert prep["estimator"] == "addressable_exposure_target"
    sys = row(report, SYS)
    assert sys["cumulativeMaterializedEstimate"] == 100 and sys["cumulativeExposureEstimate"] == 300
    cur = row(report, CUR)  # each user turn stays in the continued conversation
    assert cur["cumulativeMaterializedEstimate"] == 30
    assert cur["cumulativeExposureEstimate"] == 10 + (10 + 10) + (10 + 10 + 10)


def test_boundary_only_blocks_are_never_carried() -> None:
    records = [
        Record(1.0, (b("host.notice", "N1", 40), b(CUR, "U1", 10)), invocation="i1", session="s"),
        Record(2.0, (b(CUR, "U2", 10),), invocation="i2", session="s", full_context=False),
    ]
    report = aggregate(records, REG)
    notice = row(report, "host.notice")
    assert notice["cumulativeExposureEstimate"] == 40 and notice["activeInvocations"] == 1
    assert notice["cumulativeTargetExposureEstimate"] == 0  # target 0: all of it is addressable
    assert notice["cumulativeAddressableExposureEstimate"] == 40


def test_addressable_never_goes_below_zero() -> None:
    report = aggregate([Record(1.0, (b(PREP, "P", 100),), invocation="i")], REG)
    assert row(report, PREP)["cumulativeAddressableExposureEstimate"] == 0
    assert report["opportunities"] == []  # nothing addressable: no opportunity


def _compacting(full_context: bool) -> list[Record]:
    return [
        Record(1.0, (b(SYS, "A", 100), b(HASSIST, "H1", 50), b(RESULT, "R1", 400), b(CUR, "U1", 10)), "i1", "s"),
        Record(
            2.0,
            (
                b(SYS, "A", 100),
                b(HASSIST, "H1", 50),
                b(RESULT, "R1", 400),
                b(HUSER, "U1", 10),
                b(HASSIST, "H2", 30),
                b(CUR, "U2", 10),
            ),
            "i2",
            "s",
        ),
        Record(
            3.0,
            (b("host.compaction_summary", "C1", 60), b(CUR, "U3", 10)) + ((b(SYS, "A", 100),) if full_context else ()),
            "i3",
            "s",
            full_context=full_context,
        ),
        Record(4.0, (b(CUR, "U4", 10),), "i4", "s", full_context=False),
    ]


@pytest.mark.parametrize("full_context", [True, False])
def test_a_compaction_ends_compactable_blocks_before_its_invocation_is_counted(full_context: bool) -> None:
    report = aggregate(_compacting(full_context), REG)
    assert row(report, RESULT)["cumulativeExposureEstimate"] == 800  # i1, i2; not i3, i4
    assert row(report, HASSIST)["cumulativeExposureEstimate"] == 50 + 50 + 30
    assert row(report, "host.compaction_summary")["cumulativeExposureEstimate"] == 120  # i3, carried into i4
    assert row(report, SYS)["cumulativeExposureEstimate"] == 400  # not compactable: all four
    assert row(report, RESULT)["cumulativeMaterializedEstimate"] == 800


def test_a_full_context_request_that_drops_history_is_a_compaction() -> None:
    records = [
        Record(1.0, (b(HASSIST, "H1", 50), b(RESULT, "R1", 400), b(CUR, "U1", 10)), "i1", "s"),
        Record(2.0, (b(HASSIST, "H9", 20), b(CUR, "U2", 10)), "i2", "s"),  # history rewritten by the client
    ]
    report = aggregate(records, REG)
    assert row(report, RESULT)["cumulativeExposureEstimate"] == 400
    assert row(report, HASSIST)["cumulativeExposureEstimate"] == 70


def test_exposure_is_unsupported_without_an_invocation_id() -> None:
    records = [
        Record(1.0, (b(SYS, "A", 100), b(PREP, "P", 400))),
        Record(2.0, (b(SYS, "A", 100), b(PREP, "P", 400))),
    ]
    report = aggregate(records, REG)
    assert report["exposure"]["status"] == "unsupported"
    for r in report["ledger"]:
        for name in (
            "cumulativeExposureEstimate",
            "cumulativeControllableExposureEstimate",
            "cumulativeTargetExposureEstimate",
            "cumulativeAddressableExposureEstimate",
        ):
            assert name not in r  # absent, never the materialized figure in disguise
        assert r["estimator"] == "materialized_contribution"
    assert row(report, PREP)["injectionCount"] == 2  # without an id each call is its own boundary
    assert [(o["blockId"], o["estimator"], o["value"]) for o in report["opportunities"]] == [
        (PREP, "materialized_contribution", 800),
        (SYS, "materialized_contribution", 200),
    ]


def test_exposure_is_limited_when_only_some_calls_correlate() -> None:
    records = [
        Record(1.0, (b(SYS, "A", 100),), invocation="i1"),
        Record(2.0, (b(SYS, "A", 100),)),
    ]
    report = aggregate(records, REG)
    assert report["exposure"] == {"status": "limited", "correlatedInvocations": 1, "incompleteInvocations": 0}
    assert row(report, SYS)["cumulativeExposureEstimate"] == 100  # the correlated call only, not 200
    # a continuation without a session to carry its context is incomplete evidence
    lone = aggregate([Record(1.0, (b(CUR, "U", 4),), invocation="i", full_context=False)], REG)
    assert lone["exposure"]["status"] == "limited"


def test_partition_sums_exactly_and_controllable_is_a_separate_view() -> None:
    records = [
        Record(
            1.0,
            (
                b(SYS, "A", 7),
                b("host.workspace_configuration", "W", 13),
                b(CUR, "U", 3),
                b("unattributed.prompt_surface", "X", 5),
                b("no.such_block", "Y", 11),
                b(RESULT, "R", 17),
            ),
            invocation="i",
        )
    ]
    report = aggregate(records, REG)
    part = report["partition"]
    assert part["compiledMaterialized"] == 7 + 13 + 3 + 5 + 11 + 17
    assert (
        part["compiledMaterialized"]
        == part["owned"] + part["workspaceConfiguration"] + part["userTaskPayload"] + part["unknown"]
    )
    assert part["unknown"] == 16 and part["owned"] == 24 and part["workspaceConfiguration"] == 13
    assert report["controllableMaterialized"] == 7 + 13 + 17  # intersects the partition: not a summand
    unattributed = row(report, "unattributed.prompt_surface")
    assert unattributed["cumulativeMaterializedEstimate"] == 16 and not unattributed["eligible"]
    assert all(o["blockId"] != "unattributed.prompt_surface" for o in report["opportunities"])


def test_limited_at_the_bound() -> None:
    agg = Aggregator(REG, max_entries=2)
    agg.add(Record(1.0, (b(SYS, "A", 1), b(TOOLS, "T", 1), b(CUR, "U", 1)), invocation="i"))
    report = agg.report()
    assert report["limited"] is True and report["limitReasons"] == ["entry_bound"]
    assert report["exposure"]["status"] == "supported"
    scanned = aggregate([Record(1.0, (b(SYS, "A", 1),), invocation="i")], REG, limited_scan=True)
    assert scanned["limited"] is True and scanned["limitReasons"] == ["record_bound"]
    assert scanned["exposure"]["status"] == "limited"
    assert aggregate([Record(1.0, (b(SYS, "A", 1),), invocation="i")], REG)["limited"] is False


def test_top_n_is_at_most_twelve_ranked_by_value_then_injections_then_id() -> None:
    extra = [
        {
            "id": f"host.rule_{n:02d}",
            "display_name": f"Rule {n}",
            "type": "instruction",
            "origin": "host_policy",
            "control": "direct",
            "lifetime": "boundary_only",
            "action": "shorten",
            "validation": "evals",
        }
        for n in range(14)
    ]
    reg = registry.build(extra)
    blocks = tuple(b(f"host.rule_{n:02d}", f"x{n}", 10 if n < 4 else 100 + n) for n in range(14))
    twice = (b("host.rule_00", "y", 10),)
    report = aggregate([Record(1.0, blocks, "i1"), Record(2.0, twice, "i2")], reg)
    ids = [o["blockId"] for o in report["opportunities"]]
    assert len(ids) == TOP_N == 12
    assert ids[:10] == [f"host.rule_{n:02d}" for n in range(13, 3, -1)]
    assert ids[10:] == ["host.rule_00", "host.rule_01"]  # 20 tokens; then 10 with ties by id
    assert len(report["ledger"]) == 14  # the full ledger is independent of the top-N


def test_provider_usage_of_the_same_invocations_is_counted_once() -> None:
    usage = {
        "input_total": (120, "known"),
        "output": (8, "known"),
        "cache_read": (0, "known"),
        "cache_write": (None, "unknown"),
    }
    one = Record(1.0, (b(SYS, "A", 1),), invocation="i1", usage=usage)
    report = aggregate([one, Record(2.0, one.blocks, invocation="i1", usage=usage)], REG)
    kinds = report["providerUsage"]["kinds"]
    assert kinds["input_total"] == {"known": 120, "estimated": 0, "unknown_records": 0}
    assert kinds["cache_write"] == {"known": 0, "estimated": 0, "unknown_records": 1}
    assert report["providerUsage"]["invocations"] == 1


def test_records_before_the_window_build_session_state_only() -> None:
    records = [
        Record(1.0, (b(SYS, "A", 100),), invocation="i1", session="s"),
        Record(5.0, (b(CUR, "U", 4),), invocation="i2", session="s", full_context=False),
    ]
    report = aggregate(records, REG, since=2.0)
    assert report["boundaries"] == 1
    sys = row(report, SYS)
    assert sys["cumulativeMaterializedEstimate"] == 0 and sys["injectionCount"] == 0
    assert sys["cumulativeExposureEstimate"] == 100  # carried into the window


def test_identical_blocks_in_one_request_are_each_exposed() -> None:
    """Two identical tool results (or two "continue" turns) are two blocks the provider
    reads: with one invocation, exposure equals what was materialised."""
    request = (b(RESULT, "same", 73), b(HASSIST, "call", 22), b(RESULT, "same", 73), b(HASSIST, "call", 22))
    report = aggregate([Record(1.0, (*request, b(CUR, "U", 5)), invocation="i1", session="s")], REG)
    assert report["exposure"]["status"] == "supported" and report["boundaries"] == 1
    for block_id in (RESULT, HASSIST):
        assert (
            row(report, block_id)["cumulativeExposureEstimate"]
            == row(report, block_id)["cumulativeMaterializedEstimate"]
        )
    assert row(report, RESULT)["cumulativeExposureEstimate"] == 146
    # A session carries every copy of a persistent block into a continuation that does not repeat it.
    doubled = (b(SYS, "A", 100), b(SYS, "A", 100), b(CUR, "U1", 5))
    follow = Record(2.0, (b(CUR, "U2", 5),), invocation="i2", session="s", full_context=False)
    carried = aggregate([Record(1.0, doubled, invocation="i1", session="s"), follow], REG)
    assert row(carried, SYS)["cumulativeExposureEstimate"] == 400 and carried["exposure"]["status"] == "supported"
    # A replay of the invocation still counts once.
    again = aggregate([Record(1.0, request, invocation="i1"), Record(2.0, request, invocation="i1")], REG)
    assert again["replaysDeduplicated"] == 1 and row(again, RESULT)["cumulativeExposureEstimate"] == 146


def test_a_continuation_is_complete_only_after_its_session_was_seen_whole() -> None:
    """A request that continues server-side state in a session whose whole context was
    never recorded (collection was off, or it fell out of retention) is incomplete."""
    cont = Record(2.0, (b(CUR, "U2", 4),), invocation="i2", session="s", full_context=False)
    unseen = aggregate([cont], REG)
    assert unseen["exposure"] == {"status": "limited", "correlatedInvocations": 1, "incompleteInvocations": 1}
    launch = Record(1.0, (b(SYS, "A", 100), b(CUR, "U1", 4)), invocation="i1", session="s")
    seen = aggregate([launch, cont], REG)
    assert seen["exposure"] == {"status": "supported", "correlatedInvocations": 2, "incompleteInvocations": 0}
    # a launch before the report's window still counts as seen (it builds session state)
    windowed = Aggregator(REG, since=1.5)
    for record in (launch, cont):
        windowed.add(record)
    assert windowed.report()["exposure"]["status"] == "supported"
    other = aggregate([Record(1.0, launch.blocks, invocation="i1", session="t"), cont], REG)
    assert other["exposure"]["incompleteInvocations"] == 1  # another session's launch says nothing


def test_a_repeat_of_an_invocation_first_seen_before_the_window_is_a_boundary_in_it() -> None:
    """The window starts between two sightings of one invocation: the one inside is its
    first counted sighting, a whole boundary (coverage 1.0 for what it holds, exposure
    correlated), not a replay whose new blocks hang on a boundary the window never counted."""
    records = [
        Record(1.0, (b(SYS, "A", 100), b(CUR, "U", 10)), invocation="i1", usage={"input_tokens": (110, "known")}),
        Record(
            10.0,
            (b(SYS, "A", 100), b(CUR, "U", 10), b(TOOLS, "T", 54)),
            invocation="i1",
            usage={"input_tokens": (164, "known")},
        ),
        Record(
            11.0,
            (b(SYS, "A", 100), b(CUR, "U", 10), b(TOOLS, "T", 54)),
            invocation="i1",
            usage={"input_tokens": (164, "known")},
        ),  # a retry inside the window: a replay
    ]
    report = aggregate(records, REG, since=5.0)
    assert report["boundaries"] == 1 and report["replaysDeduplicated"] == 1
    assert report["exposure"]["status"] == "supported"
    for block_id, tokens in ((SYS, 100), (CUR, 10), (TOOLS, 54)):
        entry = row(report, block_id)
        assert entry["injectionCount"] == 1 and entry["injectionCoverage"] == 1.0, entry
        assert entry["cumulativeMaterializedEstimate"] == tokens


WORKSPACE = "host.workspace_configuration"  # session_persistent, never compacted


def _growing_session(calls: int) -> list[Record]:
    """One session whose every call brings a new workspace block: the set it carries grows by one a call."""
    return [
        Record(
            float(n), (b(SYS, "A", 100), b(WORKSPACE, f"W{n}", 10), b(CUR, f"U{n}", 5)), invocation=f"i{n}", session="s"
        )
        for n in range(calls)
    ]


def test_a_session_carries_every_persistent_block_with_exact_exposure() -> None:
    report = aggregate(_growing_session(300), REG)
    assert report["exposure"]["status"] == "supported" and report["limited"] is False
    workspace = row(report, WORKSPACE)
    # call n holds its own block and the n carried before it: 10 * (1 + 2 + ... + 300)
    assert workspace["cumulativeExposureEstimate"] == 10 * 300 * 301 // 2
    assert workspace["cumulativeMaterializedEstimate"] == 3000 and workspace["activeInvocations"] == 300


class _CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts the entries read by iterating over it."""

    read = 0

    def __iter__(self) -> Any:
        for key in super().__iter__():
            _CountingDict.read += 1
            yield key

    def items(self) -> Any:
        for item in super().items():
            _CountingDict.read += 1
            yield item

    def values(self) -> Any:
        for value in super().values():
            _CountingDict.read += 1
            yield value

    def __copy__(self) -> Any:
        raise AssertionError("a session's carried set is never copied")


def test_a_call_costs_its_own_blocks_not_everything_its_session_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A report pass over one long session stays linear: no call copies or walks the whole
    carried set (a session of n calls used to cost n² / 2 entries read)."""
    from gateway.attribution import ledger

    made: list[_CountingDict] = []
    init = ledger._Carried.__init__

    def counting(self: Any) -> None:
        init(self)
        self.blocks = _CountingDict()
        made.append(self.blocks)

    monkeypatch.setattr(ledger._Carried, "__init__", counting)
    _CountingDict.read = 0
    calls = 2000
    report = aggregate(_growing_session(calls), REG)
    assert made and len(made[0]) == calls + 2  # the workspace blocks, the system prompt and the last user turn
    assert row(report, WORKSPACE)["cumulativeExposureEstimate"] == 10 * calls * (calls + 1) // 2
    assert _CountingDict.read < 5 * calls, _CountingDict.read


def test_a_session_past_the_carried_bound_makes_the_report_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.attribution import ledger

    monkeypatch.setattr(ledger, "MAX_CARRIED", 50)
    report = aggregate(_growing_session(60), REG)
    assert report["limited"] is True and report["limitReasons"] == ["carry_bound"]
    assert report["exposure"]["status"] == "limited"
    # the system prompt and 49 workspace blocks are carried; each later call holds its own block only
    exposure = row(report, WORKSPACE)["cumulativeExposureEstimate"]
    assert exposure == 10 * (49 * 50 // 2) + 10 * (49 + 1) * (60 - 49)
