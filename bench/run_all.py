"""Run every benchmark in bench/ (`make bench`). Arguments are passed to each benchmark
(e.g. `--quick`, `--json PATH`). For now there is one: the wire benchmark."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import wire_bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return wire_bench.main(argv)


if __name__ == "__main__":
    sys.exit(main())
