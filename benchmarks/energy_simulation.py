"""Benchmark: the trace-driven energy simulation on V100 and P100 for all six Zeus workloads.

    python -m benchmarks.energy_simulation [--seeds 10] [--out DIR]   (from the repo root)

Same options as ``hydro energy simulate``; prints the table and writes JSON and a PNG to ``--out``
(default here: ``benchmarks/results`` of this checkout, where the benchmarks keep their results).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydro.energy.cli import add_subparser

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="energy_simulation")
    add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["energy", "simulate", *(sys.argv[1:] if argv is None else argv)])
    args.out = args.out or RESULTS
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
