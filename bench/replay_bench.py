"""The 30-turn agent replay through wiregate to the caching mock provider.

Prints, per profile (Anthropic cache_control, OpenAI prompt_cache_key): the cached-read
share of input per turn and overall, the optimum (every turn reading the whole previous
prompt), and input tokens billed-equivalent with and without wiregate, using the
providers' published multipliers (Anthropic: write 1.25x for 5 min, 2x for 1 h, read
0.1x; OpenAI: read per profile, `--openai-read` — 0.1x for GPT-5.6 and later, 0.5x for
gpt-4o-class models). Without wiregate means the same requests sent directly: no
Anthropic markers, and no prompt_cache_key (OpenAI's automatic caching still applies).

    .venv/bin/python bench/replay_bench.py [--turns 30] [--openai-read 0.1] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.mockprovider import MockProviderServer  # noqa: E402
from tests import replay  # noqa: E402
from tests.harness import UPSTREAM_KEY, GatewayThread, build_env, raw_client  # noqa: E402

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
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
