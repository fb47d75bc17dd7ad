"""The 30-turn agent replay through wiregate to the caching mock provider.

Prints, per profile (Anthropic cache_control, OpenAI prompt_cache_key): the cached-read
share of input per turn and overall, the optimum (every turn reading the whole previous
prompt), and input tokens billed-equivalent with and without wiregate, using the
providers' published multipliers (Anthropic: write 1.25x for 5 min, 2x for 1 h, read
0.1x; OpenAI: read per profile, `--openai-read` — 0.1x for GPT-5.6 and later, 0.5x for
gpt-4o-class models). Without wiregate means the same requests sent directly: no
Anthropic markers, and no prompt_cache_key (OpenAI's automatic caching still applies).

    .venv/bin/python bench/replay_bench.py [--turns 30] [--openai-read 0.1] [--json PATH]

Then the same Anthropic session in three paces (fast: seconds apart; slow: every gap above
5 minutes and below an hour; mixed: bursts separated by long pauses), on one virtual clock
that the mock's cache TTLs and the gateway's pace record both read, so an hour of session
replays in a second. Per pace, input billed-equivalent for: direct (no markers), today's
planner (the profile's fixed TTLs), the paced planner, and the best fixed policy in
hindsight (the cheapest of `pace_policies.FIXED` replayed on the same trace).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import pace_policies  # noqa: E402
from gateway.mockprovider import MockProviderServer  # noqa: E402
from gateway.state import PACE_LEDGER  # noqa: E402
from tests import replay  # noqa: E402
from tests.harness import UPSTREAM_KEY, GatewayThread, build_env, mock_profile, raw_client  # noqa: E402

ROUTES = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}


def run(post: Any, provider: str, session: replay.Session, turns: int) -> list[dict[str, Any]]:
    usages = []
    for turn in range(turns):
        body = (
            replay.anthropic_request(session, turn) if provider == "anthropic" else replay.openai_request(session, turn)
        )
        r = post(ROUTES[provider], body)
        if r.status_code != 200:
            raise SystemExit(f"{provider} turn {turn}: HTTP {r.status_code}")
        usages.append(r.json()["usage"])
    return usages


def table(provider: str, rows: list[replay.TurnFigures], direct: list[replay.TurnFigures]) -> str:
    lines = [f"   {'turn':>4} {'input':>7} {'read':>7} {'write':>7} {'share':>6} {'optimum':>7} {'direct read':>11}"]
    for row, d in zip(rows, direct, strict=True):
        share = row.cache_read / row.input_total if row.input_total else 0.0
        opt = row.optimum_read / row.input_total if row.input_total else 0.0
        lines.append(
            f"   {row.turn + 1:>4} {row.input_total:>7,} {row.cache_read:>7,} "
            f"{row.cache_write_5m + row.cache_write_1h:>7,} {share:>6.1%} {opt:>7.1%} {d.cache_read:>11,}"
        )
    return "\n".join(lines)


class Clock:
    """Virtual seconds: the bench steps it between turns instead of waiting."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def paced_runs(mock: MockProviderServer, turns: int) -> dict[str, Any]:
    """The three paces, each replayed direct, through today's planner, through the paced
    planner, and with every fixed policy; billed-equivalent input per run."""
    clock = Clock()
    mock.state.clock = clock
    profiles = [
        mock_profile("mock-anthropic", "anthropic", mock.url),  # paces (the default)
        mock_profile(
            "today",
            "anthropic",
            mock.url,
            cache={"mode": "anthropic-cache-control", "min_prefix_tokens": 1024, "ttl": "5m", "pace": False},
        ),
    ]
    session = replay.build_session(turns, seed=21)
    headers = {"x-api-key": UPSTREAM_KEY}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = build_env(Path(tmp) / "env", mock.url, profiles=profiles)
        with GatewayThread(env.config) as gateway, httpx2.Client(base_url=mock.url, timeout=60) as direct:
            assert gateway.running is not None
            gateway.running.app[PACE_LEDGER].clock = clock
            client = raw_client(gateway, env, uds=True)
            auth = {"authorization": f"Bearer {env.gateway_key}"}

            def replay_one(pace: str, send: Any, client: Any = None) -> float:
                mock.state.clear_cache()
                clock.t += 10 * 86_400  # nothing carries over from the run before
                total = 0.0
                for turn, gap in enumerate([0.0, *pace_policies.gaps(pace, turns)]):
                    clock.t += gap
                    body = replay.anthropic_request(session, turn)
                    r = send(client(body) if client else body)
                    if r.status_code != 200:
                        raise SystemExit(f"{pace} turn {turn}: HTTP {r.status_code} {r.text[:200]}")
                    total += pace_policies.billed(r.json()["usage"])
                return total

            scenarios = [(pace, pace, None) for pace in pace_policies.PACES]
            scenarios.append(("slow, client 1h system", "slow", pace_policies.client_1h_system))
            for label_, pace, own in scenarios:
                row: dict[str, Any] = {
                    "direct": replay_one(pace, lambda b: direct.post("/v1/messages", json=b, headers=headers), own),
                }
                for label, profile in (("today", "today"), ("paced", "mock-anthropic")):
                    h = {**auth, "x-wiregate-profile": profile, "x-wiregate-session": f"{label_}-{label}"}
                    row[label] = replay_one(pace, lambda b, h=h: client.post("/v1/messages", json=b, headers=h), own)
                # With the client's own system marker, a fixed policy only adds tail markers.
                policies = pace_policies.FIXED if own is None else [(None, "5m"), (None, "1h")]
                fixed = {
                    pace_policies.name(p): replay_one(
                        pace,
                        lambda b, p=p: direct.post("/v1/messages", json=pace_policies.marked(b, p), headers=headers),
                        own,
                    )
                    for p in policies
                }
                best = min(fixed, key=lambda k: fixed[k])
                row |= {"fixed": fixed, "best_fixed": best, "optimum": min(fixed[best], row["direct"])}
                if row["optimum"] == row["direct"]:
                    row["best_fixed"] = "no markers" if own is None else "client's markers only"
                out[label_] = row
    mock.state.clock = time.monotonic
    return out


