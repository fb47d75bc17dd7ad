"""Run every benchmark in bench/ (`make bench`): the wire benchmark, the inspection
benchmark, the 30-turn cache replay, the event-loop benchmark and the attribution
collection cost. `--quick` goes to both; `--rounds` and `--secrets` are the wire benchmark's;
`--json PATH` writes each benchmark's results next to PATH, named after it
(`all.json` -> `all.wire.json`, `all.inspect.json`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attribution_bench  # noqa: E402
import inspect_bench  # noqa: E402
import loop_bench  # noqa: E402
import replay_bench  # noqa: E402
import stream_bench  # noqa: E402
import wire_bench  # noqa: E402

BENCHMARKS: dict[str, Callable[[list[str] | None], int]] = {
    "wire": wire_bench.main,
    "inspect": inspect_bench.main,
    "replay": replay_bench.main,
    "loop": loop_bench.main,
    "attribution": attribution_bench.main,
    "stream": stream_bench.main,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run of every benchmark")
    parser.add_argument("--rounds", type=int, help="wire benchmark: timed rounds per target")
    parser.add_argument("--secrets", type=int, help="wire benchmark: secret values to configure")
    parser.add_argument("--json", type=Path, help="write <stem>.<benchmark><suffix> files")
    return parser.parse_args(argv)


def benchmark_argv(name: str, args: argparse.Namespace) -> list[str]:
    argv = ["--quick"] if args.quick else []
    if name == "wire":
        for option in ("rounds", "secrets"):
            if getattr(args, option) is not None:
                argv += [f"--{option}", str(getattr(args, option))]
    if args.json:
        argv += ["--json", str(args.json.with_name(f"{args.json.stem}.{name}{args.json.suffix}"))]
    return argv


@contextlib.contextmanager
def affinity_restored() -> Iterator[None]:
    """A benchmark pins this process to the cores it needs: the next one starts unpinned."""
    try:
        cores = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        yield
        return
    try:
        yield
    finally:
        os.sched_setaffinity(0, cores)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    status = 0
    for i, (name, run) in enumerate(BENCHMARKS.items()):
        if i:
            print("\n" + "-" * 88 + "\n", flush=True)
        with affinity_restored():
            status = max(status, run(benchmark_argv(name, args)))
    return status


if __name__ == "__main__":
    sys.exit(main())
