"""Fused CPU efficiency: does a fused trial of F members cost F times one member alone?

The AdamW pre-LN residual MLP of ``benchmarks/transfer_fidelity.py`` (batch 64, its synthetic tabular task) at
each width of ``--widths``: F members (distinct configurations of its search space, seeded random search) fused
in one ``hydro.trial.FusedTrial`` (full size, grouped operators, one fused optimizer), for each F of
``--fusions``, against each of its configurations alone as a stock Ray Tune trial trains it (the plain model and
``torch.optim.AdamW``). Each round times steps of every trial in turn (rounds interleave them, so a
shared machine's load falls on all alike), with ``--threads`` torch threads (a Ray trial with 1 CPU trains
with 1: Ray sets ``OMP_NUM_THREADS`` to the trial's CPUs). Steps are timed in the process's CPU time (all its
threads: the compute a step costs, which a shared machine's load inflates less than the wall clock; with 2
threads it counts time the second thread spends waiting too). Reported per (threads, width, F): CPU time per step
(median and quartiles over rounds), ``ratio``: the fused step's time over the sum of its F members' steps alone
in the same round (1: the fused trial costs exactly its share of compute; the FLOPs of a fused step are F times
one member's, counted by ``torch.utils.flop_counter``), and the aten operations per step of the fused trial (its
fixed per-step work: a count that does not grow with F). Prints a table and writes
``benchmarks/results/fused_efficiency.json``.

    python -m benchmarks.fused_efficiency [--fusions 1,4,11,24] [--widths 128,512] [--threads 1,2] [--rounds 7]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.transfer_fidelity import residual_mlp
from hydro.cli_options import at_least
from hydro.profiling import torch_threads
from hydro.trial.host_syncs import HostSyncCounter
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune.search.random_search import RandomSearch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ALONE = 0  # the fusion count that stands for one configuration alone (a plain trial)
_STEPS = 20  # timed steps per trial and round


def counts(values: str) -> list[int]:
    """A comma-separated list of positive integers."""
    parsed = [int(v) for v in values.split(",") if v]
    if not parsed or min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {values!r}")
    return parsed


def trials(width: int, fusions: list[int], seed: int) -> tuple[list[FusedTrial], dict[int, FusedTrial]]:
    """Each of the drawn configurations alone (a plain trial, as stock Ray Tune trains it), and per fusion count F
    a fused trial of the first F of them."""
    spec, space = residual_mlp(epochs=1, width=width)
    data = spec.load_data()
    drawn = RandomSearch(space, seed=seed)
    configs = [(f"m{i}", drawn.suggest(str(i))) for i in range(max(fusions))]
    alone = [FusedTrial(spec, TrialPlan(TrialKind.PLAIN, [config]), data) for config in configs]
    return alone, {f: FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, configs[:f]), data) for f in fusions}


def step_time(trial: FusedTrial) -> float:
    """CPU seconds per training step over ``_STEPS`` steps (an epoch that ends is closed and the next begun)."""
    start = time.process_time()
    for _ in range(_STEPS):
        if trial.train_step() is None:
            trial.train_epoch()
            trial.train_step()
    return (time.process_time() - start) / _STEPS


def step_counts(trial: FusedTrial) -> tuple[int, int]:
    """One training step's aten operations and FLOPs (forward and backward)."""
    with HostSyncCounter() as ops:
        trial.train_step()
    with FlopCounterMode(display=False) as flops:
        trial.train_step()
    return ops.total, flops.get_total_flops()


def measure(threads: int, width: int, fusions: list[int], rounds: int, seed: int) -> list[dict]:
    """The rows of one (threads, width): per fusion count, step times over ``rounds`` interleaved rounds, against
    the sum of its members' steps alone in the same round (members differ: a configuration whose values
    underflow to subnormal floats steps slower, alone as fused)."""
    with torch_threads(threads):
        alone, fused = trials(width, fusions, seed)
        static = {ALONE: step_counts(alone[0]), **{f: step_counts(t) for f, t in fused.items()}}
        alone_times: list[list[float]] = []  # per round, each configuration's step alone
        times: dict[int, list[float]] = {f: [] for f in fused}
        for _ in range(rounds):
            alone_times.append([step_time(trial) for trial in alone])
            for f, trial in fused.items():
                times[f].append(step_time(trial))
    rows = []
    for f in [ALONE, *fusions]:
        if f == ALONE:  # one member alone: the mean over the configurations
            by_round, base = [sum(r) / len(r) for r in alone_times], [sum(r) / len(r) for r in alone_times]
        else:  # the fused step against its F members' steps alone
            by_round, base = times[f], [sum(r[:f]) for r in alone_times]
        q1, median, q3 = statistics.quantiles(by_round, n=4) if rounds > 1 else [by_round[0]] * 3
        members = 1 if f == ALONE else f
        rows.append({"threads": threads, "width": width, "fusion": "alone" if f == ALONE else f,
                     "step_ms": 1e3 * median, "step_ms_q1": 1e3 * q1, "step_ms_q3": 1e3 * q3,
                     "ratio": median / statistics.median(base),
                     "ratio_by_round": [t / b for t, b in zip(by_round, base)],
                     "ops_per_step": static[f][0], "flops_per_step": static[f][1],
                     "flop_share": static[f][1] / (members * static[ALONE][1])})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fusions", type=counts, default=[1, 4, 11, 24], help="fusion counts F")
    parser.add_argument("--widths", type=counts, default=[128, 512], help="the residual MLP's widths")
    parser.add_argument("--threads", type=counts, default=[1, 2], help="torch threads (a 1-CPU Ray trial: 1)")
    parser.add_argument("--rounds", type=at_least(1), default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "fused_efficiency.json")
    args = parser.parse_args()
    load = [os.getloadavg()[0]]
    rows = [row for threads in args.threads for width in args.widths
            for row in measure(threads, width, args.fusions, args.rounds, args.seed)]
    load.append(os.getloadavg()[0])
    print(f"\nresidual MLP, batch 64, {_STEPS} steps per trial and round, {args.rounds} rounds; {os.cpu_count()} CPUs, "
          f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end\n")
    print(f"{'threads':>7} {'width':>5} {'F':>5} {'CPU ms/step (q1-q3)':>22} {'ratio':>6} {'ratio q1-q3':>12} "
          f"{'FLOP share':>10} {'aten ops':>8}")
    for row in rows:
        r1, _, r3 = statistics.quantiles(row["ratio_by_round"], n=4) if args.rounds > 1 else [row["ratio"]] * 3
        print(f"{row['threads']:7d} {row['width']:5d} {row['fusion']!s:>5} "
              f"{row['step_ms']:8.2f} ({row['step_ms_q1']:5.2f}-{row['step_ms_q3']:5.2f}) {row['ratio']:6.2f} "
              f"{r1:5.2f}-{r3:<5.2f} {row['flop_share']:10.2f} {row['ops_per_step']:8d}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {**vars(args), "out": str(args.out)}, "steps_per_round": _STEPS,
                                    "load": load, "cpus": os.cpu_count(), "torch": torch.__version__,
                                    "python": sys.version.split()[0], "machine": platform.machine(), "rows": rows},
                                   indent=1))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
