"""End-to-end tuning: stock Ray Tune vs Hydro on the same member configurations.

N configurations of SGD (lr, momentum, weight decay) for a 64-1024-1024-10 MLP on scikit-learn's digits are
drawn once (random search, fixed seed) and tuned by
  (a) stock Ray Tune with ASHA, the reference: one full-size, unfused trial per configuration
      (BasicVariantGenerator replaying them), stopped early by ``ASHAScheduler`` as users run it: grace period 1
      epoch, reduction factor 2 (successive halving: rungs at 1, 2, 4, ... epochs; Tune's default factor is 4);
  (n) stock Ray Tune without early stopping: the same trials, every one for all epochs;
  (b) Hydro, fusion only (S=1): HydroSearcher with the same configurations in fused trials;
  (c) Hydro, S=8 + fusion;
  (d) Hydro with Optuna TPE as the inner searcher (N suggestions of its own; S=8);
  (e) Hydro with ``scale="auto"`` + fusion (the surrogate scale measured before Ray starts; random search).
``--scheduler`` is the early stopping of Hydro's runs (b)-(e) (default none); (a) and (n) run as above
whatever it says. The table gives every run's speed-up against (a) and against (n) (where run), and the stock
runs' mean epochs trained per configuration. All runs allow the same number of concurrent trials (``--concurrency``, default 2 = the cores). Each run's
best configuration is then trained at full size with one fixed seed (the "target"), and its validation
accuracy reported (for Hydro runs this repeats the run's own target trial: ``in_run_best`` is the
same number). Prints a table and writes JSON to ``benchmarks/results/e2e_tuning.json``; each run's ``stages`` (its
trials by stage: search, ladder rungs, target; members per trial, first start and last end, idle time before the
stage, and the seconds its trials spent starting fresh workers, in set-up (data, fusion planning, building the
members), training, evaluation and checkpoints, as the trials report them) say where its time went.

    python -m benchmarks.e2e_tuning [--quick] [--samples 64] [--epochs 15] [--hidden 1024] [--scheduler none|asha]
                                    [--runs nabcde] [--workload digits-mlp|cifar-resnet|resmlp-wide|digits-cnn|char-lm]
                                    [--device auto|cpu|cuda] [--gpus-per-trial G] [--target-seeds K]
                                    [--data-workers W] [--image-noise X] [--images N] [--large]

``--workload cifar-resnet``: a CIFAR-style ResNet-18 (SGD: lr, momentum, weight decay) on generated CIFAR-shaped
images (``hydro.examples.data.SyntheticImages``, a map-style Dataset loaded per batch), batch 128. ``--device``
sets ``TuneSpec.device``; with ``--gpus-per-trial G`` every trial (stock and Hydro) asks Ray for G GPUs
(fractions share one). The table adds each run's mean fraction of training time spent waiting for data and, where
NVML sees GPUs, their utilisation and energy over the run (read only). ``--image-noise``: the generated images'
per-pixel noise (at 1, the default, every run's best reaches 100%; at 6 configurations differ). ``--images``: its
training images (default 5,000). ``--large``: the larger cifar-resnet workload, where fixed costs matter less: 32
configurations, 15 epochs, 10,000 training images (e.g. ``--workload cifar-resnet --large --concurrency 8
--gpus-per-trial 0.125 --image-noise 6``).
``--workload resmlp-wide``: the overfitting AdamW pre-LN residual MLP of
``benchmarks/transfer_fidelity.py`` (lr, weight decay, beta1; width ``--hidden``) on its noisy synthetic tabular
task, where a surrogate can prefer a different validation optimum and a model-based searcher (d) could follow it.
``--target-seeds K``: each run's best configuration is trained K times (the spec's seed, as Hydro's target trial,
and the K - 1 after it), and the table gives the mean ± sample standard deviation (noisy workloads: one seed's
target can differ by about the difference it is meant to show).
``--workload digits-cnn``: ``hydro.tune.examples.digits_cnn`` (two conv blocks with BatchNorm, SGD: lr, momentum,
weight decay, on 8x8 digits) with ``CNN_CHANNELS`` channels instead of its 64/128, so that a full-size trial is
not all fixed cost on a CPU core (the digits are only 1,347 training images).
``--workload char-lm``: the causal character Transformer LM of ``benchmarks/transfer_fidelity.py`` (d=64, 8 heads,
2 layers; AdamW: lr, weight decay) on Python standard-library source; its metric is the validation loss (nats per
character, lower is better).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import sys
import threading
import time
from pathlib import Path

import ray
import torch
from ray import tune
from ray.tune.search.basic_variant import BasicVariantGenerator

from benchmarks.transfer_fidelity import char_lm_8_heads, residual_mlp
from hydro.cli_options import at_least
from hydro.tune.cluster.worker_env import worker_env_vars
from hydro.energy.device import EnergyError
from hydro.energy.nvml import nvml_devices
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan, plan_of
from hydro.trial.unit import FusedTrial
from hydro.tune import TuneSpec, best_configuration, trainable
from torch import nn

from hydro.examples.data import synthetic_cifar
from hydro.examples.models import CNN, ResNet18
from hydro.trial.spec import accuracy
from hydro.tune.examples import digits_cnn, digits_mlp
from hydro.tune.search.random_search import RandomSearch
from hydro.tune.run import asha, fit, optuna_tpe
from schedulers.transfer import Score

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--hidden", type=int, default=1024, help="hidden width of the full-size MLP")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--scheduler", choices=["none", "asha"], default="none",
                        help="early stopping of Hydro's runs (b)-(e); stock runs both with ASHA (a) and without (n)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="16 configurations, 3 epochs, width 256")
    parser.add_argument("--large", action="store_true",
                        help="cifar-resnet's larger workload: 32 configurations, 15 epochs, 10,000 training images")
    parser.add_argument("--images", type=at_least(1), default=5000,
                        help="cifar-resnet: generated training images (validation: 1,000)")
    parser.add_argument("--runs", default="nabcd",
                        help="which runs, e.g. 'acd' ((a), stock with ASHA, is the reference: always run)")
    parser.add_argument("--storage", default="/tmp/hydro_e2e")
    parser.add_argument("--workload", choices=WORKLOADS, default="digits-mlp")
    parser.add_argument("--device", default="auto", help="TuneSpec.device: auto (the GPU Ray gives a trial), cpu, cuda")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0, help="GPUs each trial asks Ray for")
    parser.add_argument("--image-noise", type=float, default=1.0,
                        help="cifar-resnet: per-pixel noise of the generated images (1: every run reaches 100%%)")
    parser.add_argument("--data-workers", type=at_least(0), default=0,
                        help="TuneSpec.data_workers: DataLoader processes per trial (cifar-resnet's Dataset)")
    parser.add_argument("--target-seeds", type=at_least(1), default=1,
                        help="seeds each run's best configuration is trained with at full size (mean ± spread)")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.epochs, args.hidden = 16, 3, 256
    if args.large:
        if args.workload != "cifar-resnet":
            parser.error("--large is cifar-resnet's larger workload: add --workload cifar-resnet")
        args.samples, args.epochs, args.images = 32, 15, 10_000
    spec, space = workload(args)
    spec.device, spec.data_workers = args.device, args.data_workers
    drawn = RandomSearch(space, seed=args.seed)
    configs = [drawn.suggest(str(i)) for i in range(args.samples)]
    ray.init(address="local", num_cpus=args.concurrency, include_dashboard=False,
             runtime_env={"env_vars": worker_env_vars(str(ROOT))})
    scheduler = (lambda: asha(spec)) if args.scheduler == "asha" else (lambda: None)
    hydro_options = dict(num_samples=args.samples, storage_path=args.storage, seed=args.seed, verbose=0,
                         max_concurrent_trials=args.concurrency, gpus_per_trial=args.gpus_per_trial)
    runs = [("(a) stock Ray Tune + ASHA, full size", 1, lambda: stock(spec, space, configs, args, asha(spec), "a")),
            ("(n) stock Ray Tune, no early stopping", 1, lambda: stock(spec, space, configs, args, None, "n")),
            ("(b) Hydro fusion only (S=1)", 1, lambda: hydro_run(spec, space, 1, None, scheduler(), hydro_options,
                                                                 args, "b", configs))]
    runs.append(("(c) Hydro S=8 + fusion", 8, lambda: hydro_run(spec, space, 8, None, scheduler(),
                                                                hydro_options, args, "c", configs)))
    runs.append(("(d) Hydro + Optuna TPE (S=8)", 8,
                 lambda: hydro_run(spec, space, 8, optuna_tpe(args.seed), scheduler(), hydro_options, args, "d")))
    runs.append(("(e) Hydro scale='auto' + fusion", "auto", lambda: hydro_run(spec, space, "auto", None, scheduler(),
                                                                             hydro_options, args, "e", configs)))
    rows = []
    runs = [r for r in runs if r[0][1] in "a" + args.runs]
    for name, scale, run in runs:
        print(f"\n=== {name}", flush=True)
        start, started_at = time.perf_counter(), time.time()
        with GpuUsage() as gpu:
            best_config, in_run, data_wait, results = run()
        wall = time.perf_counter() - start
        target = Score.of(train_full_size(spec, best_config, mup=scale != 1, seed=spec.seed + i)[spec.metric]
                          for i in range(args.target_seeds)) or Score(math.nan, math.nan, 0)  # (none finite)
        timeline = stages(results, started_at)
        rows.append({"run": name, "wall_s": wall, "best_config": best_config, "in_run_best": in_run,
                     "epochs_per_config": epochs_per_config(results) if name.startswith(STOCK) else None,
                     "target_" + spec.metric: target.mean, "target_spread": target.spread,
                     "target_seeds": target.count, "data_wait_fraction": data_wait, "stages": timeline,
                     "gpu_util_pct": gpu.util_pct, "gpu_energy_j": gpu.energy_j})
        print(f"{name}: {wall:.0f} s, best {best_config}, target {spec.metric} {target}", flush=True)
        print("  stages (seconds after the run's start; time summed over each stage's trials):\n"
              + _stage_table(timeline), flush=True)
    ray.shutdown()
    report(rows, spec, args)
    return 0


class GpuUsage:
    """The machine's GPUs over a block, read (never set) through NVML: ``util_pct``, the mean over GPUs and
    samples (every ``interval_s``) of the share of time a kernel ran, in %; ``energy_j``, their energy in J.
    Both ``None`` on a machine without NVML GPUs."""

    def __init__(self, interval_s: float = 0.5) -> None:
        try:
            self._gpus = nvml_devices()
        except EnergyError:
            self._gpus = []
        self.interval_s, self.util_pct, self.energy_j = interval_s, None, None
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.extend(gpu.utilization_pct() for gpu in self._gpus)

    def __enter__(self) -> GpuUsage:
        if self._gpus:
            self._energy_start = sum(gpu.energy_j() for gpu in self._gpus)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._gpus:
            self._stop.set()
            self._thread.join()
            self.energy_j = sum(gpu.energy_j() for gpu in self._gpus) - self._energy_start
            self.util_pct = sum(self._samples) / len(self._samples) if self._samples else None
            for gpu in self._gpus:
                gpu.close()


WORKLOADS = ("digits-mlp", "cifar-resnet", "resmlp-wide", "digits-cnn", "char-lm")  # --workload's choices


def workload(args: argparse.Namespace) -> tuple[TuneSpec, dict]:
    """The ``--workload``'s spec and param space."""
    if args.workload == "digits-mlp":
        return digits_mlp(epochs=args.epochs, hidden=args.hidden)
    if args.workload == "resmlp-wide":
        return residual_mlp(epochs=args.epochs, width=args.hidden)
    if args.workload == "digits-cnn":
        return wide_digits_cnn(args.epochs)
    if args.workload == "char-lm":
        return char_lm_8_heads(args.epochs)
    return cifar_resnet(args.epochs, args.image_noise, args.images)


