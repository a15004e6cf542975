"""Optimus convergence model on the bundled tuning examples: predicted final loss vs actual, and the
ConvergenceStopping rule replayed against ASHA and no stopping.

Each example (``hydro tune --example``) trains ``--configs`` random configurations of its search space as one
fused trial for a fixed number of epochs (CPU), recording every member's training loss, validation loss and
tuned metric per epoch. Then (1) each member's loss curve (training loss: what Optimus models; validation loss)
fitted on its first k epochs predicts the last epoch's value: median relative error, the share of actual values
inside ±2σ (the interval's coverage; 95% if calibrated and Gaussian), the median 2σ relative to the actual value
(the interval's half-width), the coverage of the bootstrap (noise) part alone, and the "last value stays"
baseline;
(2) the recorded curves are replayed through the member-stopping rules: member-epochs trained, and the best
final metric among the members that ran to the end (the tuning result).

    python benchmarks/convergence_prediction.py [--examples digits-mlp digits-cnn char-lm] [--configs 8]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TRAIN_LOSS, VAL_LOSS
from hydro.trial.unit import FusedTrial
from hydro.tune.examples import EXAMPLES
from schedulers.member_stopping import ASHA, ConvergenceStopping, MemberStopping, StoppingRule
from schedulers.prediction.convergence import fit_curve

EPOCHS = {"digits-mlp": 20, "digits-cnn": 12, "char-lm": 6}
FIT_POINTS = (3, 5, 8)


def record(name: str, epochs: int, configs: int, seed: int) -> tuple[dict[str, dict[str, list[float]]],
                                                                     dict[str, list[float]], str, str]:
    """Per loss (training, validation) and member: values per epoch; per member: the tuned metric per epoch;
    the metric's name and mode."""
    spec, space = EXAMPLES[name](epochs)
    rng = np.random.default_rng(seed)
    members = [(f"m{i}", {k: d.sample(random_state=rng) for k, d in space.items()}) for i in range(configs)]
    trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, members), spec.load_data())
    losses = {loss: {m: [] for m, _ in members} for loss in (TRAIN_LOSS, VAL_LOSS)}
    metric = {m: [] for m, _ in members}
    for _ in range(epochs):
        values = trial.run_epoch()
        for i, member in enumerate(trial.member_ids):
            for loss, curves in losses.items():
                curves[member].append(float(values[loss][i]))
            metric[member].append(float(values[spec.metric][i]))
    return losses, metric, spec.metric, spec.mode


def prediction_rows(name: str, loss: str, losses: dict[str, list[float]], epochs: int) -> list[dict]:
    rows = []
    for points in (p for p in FIT_POINTS if p < epochs):
        errors, baseline, widths, covered, noise_covered, skipped = [], [], [], 0, 0, 0
        for curve in losses.values():
            if not all(math.isfinite(v) for v in curve):
                skipped += 1
                continue
            fit = fit_curve(range(1, points + 1), curve[:points], floor=0.0)
            predicted, actual = fit.value(epochs), curve[-1]
            errors.append(abs(predicted.value - actual) / actual)
            baseline.append(abs(curve[points - 1] - actual) / actual)
            low, high = predicted.bound(2)
            covered += low <= actual <= high
            widths.append(2 * predicted.std / actual)
            low, high = dataclasses.replace(fit, model_error=0.0).value(epochs).bound(2)
            noise_covered += low <= actual <= high
        rows.append({"example": name, "loss": loss, "fit_epochs": points, "final_epoch": epochs, "members": len(errors),
                     "diverged": skipped, "median_error": statistics.median(errors),
                     "last_value_error": statistics.median(baseline), "within_2sigma": covered / len(errors),
                     "within_2sigma_noise_only": noise_covered / len(errors),
                     "median_2sigma": statistics.median(widths)})
    return rows