def pace_table(rows: dict[str, Any]) -> str:
    lines = [
        "| pace | direct (no markers) | today's planner | paced planner | best fixed in hindsight | paced vs direct | paced of optimum |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pace, row in rows.items():
        lines.append(
            f"| {pace} | {row['direct']:,.0f} | {row['today']:,.0f} ({row['today'] / row['direct']:.0%}) "
            f"| {row['paced']:,.0f} | {row['optimum']:,.0f} ({row['best_fixed']}) "
            f"| {row['paced'] / row['direct']:.1%} | {row['optimum'] / row['paced']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--openai-read", type=float, default=0.1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="accepted for run_all; the replay is already quick")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, MockProviderServer(api_key=UPSTREAM_KEY) as mock:
        env = build_env(Path(tmp) / "env", mock.url)
        with GatewayThread(env.config) as gateway:
            client = raw_client(gateway, env, uds=True)
            direct = httpx2.Client(base_url=mock.url, timeout=60)
            print("wiregate 30-turn replay (bundled mock provider with prompt-cache emulation)")
            for provider, seed in (("anthropic", 21), ("openai", 22)):
                mock.state.clear_cache()
                session = replay.build_session(args.turns, seed=seed)
                via = replay.figures(
                    provider,
                    run(
                        lambda p, b: client.post(p, json=b, headers={"authorization": f"Bearer {env.gateway_key}"}),
                        provider,
                        session,
                        args.turns,
                    ),
                )
                mock.state.clear_cache()
                headers = (
                    {"x-api-key": UPSTREAM_KEY}
                    if provider == "anthropic"
                    else {"authorization": f"Bearer {UPSTREAM_KEY}"}
                )
                plain = replay.figures(
                    provider,
                    run(lambda p, b, h=headers: direct.post(p, json=b, headers=h), provider, session, args.turns),
                )
                read_rate = 0.1 if provider == "anthropic" else args.openai_read
                with_gw = replay.summarise(via, read_rate=read_rate)
                without = replay.summarise(plain, read_rate=read_rate)
                print(f"\n== {provider}: {args.turns} turns, read x{read_rate}, write x1.25 (5 min) / x2 (1 h)")
                print(table(provider, via, plain))
                print(
                    f"   cached-read share: {with_gw.share:.1%}   optimum: {with_gw.optimum_share:.1%}   "
                    f"of optimum: {with_gw.of_optimum:.1%}   target >= 90%: {'PASS' if with_gw.of_optimum >= 0.9 else 'MISS'}"
                )
                print(
                    f"   input billed-equivalent: with wiregate {with_gw.billed:,.0f}   without {without.billed:,.0f}   "
                    f"(no caching at all {with_gw.billed_uncached:,.0f}; saving vs without {1 - with_gw.billed / without.billed:.1%})"
                )
                results[provider] = {
                    "turns": [r.__dict__ for r in via],
                    "direct": [r.__dict__ for r in plain],
                    "share": with_gw.share,
                    "optimum_share": with_gw.optimum_share,
                    "of_optimum": with_gw.of_optimum,
                    "billed_with": with_gw.billed,
                    "billed_without": without.billed,
                    "billed_uncached": with_gw.billed_uncached,
                }
        print(
            f"\n== anthropic: the same {args.turns}-turn session in three paces (virtual clock; billed-equivalent input)"
        )
        paces = paced_runs(mock, args.turns)
        print(pace_table(paces))
        for pace, row in paces.items():
            want = 1.0 if pace == "fast" else 0.9
            ok = row["paced"] <= row["direct"] and row["optimum"] / row["paced"] >= want - 1e-9
            print(f"   {pace}: target (<= direct, >= {want:.0%} of optimum) {'PASS' if ok else 'MISS'}")
        results["paces"] = paces
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