CNN_CHANNELS = (256, 512)  # digits-cnn's full-size channels: one trial of 8 epochs about 20-30 s on one core


def wide_digits_cnn(epochs: int, channels: tuple[int, int] = CNN_CHANNELS) -> tuple[TuneSpec, dict]:
    """``hydro.tune.examples.digits_cnn`` (its data, SGD optimizer, space and metric) with ``channels`` in its two
    conv blocks."""
    spec, space = digits_cnn(epochs)
    return dataclasses.replace(spec, model=functools.partial(_cnn, channels)), space


def _cnn(channels: tuple[int, int], config: dict) -> nn.Module:
    return CNN(channels=channels)


def cifar_resnet(epochs: int, noise: float = 1.0, images: int = 5000) -> tuple[TuneSpec, dict]:
    """CIFAR-style ResNet-18 on ``images`` generated CIFAR-shaped training images (and 1,000 validation images;
    per-pixel ``noise``), SGD; validation accuracy."""
    spec = TuneSpec(model=_resnet, data=functools.partial(synthetic_cifar, train=images, noise=noise),
                    loss=nn.CrossEntropyLoss(),
                    optimizer=_sgd, metric="val_acc", mode="max", metrics={"val_acc": accuracy}, epochs=epochs,
                    batch_size=128)
    return spec, {"lr": tune.loguniform(1e-3, 0.5), "momentum": tune.choice([0.0, 0.5, 0.9]),
                  "weight_decay": tune.choice([0.0, 1e-4, 5e-4])}