def replay(rule: StoppingRule | None, metric: dict[str, list[float]], mode: str, epochs: int) -> tuple[int, float]:
    """(member-epochs trained, best final metric of the members that reached the last epoch)."""
    stopping = MemberStopping(rule, mode)
    trained, alive, finals = 0, set(metric), {}
    for epoch in range(1, epochs + 1):
        for member in sorted(alive):
            trained += 1
            value = metric[member][epoch - 1]
            if epoch == epochs:
                stopping.decide(member, epoch, value, final=True)
                finals[member] = value
            elif stopping.decide(member, epoch, value):
                alive.discard(member)
    finite = [v for v in finals.values() if math.isfinite(v)]
    return trained, (max(finite) if mode == "max" else min(finite)) if finite else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(prog="convergence_prediction")
    parser.add_argument("--examples", nargs="+", default=list(EPOCHS), choices=list(EXAMPLES))
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    predictions, replays = [], []
    for name in args.examples:  # each example's tables as soon as it is done
        epochs, t0 = EPOCHS[name], time.perf_counter()
        losses, metric, metric_name, mode = record(name, epochs, args.configs, args.seed)
        rows = [r for loss, curves in losses.items() for r in prediction_rows(name, loss, curves, epochs)]
        rules = {"none": None, "ASHA(rf=4, grace=1)": ASHA(max_t=epochs, grace_period=1, reduction_factor=4),
                 "Convergence(z=2)": ConvergenceStopping(max_t=epochs, grace_period=3, z=2.0)}
        full, _ = replay(None, metric, mode, epochs)
        replayed = []
        for label, rule in rules.items():
            trained, best = replay(rule, metric, mode, epochs)
            replayed.append({"example": name, "metric": metric_name, "rule": label, "member_epochs": trained,
                             "share_of_full": trained / full, "best_final": best})
        print(f"\n{name}: {args.configs} configs x {epochs} epochs trained in {time.perf_counter() - t0:.0f} s; "
              f"load average {os.getloadavg()}")
        print_tables(rows, replayed)
        predictions += rows
        replays += replayed
    total = sum(r["members"] for r in predictions)
    for key, label in (("within_2sigma", "noise + model error"), ("within_2sigma_noise_only", "noise only")):
        covered = sum(r[key] * r["members"] for r in predictions)
        print(f"all predictions, ±2σ of {label}: {covered:.0f} of {total} actual final losses inside "
              f"({covered / total:.0%})")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "convergence_prediction.json"
    out.write_text(json.dumps({"meta": {"configs": args.configs, "seed": args.seed, "load_average": os.getloadavg(),
                                        "seconds": time.perf_counter() - started},
                               "predictions": predictions, "replays": replays}, indent=2))
    print(f"wrote {out}")


def print_tables(predictions: list[dict], replays: list[dict]) -> None:
    print("predicted final loss (fit on the first k epochs)")
    print(f"{'example':<12} {'loss':<10} {'k':>3} {'final':>6} {'n':>3} {'div.':>5} {'median err':>11} "
          f"{'last-value err':>15} {'in ±2σ':>7} {'2σ/actual':>10} {'noise only':>11}")
    for r in predictions:
        print(f"{r['example']:<12} {r['loss']:<10} {r['fit_epochs']:>3} {r['final_epoch']:>6} {r['members']:>3} "
              f"{r['diverged']:>5} {r['median_error']:>11.1%} {r['last_value_error']:>15.1%} "
              f"{r['within_2sigma']:>7.0%} {r['median_2sigma']:>10.1%} {r['within_2sigma_noise_only']:>11.0%}")
    print("member-stopping rules replayed on the recorded curves")
    print(f"{'example':<12} {'rule':<22} {'member-epochs':>14} {'of full':>8} {'best final':>11}")
    for r in replays:
        print(f"{r['example']:<12} {r['rule']:<22} {r['member_epochs']:>14} {r['share_of_full']:>8.0%} "
              f"{r['best_final']:>11.4f} {r['metric']}", flush=True)


if __name__ == "__main__":
    main()
