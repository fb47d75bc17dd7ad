"""Cache pacing, pure: the decision rule with hand-computed expectations, the planner's
markers from a session's pace (deterministic, client markers win, 1 h before 5 min), OpenAI
extended retention, how bets settle, and the profile's cache prices (validated, signed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from gateway import cachepace, caching
from gateway.admission import runes_div4
from gateway.cachepace import PaceChoice, PaceEvent, SessionPace
from gateway.carriers import CARRIERS, jsonspan
from gateway.config.load import ConfigError, load_profile, load_trusted_keys
from gateway.profiles.model import DEFAULT_PRICES, CachePrices, CacheSettings, UpstreamProfile
from gateway.usage import UsageRecord, all_unknown
from tests.test_caching import ANTHROPIC, CTX, LONG, _conversation

A = DEFAULT_PRICES["anthropic"]  # read 0.1, 5 min write 1.25, 1 h write 2


def _pace(*at: float, now: float) -> SessionPace:
    return SessionPace(tuple(PaceEvent(t) for t in at), now)


# --- the rule, by hand ----------------------------------------------------------------------


def test_smoothed_share_of_gaps_within_a_ttl() -> None:
    assert cachepace.within((400.0,), "5m") == 0.25  # (0 + 0.5) / (1 + 1)
    assert cachepace.within((400.0,), "1h") == 0.75  # (1 + 0.5) / (1 + 1)
    assert cachepace.within((10.0, 900.0, 4000.0), "5m") == 0.375  # 1.5 / 4
    assert cachepace.within((), "5m") == 0.5


def test_value_is_expected_saving_minus_premium() -> None:
    # p = 0.75 over 2 requests: 0.75 + 0.5625 reads, each saves 0.9; the 1 h premium is 1.
    assert cachepace.value(A, "1h", 0.75, 2) == pytest.approx(0.9 * 1.3125 - 1.0)  # 0.18125
    # p = 0.25: 0.25 + 0.0625 reads; the 5 min premium is 0.25.
    assert cachepace.value(A, "5m", 0.25, 2) == pytest.approx(0.9 * 0.3125 - 0.25)  # 0.03125


def test_no_history_keeps_the_profiles_ttls() -> None:
    assert cachepace.choose(None, A) is None
    assert cachepace.choose(SessionPace((), now=5.0), A) is None


def test_slow_session_writes_for_an_hour() -> None:
    # One gap of 400 s (> 5 min): tail horizon 2 → 5 min 0.03125 < 1 h 0.18125; stable
    # horizon 16 → 5 min 0.9·(1/3)·(1-4^-16) - 0.25 ≈ 0.05 < 1 h 0.9·3·(1-0.75^16) - 1 ≈ 1.673.
    assert cachepace.choose(_pace(1000.0, now=1400.0), A) == PaceChoice(stable="1h", tail="1h")


def test_fast_session_writes_for_five_minutes() -> None:
    # One gap of 20 s: p is 0.75 for both TTLs, so the cheaper premium wins by 0.75.
    assert cachepace.choose(_pace(1000.0, now=1020.0), A) == PaceChoice(stable="5m", tail="5m")


def test_rare_session_writes_nothing() -> None:
    # Gaps of 4000 s and 5000 s: p = 0.5/3 for both TTLs. Tail horizon 3: reads
    # 1/6 + 1/36 + 1/216 ≈ 0.199 save 0.179 < 0.25 premium; stable horizon 16: ≈ 0.2 → 0.18.
    assert cachepace.choose(_pace(0.0, 4000.0, now=9000.0), A) == PaceChoice(stable=None, tail=None)


def test_stable_part_and_tail_may_differ() -> None:
    # Gaps 10 s, 900 s, 4000 s: p5 = 0.375, p1h = 0.625. Tail horizon 4:
    #   5 min: 0.9·(0.375+0.140625+0.052734+0.019775) - 0.25 = 0.279321
    #   1 h:   0.9·(0.625+0.390625+0.244141+0.152588) - 1    = 0.271118 → 5 min
    # Stable horizon 16: 5 min 0.9·0.6 - 0.25 ≈ 0.29 < 1 h 0.9·1.6658 - 1 ≈ 0.499 → 1 h.
    assert cachepace.choose(_pace(0.0, 10.0, 910.0, now=4910.0), A) == PaceChoice(stable="1h", tail="5m")


def test_gaps_are_measured_start_to_start_and_never_negative() -> None:
    assert _pace(30.0, 0.0, 10.0, now=100.0).gaps() == (10.0, 20.0, 70.0)
    assert _pace(100.0, now=90.0).gaps() == (0.0,)  # a replica's clock slightly behind


def test_bets_settle_on_the_next_read() -> None:
    wrote = PaceEvent(0.0, read=1000, write_5m=500, write_1h=2000)
    won = cachepace.settle(wrote, PaceEvent(60.0, read=3500, write_5m=300, write_1h=0))
    assert won == (cachepace.Bet("1h", True), cachepace.Bet("5m", True))
    half = cachepace.settle(wrote, PaceEvent(600.0, read=3000))  # the 5 min entry expired
    assert half == (cachepace.Bet("1h", True), cachepace.Bet("5m", False))
    lost = cachepace.settle(PaceEvent(0.0, read=0, write_5m=4000, write_1h=0), PaceEvent(400.0, read=0))
    assert lost == (cachepace.Bet("5m", False),)
    assert cachepace.settle(None, PaceEvent(1.0, read=5)) == ()
    assert cachepace.settle(PaceEvent(0.0, read=None, write_5m=9), PaceEvent(1.0, read=5)) == ()


# --- the planner with a pace ----------------------------------------------------------------


def _plan(doc: dict[str, Any], pace: SessionPace | None, settings: CacheSettings = ANTHROPIC) -> caching.CachePlan:
    text = json.dumps(doc)
    return caching.plan(
        CARRIERS["anthropic.messages"], text, json.loads(text), settings, CTX, runes_div4, pace=pace, prices=A
    )


def test_no_history_plans_as_before_and_says_so() -> None:
    doc = _conversation()
    before = caching.plan(
        CARRIERS["anthropic.messages"],
        json.dumps(doc),
        doc,
        ANTHROPIC.model_copy(update={"pace": False}),
        CTX,
        runes_div4,
    )
    fresh = _plan(doc, SessionPace((), now=0.0))
    assert fresh.edits == before.edits and fresh.breakpoints == before.breakpoints
    assert fresh.evidence == ("no_history", "ttl_5m") and before.evidence == ("fixed_ttl", "ttl_5m")


def test_slow_session_gets_one_hour_markers() -> None:
    plan = _plan(_conversation(), _pace(1000.0, now=1400.0))
    assert plan.breakpoints and {ttl for _, ttl in plan.breakpoints} == {"1h"}
    assert plan.evidence == ("ttl_1h",)


def test_unprofitable_writes_are_not_placed() -> None:
    plan = _plan(_conversation(), _pace(0.0, 4000.0, now=9000.0))
    assert plan.edits == () and plan.breakpoints == ()
    assert plan.evidence == ("skipped_unprofitable",)


def test_stable_one_hour_comes_before_tail_five_minutes() -> None:
    plan = _plan(_conversation(), _pace(0.0, 10.0, 910.0, now=4910.0))
    names = dict(plan.breakpoints)
    assert names["system"] == "1h" and names["tools"] == "1h" and names["last_turn"] == "5m"
    ttls = [ttl for _, ttl in plan.breakpoints]  # prompt order
    assert ttls == sorted(ttls, key=lambda t: t != "1h")
    assert plan.evidence == ("ttl_1h", "ttl_5m")


def test_client_markers_count_and_win() -> None:
    doc = _conversation(system=[{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral", "ttl": "1h"}}])
    plan = _plan(doc, _pace(1000.0, now=1400.0))
    text = jsonspan.apply(json.dumps(doc), plan.edits)
    assert json.loads(text)["system"] == doc["system"]  # the client's marker is left as sent
    assert "system" not in dict(plan.breakpoints) and plan.evidence[0] == "client_markers"
    # A fast session's 5 min marker would come after the client's 1 h: placed, never before it.
    fast = _plan(doc, _pace(1000.0, now=1020.0))
    assert dict(fast.breakpoints).get("tools") is None and "ttl_order" in fast.skipped


def test_planning_is_deterministic_for_a_request_and_record() -> None:
    doc = _conversation()
    pace = _pace(0.0, 10.0, 910.0, now=4910.0)
    first, second = _plan(doc, pace), _plan(doc, pace)
    assert first == second
    text = jsonspan.apply(json.dumps(doc), first.edits)
    again = caching.plan(
        CARRIERS["anthropic.messages"], text, json.loads(text), ANTHROPIC, CTX, runes_div4, pace=pace, prices=A
    )
    assert again.edits == ()  # a planned body plans to itself
    assert set(first.evidence) | set(again.evidence) <= set(cachepace.EVIDENCE)


# --- OpenAI ---------------------------------------------------------------------------------

OPENAI_24H = CacheSettings(mode="openai-prompt-cache-key", extended_retention=True)
OAI = DEFAULT_PRICES["openai"]


def _openai(body: dict[str, Any], pace: SessionPace | None, settings: CacheSettings = OPENAI_24H) -> dict[str, Any]:
    text = json.dumps(body)
    plan = caching.plan(CARRIERS["openai.chat"], text, body, settings, CTX, runes_div4, pace=pace, prices=OAI)
    out: dict[str, Any] = json.loads(jsonspan.apply(text, plan.edits))
    out["_evidence"] = plan.evidence
    return out


def test_openai_extended_retention_when_the_pace_calls_for_it() -> None:
    body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": LONG}]}
    slow = _openai(body, _pace(1000.0, now=1400.0))
    assert slow["prompt_cache_retention"] == "24h" and "retention_24h" in slow["_evidence"]
    fast = _openai(body, _pace(1000.0, now=1020.0))
    assert "prompt_cache_retention" not in fast and fast["prompt_cache_key"] == slow["prompt_cache_key"]
    not_allowed = _openai(body, _pace(1000.0, now=1400.0), CacheSettings(mode="openai-prompt-cache-key"))
    assert "prompt_cache_retention" not in not_allowed


def test_openai_client_key_and_retention_are_never_dropped() -> None:
    body = {
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": LONG}],
        "prompt_cache_key": "mine",
        "prompt_cache_retention": "in_memory",
    }
    out = _openai(body, _pace(1000.0, now=1400.0))
    assert out["prompt_cache_key"] == "mine" and out["prompt_cache_retention"] == "in_memory"
    assert out["_evidence"] == ("client_markers",)


# --- prices in the profile ------------------------------------------------------------------


def test_default_prices_per_provider_are_named_and_versioned() -> None:
    base = {"version": 1, "carriers": ["messages"], "base_url": "https://api.anthropic.com"}
    anthropic = UpstreamProfile(id="a", provider="anthropic", models=("claude-*",), credential="none", **base)
    assert anthropic.cache_prices == A and A.name == "anthropic-2025@1"
    assert (A.read, A.write_5m, A.write_1h) == (0.1, 1.25, 2.0)
    compat = UpstreamProfile(
        id="c",
        version=1,
        provider="openai-compatible",
        carriers=("chat",),
        base_url="https://llm.example",
        models=("*",),
        credential="none",
    )
    assert compat.cache_prices.name == "openai-2025@1"
    own = CachePrices(name="anthropic-batch@2", read=0.05, write_5m=0.625 * 2, write_1h=2.0)
    assert (
        UpstreamProfile(
            id="a",
            provider="anthropic",
            models=("claude-*",),
            credential="none",
            cache=CacheSettings(prices=own),
            **base,
        ).cache_prices
        == own
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"name": "anthropic-2025@1", "read": 1.0, "write_5m": 1.25, "write_1h": 2.0},  # a read must save
        {"name": "anthropic-2025@1", "read": 0.1, "write_5m": 0.9, "write_1h": 2.0},  # a write never costs less
        {"name": "anthropic-2025@1", "read": 0.1, "write_5m": 1.25, "write_1h": 1.1},  # 1 h cheaper than 5 min
        {"name": "anthropic-2025", "read": 0.1, "write_5m": 1.25, "write_1h": 2.0},  # no version
        {"name": "anthropic-2025@1", "read": 0.1, "write_5m": 1.25, "write_1h": 2.0, "surprise": 1},
    ],
)
def test_price_fields_are_validated(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        CachePrices(**fields)


def test_extended_retention_is_only_for_openai() -> None:
    with pytest.raises(ValidationError):
        CacheSettings(mode="anthropic-cache-control", extended_retention=True)


def test_prices_are_signed_with_the_profile(make_env: Any) -> None:
    env = make_env()
    path = env.dir / "profiles" / "mock-anthropic.json"
    doc = json.loads(path.read_text())
    doc.pop("signature", None)
    doc["cache"]["prices"] = {"name": "anthropic-2025@1", "read": 0.1, "write_5m": 1.25, "write_1h": 2.0}
    env.write_profile(doc)
    trusted = load_trusted_keys(("keys/profile-signing.pub.json",), env.dir)
    now = datetime.now(UTC)
    loaded = load_profile(path, trusted, now, env.dir)
    assert loaded.profile.cache_prices.read == 0.1
    signed = json.loads(path.read_text())
    signed["cache"]["prices"]["write_1h"] = 1.5  # a cheaper 1 h write than was signed
    path.write_text(json.dumps(signed))
    with pytest.raises(ConfigError, match="refused"):
        load_profile(path, trusted, now, env.dir)


def test_usage_records_carry_the_plan_and_read_back_older_ones() -> None:
    record = UsageRecord("r1", 0, "p", "anthropic.messages", "released", 200, all_unknown(), None, None, None)
    doc = {**record.as_json(), "cache_plan": ["ttl_1h"], "cache_prices": "anthropic-2025@1"}
    back = UsageRecord.from_json(doc)
    assert back.cache_plan == ("ttl_1h",) and back.cache_prices == "anthropic-2025@1"
    older = {k: v for k, v in doc.items() if k not in ("cache_plan", "cache_prices")}  # stored before this change
    assert UsageRecord.from_json(older).cache_plan == () and UsageRecord.from_json(older).cache_prices is None
