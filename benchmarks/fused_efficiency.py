"""Fused CPU efficiency: does a fused trial of F members cost F times one member alone?

``--model mlp``: the AdamW pre-LN residual MLP of ``benchmarks/transfer_fidelity.py`` (batch 64, its synthetic
tabular task) at each width of ``--widths``: F members (distinct configurations of its search space, seeded random
search) fused in one ``hydro.trial.FusedTrial`` (full size, grouped operators, one fused optimizer), for each F of
``--fusions``, against each of its configurations alone as a stock Ray Tune trial trains it (the plain model and
``torch.optim.AdamW``).

``--model cnn``: the digits CNN of ``benchmarks/e2e_tuning.py::wide_digits_cnn`` (256/512 channels, SGD, batch
64, 8x8 digits) for each ``S:F`` of ``--cnn-cases``: F members fused as the search trains them (µP surrogates at
scale S: 256/S and 512/S channels) against each configuration alone at the surrogate's width as stock trains it
(the plain CNN with 256/S, 512/S channels and ``torch.optim.SGD``), and one configuration at full size
(``full``: what a member-epoch of the search is compared with; ``member/full``: the fused step per member over
the full-size step, where compute that grows with width squared would give 1/S²).

Each round times steps of every trial in turn (rounds interleave them, so a shared machine's load falls on all
alike), with ``--threads`` torch threads (a Ray trial with 1 CPU trains with 1: Ray sets ``OMP_NUM_THREADS`` to the
trial's CPUs). Steps are timed in the process's CPU time (all its threads: the compute a step costs, which a
shared machine's load inflates less than the wall clock; with 2 threads it counts time the second thread spends
waiting too). Reported per (threads, size, F): CPU time per step (median and quartiles over rounds), ``ratio``:
the fused step's time over the sum of its F members' steps alone in the same round (1: the fused trial costs
exactly its share of compute; the FLOPs of a fused step are F times one member's, counted by
``torch.utils.flop_counter``), the share of that CPU time spent in the kernel (``sys``) and the page faults per
step (memory the allocator takes from and gives back to the system each step), the aten operations per step (its
fixed per-step work: a count that does not grow with F), the CPU time of one evaluation of the validation split
(``eval``, ratio against the members' alone) and of reading one training batch (``data``: the batch every
member shares). ``--profile K``: the K operators of a fused step with the most CPU time (``torch.profiler``,
self time, input shapes). Prints a table and writes ``benchmarks/results/fused_efficiency.json`` (``--out``).

    python -m benchmarks.fused_efficiency [--model mlp] [--fusions 1,4,11,24] [--widths 128,512] [--threads 1,2]
    python -m benchmarks.fused_efficiency --model cnn [--cnn-cases 8:12,4:11] --threads 1 [--profile 12]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.e2e_tuning import CNN_CHANNELS, wide_digits_cnn
from benchmarks.transfer_fidelity import residual_mlp
from hydro.cli_options import at_least
from hydro.profiling import torch_threads
from hydro.trial.host_syncs import HostSyncCounter
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune.search.random_search import RandomSearch

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
ALONE, FULL = 0, -1  # the fusion counts that stand for one configuration alone (a plain trial), and at full size
_STEPS = 20  # timed steps per trial and round


def counts(values: str) -> list[int]:
    """A comma-separated list of positive integers."""
    parsed = [int(v) for v in values.split(",") if v]
    if not parsed or min(parsed) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {values!r}")
    return parsed


def cases(values: str) -> list[tuple[int, int]]:
    """A comma-separated list of ``S:F`` pairs of positive integers (scale, fusion count)."""
    try:
        parsed = [tuple(int(part) for part in v.split(":")) for v in values.split(",") if v]
    except ValueError:
        parsed = []
    if not parsed or any(len(p) != 2 or min(p) < 1 for p in parsed):
        raise argparse.ArgumentTypeError(f"expected scale:fusion pairs separated by commas (e.g. 8:12,4:11), "
                                         f"got {values!r}")
    return parsed


@dataclasses.dataclass
class Trials:
    """One measured size: each configuration alone, per fusion count the fused trial of the first F of them, and
    (CNN) the first configuration at full size."""

    alone: list[FusedTrial]
    fused: dict[int, FusedTrial]
    full: FusedTrial | None = None


def mlp_trials(width: int, fusions: list[int], seed: int) -> Trials:
    """The residual MLP at ``width``: its configurations alone (plain trials, as stock Ray Tune trains them) and
    fused (full size)."""
    spec, space = residual_mlp(epochs=1, width=width)
    data = spec.load_data()
    configs = drawn_configs(space, max(fusions), seed)
    return Trials([FusedTrial(spec, TrialPlan(TrialKind.PLAIN, [config]), data) for config in configs],
                  {f: FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, configs[:f]), data) for f in fusions})


def cnn_trials(scale: int, fusions: list[int], seed: int) -> Trials:
    """The digits CNN: fused µP surrogates at ``scale``, its configurations alone as stock trains them at the
    surrogate's width, and the first at full size."""
    spec, space = wide_digits_cnn(epochs=1)
    narrow, _ = wide_digits_cnn(epochs=1, channels=tuple(c // scale for c in CNN_CHANNELS))
    data = spec.load_data()
    configs = drawn_configs(space, max(fusions), seed)
    return Trials([FusedTrial(narrow, TrialPlan(TrialKind.PLAIN, [config]), data) for config in configs],
                  {f: FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, configs[:f], scale=scale, mup=True), data)
                   for f in fusions},
                  FusedTrial(spec, TrialPlan(TrialKind.PLAIN, configs[:1]), data))


