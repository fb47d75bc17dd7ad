"""Where the full decision's time goes: cProfile over inspect_bench.py's "full decision" case
(carrier parse + Engine.inspect, 1,000 configured secret values, the built-in catalogue) on
its 100 KB and 2 MB agent requests, with the native or the reference JSON reader and encoded-run
finder (`--reader reference --decoders reference` is the path before either native module).

    .venv/bin/python bench/profile_decision.py [--reader native|reference] [--decoders native|reference] [--top 20]
    .venv/bin/python bench/profile_decision.py --compare

Prints, per size, the CPU time per decision (process time, so other load on a shared machine
counts less) and the top entries by own time and by cumulative time. `--compare` profiles
nothing: it times the full decision, the carrier parse and `jsonraw.decode_units` with either
reader, interleaved over 5 rounds (best round each), and prints the native/reference ratio.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

import inspect_bench as ib  # bench/ is on sys.path (this script's directory)
import wire_bench

from gateway.carriers import jsonraw
from gateway.inspection import decoders

SIZES = ((100 * 1024, 40), (2 * 1024 * 1024, 4))
ROUNDS = 5


def cpu_ms(run: Callable[[], object], count: int, native: bool) -> float:
    jsonraw.use_native(native)
    gc.collect()
    try:
        start = time.process_time()
        for _ in range(count):
            run()
        return (time.process_time() - start) / count * 1e3
    finally:
        jsonraw.use_native(True)


def compare(engine: Any) -> None:
    if not jsonraw.NATIVE_AVAILABLE:
        print("native JSON reader not built: nothing to compare", file=sys.stderr)
        return
    for size, count in SIZES:
        raw = ib.agent_request(size)
        runs: dict[str, Callable[[], object]] = {
            "full decision": lambda raw=raw: engine.inspect(
                ib.subject_of(raw, ib.CARRIER.parse_request(raw, ib.LIMITS))
            ),
            "carrier parse": lambda raw=raw: ib.CARRIER.parse_request(raw, ib.LIMITS),
            "decode_units": lambda raw=raw: jsonraw.decode_units(raw, (), ib.LIMITS.max_depth),
        }
        print(f"== {len(raw):,} B (CPU ms per call, best of {ROUNDS} interleaved rounds)")
        for name, run in runs.items():
            run()
            native, reference = [], []
            for _ in range(ROUNDS):
                native.append(cpu_ms(run, count, True))
                reference.append(cpu_ms(run, count, False))
            n, r = min(native), min(reference)
            mbps = len(raw) / 1e3  # bytes / 1e6 per ms -> MB/s
            print(
                f"   {name:<14} native {n:9.3f} ms {mbps / n:7.0f} MB/s   reference {r:9.3f} ms {mbps / r:7.0f} MB/s"
                f"   native {r / n:.2f}x"
            )
        scans(engine, raw, count)


def scans(engine: Any, raw: bytes, count: int) -> None:
    """What the Hyperscan scans alone cost in one full decision: a ceiling for it, however
    fast everything around them gets."""
    matcher_type = type(engine.matcher)
    original = matcher_type._scan
    seen = {"calls": 0, "bytes": 0, "cpu": 0.0}

    def timed(self: Any, db: Any, which: str, data: bytes) -> Any:
        start = time.process_time()
        try:
            return original(self, db, which, data)
        finally:
            seen["cpu"] += time.process_time() - start
            seen["calls"] += 1
            seen["bytes"] += len(data)

    matcher_type._scan = timed
    try:
        for _ in range(count):
            engine.inspect(ib.subject_of(raw, ib.CARRIER.parse_request(raw, ib.LIMITS)))
    finally:
        matcher_type._scan = original
    calls, scanned, cpu = seen["calls"] / count, seen["bytes"] / count, seen["cpu"] / count
    print(
        f"   matcher        {calls:.0f} Hyperscan scans over {scanned / 1e3:,.0f} KB ({scanned / len(raw):.1f}x the body),"
        f" {cpu * 1e3:.3f} ms: the full decision cannot beat {len(raw) / 1e6 / cpu:.0f} MB/s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--reader", choices=("native", "reference"), default="native")
    parser.add_argument(
        "--decoders",
        choices=("native", "reference"),
        default="native",
        help="the encoded-run finder: its native module or decoders.py's pure-Python reference",
    )
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--compare", action="store_true", help="time either reader instead of profiling")
    args = parser.parse_args(argv)
    if args.reader == "native" and not jsonraw.NATIVE_AVAILABLE:
        print("native JSON reader not built; profiling the reference reader", file=sys.stderr)
    jsonraw.use_native(args.reader == "native")
    decoders.use_native(args.decoders == "native")
    engine = ib.compile_engines(wire_bench.secret_values(ib.SECRET_COUNT)).hyperscan
    if args.compare:
        compare(engine)
        return 0
    for size, count in SIZES:
        raw = ib.agent_request(size)

        def full(raw: bytes = raw) -> None:
            engine.inspect(ib.subject_of(raw, ib.CARRIER.parse_request(raw, ib.LIMITS)))

        full()
        gc.collect()  # a pending full collection would be charged to whatever runs next
        start = time.process_time()
        for _ in range(count):
            full()
        cpu = (time.process_time() - start) / count
        print(
            f"== {len(raw):,} B, {args.reader} reader, {args.decoders} decoders: {cpu * 1e3:.2f} ms CPU per decision, {len(raw) / 1e6 / cpu:.1f} MB/s"
        )
        gc.collect()
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
