"""Epochs per second of one fused trial on a small in-memory dataset, by how its epochs get their data.

The workload is ``hydro tune --example digits-mlp``'s (scikit-learn's digits, a 64-hidden-hidden-10 MLP, SGD), one
fused trial of ``--members`` members at ``--scale``, on the CPU. In one process, interleaved round by round (so
machine load hits every variant alike), each variant trains ``--epochs`` epochs from the same start:
  loader    the splits as a map-style ``TensorDataset`` read through ``DataLoader``s (one per epoch and per
            evaluation): the path of a ``Dataset`` split;
  tensors   the same ``TensorDataset`` splits, taken as their tensors (index selections, no loader): what Hydro
            does with a ``TensorDataset`` or ``(inputs, targets)``; must train the same weights bit for bit
            (checked here);
  last-eval the tensors, evaluating only the last epoch (a ladder rung's ``TrialPlan.final_score_only``); the same
            weights and last scores (checked here).
Prints a table (epochs/s, ratio to ``loader``) and writes ``benchmarks/results/epoch_data.json`` with the load
average (``uptime``) before and after.

    python -m benchmarks.epoch_data [--members 16] [--scale 8] [--hidden 512] [--epochs 3] [--rounds 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import torch
from torch.utils.data import TensorDataset

from benchmarks.setup_cost import report
from hydro.trial.data import DatasetSource
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune.examples import digits_mlp

VARIANTS = ("loader", "tensors", "last-eval")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--scale", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial's CPUs)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    spec, _ = digits_mlp(epochs=args.epochs, hidden=args.hidden)
    (x, y), (vx, vy) = ((split.x, split.y) if hasattr(split, "x") else split for split in spec.data())
    configs = [{"lr": 0.01 * (i + 1), "momentum": 0.9, "weight_decay": 0.0} for i in range(args.members)]
    plan = TrialPlan(TrialKind.SURROGATE, [(f"m{i}", c) for i, c in enumerate(configs)], args.scale, mup=True)
    splits = {"loader": lambda: (DatasetSource(TensorDataset(x, y)), DatasetSource(TensorDataset(vx, vy))),
              "tensors": lambda: (TensorDataset(x, y), TensorDataset(vx, vy))}
    splits["last-eval"] = splits["tensors"]
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        results = {}
        for variant in VARIANTS:
            torch.manual_seed(0)
            trial = FusedTrial(spec, plan, splits[variant](), device="cpu")
            start = time.perf_counter()
            metrics = [trial.run_epoch(evaluate=variant != "last-eval" or epoch == args.epochs)
                       for epoch in range(1, args.epochs + 1)]
            times[variant].append(time.perf_counter() - start)
            results[variant] = trial.members.model.state_dict(), metrics[-1]
        _check_equal(results)
    per_epoch = {v: statistics.median(times[v]) / args.epochs for v in VARIANTS}
    rows = [{"variant": v, "epochs_per_s": 1 / per_epoch[v], "speedup": per_epoch["loader"] / per_epoch[v]}
            for v in VARIANTS]
    report("epoch_data", f"epochs of one fused trial ({args.members} members, S={args.scale}, {len(y)} training "
           f"samples), {args.rounds} interleaved rounds (medians), {args.threads} torch thread(s)",
           [("variant", "variant", "<12"), ("epochs_per_s", "epochs/s", "9.2f"), ("speedup", "x loader", "9.2f")],
           rows, {"args": vars(args), "times": times}, load_before)
    return 0


def _check_equal(results: dict) -> None:
    weights, metrics = results["loader"]
    for variant, (got, last) in results.items():
        if not all(torch.equal(got[k], v) for k, v in weights.items()) or \
                not all(torch.equal(last[k], v) for k, v in metrics.items()):
            raise AssertionError(f"epoch_data: {variant} trained other weights or scores than the loader")


if __name__ == "__main__":
    sys.exit(main())