def drawn_configs(space: dict, count: int, seed: int) -> list[tuple[str, dict]]:
    drawn = RandomSearch(space, seed=seed)
    return [(f"m{i}", drawn.suggest(str(i))) for i in range(count)]


@dataclasses.dataclass
class StepTime:
    """CPU seconds per step (all), of them in the kernel (``sys``), and minor page faults per step."""

    cpu: float
    sys: float
    faults: float


def step_time(trial: FusedTrial) -> StepTime:
    """Per training step over ``_STEPS`` steps (an epoch that ends is closed and the next begun)."""
    times, faults = os.times(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.process_time()
    for _ in range(_STEPS):
        if trial.train_step() is None:
            trial.train_epoch()
            trial.train_step()
    cpu = time.process_time() - start
    return StepTime(cpu / _STEPS, (os.times().system - times.system) / _STEPS,
                    (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / _STEPS)


def eval_time(trial: FusedTrial) -> float:
    """CPU seconds of one evaluation of the validation split."""
    start = time.process_time()
    trial.evaluate()
    return time.process_time() - start


def data_time(trial: FusedTrial) -> float:
    """CPU seconds per training batch read (an epoch's batches, as the trial reads them, without training)."""
    start, count = time.process_time(), 0
    for _ in trial.data[0].train_batches(trial.batch_size, trial.spec.seed, 1, 0, trial.device):
        count += 1
    return (time.process_time() - start) / count


def step_counts(trial: FusedTrial) -> tuple[int, int]:
    """One training step's aten operations and FLOPs (forward and backward)."""
    with HostSyncCounter() as ops:
        trial.train_step()
    with FlopCounterMode(display=False) as flops:
        trial.train_step()
    return ops.total, flops.get_total_flops()


def top_operators(trial: FusedTrial, count: int) -> list[dict]:
    """The ``count`` operators with the most self time over ``_STEPS`` steps (per step), by input shapes (the
    profiler times operators by the wall clock: on a loaded machine, read the shares)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step_time(trial)
    events = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: e.self_cpu_time_total,
                    reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "shapes": str(e.input_shapes), "calls_per_step": e.count / _STEPS,
             "self_ms_per_step": e.self_cpu_time_total / 1e3 / _STEPS, "share": e.self_cpu_time_total / total}
            for e in events[:count]]


def measure(threads: int, size: int, build: Callable[[], Trials], rounds: int, top: int) -> list[dict]:
    """The rows of one (threads, size): per fusion count, step times over ``rounds`` interleaved rounds, against
    the sum of its members' steps alone in the same round (members differ: a configuration whose values
    underflow to subnormal floats steps slower, alone as fused)."""
    with torch_threads(threads):
        trials = build()
        every = {ALONE: trials.alone[0], **trials.fused, **({FULL: trials.full} if trials.full else {})}
        static = {f: step_counts(t) for f, t in every.items()}
        data_ms = 1e3 * data_time(trials.alone[0])
        alone_times: list[list[StepTime]] = []  # per round, each configuration's step alone
        alone_evals: list[list[float]] = []
        times: dict[int, list[StepTime]] = {f: [] for f in every if f != ALONE}
        evals: dict[int, list[float]] = {f: [] for f in every if f != ALONE}
        for _ in range(rounds):
            alone_times.append([step_time(trial) for trial in trials.alone])
            alone_evals.append([eval_time(trial) for trial in trials.alone])
            for f, trial in every.items():
                if f != ALONE:
                    times[f].append(step_time(trial))
                    evals[f].append(eval_time(trial))
        profiles = {f: top_operators(t, top) for f, t in every.items() if f != ALONE} if top else {}
    rows = []
    for f in [ALONE, *trials.fused, *([FULL] if trials.full else [])]:
        if f == ALONE:  # one member alone: the mean over the configurations
            by_round = [StepTime(*(statistics.mean(getattr(s, k) for s in r) for k in ("cpu", "sys", "faults")))
                        for r in alone_times]
            base, ev, ev_base = [s.cpu for s in by_round], [statistics.mean(r) for r in alone_evals], None
        elif f == FULL:  # against one member alone at the measured size
            by_round, base = times[f], [statistics.mean(s.cpu for s in r) for r in alone_times]
            ev, ev_base = evals[f], [statistics.mean(r) for r in alone_evals]
        else:  # the fused step against its F members' steps alone
            by_round, base = times[f], [sum(s.cpu for s in r[:f]) for r in alone_times]
            ev, ev_base = evals[f], [sum(r[:f]) for r in alone_evals]
        cpu = [s.cpu for s in by_round]
        q1, median, q3 = statistics.quantiles(cpu, n=4) if rounds > 1 else [cpu[0]] * 3
        members = 1 if f in (ALONE, FULL) else f
        row = {"threads": threads, "size": size, "fusion": {ALONE: "alone", FULL: "full"}.get(f, f),
               "step_ms": 1e3 * median, "step_ms_q1": 1e3 * q1, "step_ms_q3": 1e3 * q3,
               "ratio": median / statistics.median(base), "ratio_by_round": [t / b for t, b in zip(cpu, base)],
               "sys_share": statistics.median(s.sys / s.cpu for s in by_round),
               "faults_per_step": statistics.median(s.faults for s in by_round),
               "eval_ms": 1e3 * statistics.median(ev),
               "eval_ratio": None if ev_base is None else statistics.median(ev) / statistics.median(ev_base),
               "data_ms_per_batch": data_ms,
               "ops_per_step": static[f][0], "flops_per_step": static[f][1],
               "flop_share": static[f][1] / (members * static[ALONE][1]), "top_operators": profiles.get(f, [])}
        if trials.full and f not in (ALONE, FULL):
            row["member_share_of_full"] = median / f / statistics.median(s.cpu for s in times[FULL])
        rows.append(row)
    return rows


def print_table(rows: list[dict], args: argparse.Namespace, load: list[float]) -> None:
    what = ("residual MLP, batch 64" if args.model == "mlp" else
            f"digits CNN {CNN_CHANNELS} channels, SGD, batch 64; size: scale S (members alone at 1/S width)")
    print(f"\n{what}, {_STEPS} steps per trial and round, {args.rounds} rounds; {os.cpu_count()} CPUs, load average "
          f"{load[0]:.1f} at the start, {load[1]:.1f} at the end\n")
    size = "width" if args.model == "mlp" else "S"
    print(f"{'threads':>7} {size:>5} {'F':>5} {'CPU ms/step (q1-q3)':>22} {'ratio':>6} {'ratio q1-q3':>12} "
          f"{'FLOP share':>10} {'sys':>5} {'faults':>7} {'aten ops':>8} {'eval ms':>8} {'eval ratio':>10} "
          f"{'member/full':>11}")
    for row in rows:
        ratios = row["ratio_by_round"]
        r1, _, r3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [row["ratio"]] * 3
        eval_ratio = "" if row["eval_ratio"] is None else f"{row['eval_ratio']:.2f}"
        share = f"1/{1 / row['member_share_of_full']:.1f}" if "member_share_of_full" in row else ""
        print(f"{row['threads']:7d} {row['size']:5d} {row['fusion']!s:>5} "
              f"{row['step_ms']:8.2f} ({row['step_ms_q1']:5.2f}-{row['step_ms_q3']:5.2f}) {row['ratio']:6.2f} "
              f"{r1:5.2f}-{r3:<5.2f} {row['flop_share']:10.2f} {row['sys_share']:5.2f} "
              f"{row['faults_per_step']:7.0f} {row['ops_per_step']:8d} {row['eval_ms']:8.1f} {eval_ratio:>10} "
              f"{share:>11}")
    print(f"\ndata: {rows[0]['data_ms_per_batch']:.3f} CPU ms per training batch read (shared by every member)")
    for row in rows:
        if row["top_operators"]:
            print(f"\n{'full-size' if row['fusion'] == 'full' else 'fused'} step, threads {row['threads']}, {size} "
                  f"{row['size']}, F {row['fusion']}: top operators (self ms per step, share)")
            for op in row["top_operators"]:
                print(f"  {op['self_ms_per_step']:7.2f} {op['share']:5.1%} {op['calls_per_step']:5.1f}x "
                      f"{op['op']} {op['shapes']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--fusions", type=counts, default=[1, 4, 11, 24], help="fusion counts F (mlp)")
    parser.add_argument("--widths", type=counts, default=[128, 512], help="the residual MLP's widths (mlp)")
    parser.add_argument("--cnn-cases", type=cases, default=[(8, 12), (4, 11)],
                        help="scale:fusion pairs of the digits CNN's fused surrogates (cnn)")
    parser.add_argument("--threads", type=counts, default=[1, 2], help="torch threads (a 1-CPU Ray trial: 1)")
    parser.add_argument("--rounds", type=at_least(1), default=7)
    parser.add_argument("--profile", type=at_least(0), default=0, metavar="K",
                        help="print the K operators of each fused step with the most CPU time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "fused_efficiency.json")
    args = parser.parse_args()
    if args.model == "mlp":
        sizes = [(w, lambda w=w: mlp_trials(w, args.fusions, args.seed)) for w in args.widths]
    else:
        sizes = [(s, lambda s=s, f=f: cnn_trials(s, [f], args.seed)) for s, f in args.cnn_cases]
    load = [os.getloadavg()[0]]
    rows = [row for threads in args.threads for size, build in sizes
            for row in measure(threads, size, build, args.rounds, args.profile)]
    load.append(os.getloadavg()[0])
    print_table(rows, args, load)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {**vars(args), "out": str(args.out)}, "steps_per_round": _STEPS,
                                    "load": load, "cpus": os.cpu_count(), "torch": torch.__version__,
                                    "python": sys.version.split()[0], "machine": platform.machine(), "rows": rows},
                                   indent=1))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
