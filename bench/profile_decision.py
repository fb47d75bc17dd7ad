"""Where the full decision's time goes: cProfile over inspect_bench.py's "full decision" case
(carrier parse + Engine.inspect, 1,000 configured secret values, the built-in catalogue) on
its 100 KB and 2 MB agent requests, with the native or the reference JSON reader.

    .venv/bin/python bench/profile_decision.py [--reader native|reference] [--top 20]

Prints, per size, the CPU time per decision (process time, so other load on a shared machine
counts less) and the top entries by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import inspect_bench as ib  # bench/ is on sys.path (this script's directory)
import wire_bench

from gateway.carriers import jsonraw

SIZES = ((100 * 1024, 40), (2 * 1024 * 1024, 4))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reader", choices=("native", "reference"), default="native")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    if args.reader == "native" and not jsonraw.NATIVE_AVAILABLE:
        print("native JSON reader not built; profiling the reference reader", file=sys.stderr)
    jsonraw.use_native(args.reader == "native")
    engine = ib.compile_engines(wire_bench.secret_values(ib.SECRET_COUNT)).hyperscan
    for size, count in SIZES:
        raw = ib.agent_request(size)

        def full(raw: bytes = raw) -> None:
            engine.inspect(ib.subject_of(raw, ib.CARRIER.parse_request(raw, ib.LIMITS)))

        full()
        start = time.process_time()
        for _ in range(count):
            full()
        cpu = (time.process_time() - start) / count
        print(
            f"== {len(raw):,} B, {args.reader} reader: {cpu * 1e3:.2f} ms CPU per decision, {len(raw) / 1e6 / cpu:.1f} MB/s"
        )
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(count):
            full()
        profile.disable()
        stats = pstats.Stats(profile)
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumtime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