def _resnet(config: dict) -> nn.Module:
    return ResNet18()


def _sgd(params, config: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"], weight_decay=config["weight_decay"])


def data_wait_fraction(results) -> float:
    """Mean over a run's trials of the fraction of training time spent waiting for batches."""
    values = [r.metrics["data_wait_fraction"] for r in results if r.metrics and "data_wait_fraction" in r.metrics]
    return sum(values) / len(values) if values else float("nan")


TIMES = ("worker_start_s", "setup_data_s", "setup_plan_s", "setup_build_s", "train_s", "eval_s", "checkpoint_s")


def stages(results: tune.ResultGrid, started_at: float) -> list[dict]:
    """Where a run's wall time went: its trials by start, consecutive ones of the same kind and scale as one
    stage, with their member counts, ``new_workers`` (its trials that started a fresh worker process; the others
    ran in a warm one, reused from an earlier trial), the stage's first start and last end in seconds after ``started_at`` (a
    trial starts when its worker process starts (at the earliest ``started_at``) if it is that worker's first
    trial, else when the trial function starts; it ends at its last report), the seconds its trials spent (summed over them) in each of ``TIMES``:
    starting a fresh worker, set-up (data on the device, in-trial fusion planning, building the members),
    training, evaluation and checkpoints (those before each trial's last report), and ``idle_before_s``: seconds
    between the previous stage's last end and this stage's first start, when none of the run's trials ran."""
    trials = []
    for r in results:
        if not r.metrics or "trial_started_at" not in r.metrics:
            continue
        m, plan = r.metrics, plan_of(r.config)
        stage = f"S={plan.scale}" if plan.kind == TrialKind.SURROGATE else plan.kind.value
        fresh = m["worker_trials"] == 1
        worker = max(m["worker_started_at"], started_at)  # Ray may start idle workers before the run
        times = {"worker_start_s": m["trial_started_at"] - worker if fresh else 0.0,
                 **{name: m.get(name, 0.0) for name in TIMES[1:]}}
        start = (worker if fresh else m["trial_started_at"]) - started_at
        trials.append((start, m["reported_at"] - started_at, stage, len(plan.members), times, fresh))
    timeline: list[dict] = []
    for start, end, stage, members, times, fresh in sorted(trials, key=lambda t: t[:2]):
        if not timeline or timeline[-1]["stage"] != stage:
            previous_end = max((s["end_s"] for s in timeline), default=0.0)
            timeline.append({"stage": stage, "members": [], "start_s": start, "end_s": end, "new_workers": 0,
                             "idle_before_s": max(0.0, start - previous_end), **{name: 0.0 for name in TIMES}})
        last = timeline[-1]
        last["members"].append(members)
        last["new_workers"] += fresh
        last["end_s"] = max(last["end_s"], end)
        for name, seconds in times.items():
            last[name] += seconds
    return timeline


def _stage_table(timeline: list[dict]) -> str:
    """The stages as printed table rows (seconds summed over each stage's trials)."""
    header = (f"    {'stage':<8} {'trials':>6} {'members':>7} {'start':>7} {'end':>7} {'idle before':>11} "
              f"{'new':>3} {'worker':>7} {'data':>6} {'plan':>6} {'build':>6} {'train':>7} {'eval':>6} {'ckpt':>6}")
    rows = [f"    {s['stage']:<8} {len(s['members']):6d} {sum(s['members']):7d} {s['start_s']:7.1f} {s['end_s']:7.1f} "
            f"{s['idle_before_s']:11.1f} {s['new_workers']:3d} {s['worker_start_s']:7.1f} {s['setup_data_s']:6.1f} "
            f"{s['setup_plan_s']:6.1f} "
            f"{s['setup_build_s']:6.1f} {s['train_s']:7.1f} {s['eval_s']:6.1f} {s['checkpoint_s']:6.1f}"
            for s in timeline]
    return "\n".join([header, *rows])


STOCK = ("(a)", "(n)")  # the stock runs' name prefixes


def epochs_per_config(results: tune.ResultGrid) -> float:
    """Mean over a stock run's trials of the epochs each trained (its last ``training_iteration``)."""
    epochs = [r.metrics["training_iteration"] for r in results if r.metrics]
    return sum(epochs) / len(epochs) if epochs else math.nan


def stock(spec: TuneSpec, space: dict, configs: list[dict], args, scheduler,
          name: str) -> tuple[dict, float, float, tune.ResultGrid]:
    """Stock Ray Tune: every configuration as its own full-size trial of the same trainable (``scheduler``: its
    early stopping, ``None`` for none); ``name``: the run's experiment name under ``--storage``."""
    tuner = tune.Tuner(
        trainable(spec, gpus_per_trial=args.gpus_per_trial), param_space=space,
        tune_config=tune.TuneConfig(search_alg=BasicVariantGenerator(points_to_evaluate=list(configs)),
                                    num_samples=len(configs), metric=spec.metric, mode=spec.mode, reuse_actors=True,
                                    max_concurrent_trials=args.concurrency, scheduler=scheduler),
        run_config=tune.RunConfig(storage_path=args.storage, name=f"stock-{name}", verbose=0),
    )
    results = tuner.fit()
    assert sorted(map(repr, (r.config for r in results))) == sorted(map(repr, configs))
    best = results.get_best_result()
    return {k: best.config[k] for k in space}, best.metrics[spec.metric], data_wait_fraction(results), results


def hydro_run(spec: TuneSpec, space: dict, scale: int | str, searcher, scheduler, options: dict, args, name: str,
              configs: list[dict] | None = None) -> tuple[dict, float, float, tune.ResultGrid]:
    """HydroSearcher over the same space (``scale`` an int or ``"auto"``); with ``searcher=None`` its seeded random
    search draws exactly ``configs`` (checked). ``fit`` puts at most N / concurrency members in one fused trial of
    the search (its trial slots), so as many trials as (a) can run at once."""
    results, hydro_searcher = fit(spec, space, scale=scale, fusion="auto", searcher=searcher, scheduler=scheduler,
                                  name=name, **options)
    if hydro_searcher.scale_choice is not None:
        print(f"  scale='auto' chose S={hydro_searcher.scale}: {hydro_searcher.scale_choice.reason}", flush=True)
    if configs is not None:
        plans = [plan_of(r.config) for r in results if r.config]  # the search's trials (not the width ladder's)
        members = [c for p in plans if p.fused and p.scale == hydro_searcher.scale for _, c in p.members]
        assert sorted(map(repr, members)) == sorted(map(repr, configs))
    best = best_configuration(results, spec)
    return best["config"], best["value"], data_wait_fraction(results), results


def train_full_size(spec: TuneSpec, config: dict, mup: bool, seed: int) -> dict[str, float]:
    """The full-size target trained with ``config`` as Hydro's target trial trains it (``seed``): in µP
    (``hydro.shrink(model, 1)``) after a shrunk run, as written otherwise."""
    spec = dataclasses.replace(spec, seed=seed)
    target = FusedTrial(spec, TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], mup=mup), spec.load_data())
    for _ in range(spec.epochs):
        target.train_epoch()
    return {k: float(v[0]) for k, v in target.evaluate().items()}


def add_speedups(rows: list[dict]) -> dict:
    """Set each row's ``speedup_vs_a`` (the first row's, stock with ASHA's, wall time over its own) and
    ``speedup_vs_n`` (stock without early stopping's over its own; ``None`` when (n) did not run). Returns the
    first row."""
    base = rows[0]
    no_stopping = next((row for row in rows if row["run"].startswith("(n)")), None)
    for row in rows:
        row["speedup_vs_a"] = base["wall_s"] / row["wall_s"]
        row["speedup_vs_n"] = None if no_stopping is None else no_stopping["wall_s"] / row["wall_s"]
    return base


def report(rows: list[dict], spec: TuneSpec, args) -> None:
    metric = "target_" + spec.metric
    base = add_speedups(rows)
    print(f"\n{args.workload}: N={args.samples} configurations, {args.epochs} epochs, (a) stock with ASHA (grace 1, "
          f"reduction factor 2), Hydro's scheduler={args.scheduler}, "
          f"target seeds={args.target_seeds}, "
          f"concurrency={args.concurrency}, device={args.device}, gpus/trial={args.gpus_per_trial}, {os.cpu_count()} "
          f"CPUs (load average at the end: {os.getloadavg()[0]:.1f})\n")
    print(f"{'run':<42} {'wall s':>7} {'vs (a)':>8} {'vs (n)':>8} {'epochs':>6} {'in-run best':>11} {metric:>15} "
          f"{'vs (a) +:better':>15} {'data wait':>9} {'GPU util':>8} {'GPU kJ':>8}  best configuration")
    for row in rows:
        sign = 1 if spec.mode == "max" else -1  # positive: better than (a)'s configuration
        row["relative_to_a"] = sign * (row[metric] - base[metric]) / abs(base[metric])
        config = ", ".join(f"{k}={v:.3g}" for k, v in row["best_config"].items())
        kilojoules = None if row["gpu_energy_j"] is None else row["gpu_energy_j"] / 1e3
        target = f"{row[metric]:.4f}" + (f" ± {row['target_spread']:.4f}" if row["target_seeds"] > 1 else "") + \
            (f" (n={row['target_seeds']})" if row["target_seeds"] < args.target_seeds else "")  # diverged seeds
        print(f"{row['run']:<42} {row['wall_s']:7.0f} {row['speedup_vs_a']:7.2f}x {_shown(row['speedup_vs_n'], '.2f', 'x')} "
              f"{_shown(row['epochs_per_config'], '.1f', '', 6)} {row['in_run_best']:11.4f} "
              f"{target:>15} {row['relative_to_a']:+15.2%} {row['data_wait_fraction']:9.1%} "
              f"{_shown(row['gpu_util_pct'], '.0f', '%')} {_shown(kilojoules, '.1f', '')}  {config}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / ("e2e_tuning.json" if args.hidden == 1024 else f"e2e_tuning_hidden{args.hidden}.json")
    if args.workload != "digits-mlp" or args.device != "auto":
        out = out.with_name(f"e2e_tuning_{args.workload}_{args.device}.json")
    if args.workload == "cifar-resnet" and args.images != 5000:
        out = out.with_name(f"{out.stem}_images{args.images}.json")
    if args.seed:
        out = out.with_name(f"{out.stem}_seed{args.seed}.json")
    out.write_text(json.dumps({"args": vars(args), "baseline": "(a) stock Ray Tune with ASHA: grace 1, reduction factor 2",
                               "python": sys.version.split()[0], "torch": torch.__version__,
                               "ray": ray.__version__, "machine": platform.machine(), "rows": rows},
                              indent=2, default=str))
    print(f"\nwritten: {out}")


def _shown(value: float | None, spec: str, unit: str, width: int = 8) -> str:
    """``value`` formatted for the table, right-aligned in ``width`` columns; ``-`` when not measured."""
    return f"{'-' if value is None else format(value, spec) + unit:>{width}}"


if __name__ == "__main__":
    sys.exit(main())
