"""Simulated mixed cluster running a stream of tuning jobs: (a) Ray's type-oblivious placement, (b)
heterogeneity-aware placement, (c) (b) + elastic merge of survivors and release of freed GPUs.

Cluster: 2 H100 + 2 A100 + 4 V100, relative throughput 3.5 : 2.2 : 1 (round numbers in line with NVIDIA's
published training results) and the same 8 ms per-step overhead (``schedulers.placement.cluster``). Jobs
(``schedulers.placement.simulator.job_stream``): 16 per run, Poisson arrivals; each tunes 32 configurations as
S=8 µP surrogates fused 8 per trial with successive halving (rungs 1, 3, 9, 27 epochs, reduction 3; 2000 steps
per epoch; a full-size step is 0.25 s on a V100) and then trains the best configuration at full size for 27
epochs. Stopping depends on the job's trace only, so all policies tune to the same best configuration with the
same member-epochs per job (checked). (b) and (c) place by earliest predicted finish
(``EarliestFinish``): a trial goes to the GPU type on which it would finish first, counting the predicted wait
for a busy GPU of that type behind the trials queued ahead of it. For reference, (b0) and (c0) are the
previous greedy-gain placement (``HeterogeneityAware``: fastest free GPUs to the trials that gain most; a trial
waits, at most 30 min, for a GPU on which it runs at >= 50% of its best speed). Three loads (mean inter-arrival
10, 15, 30 min), ``--seeds`` streams each; means reported. Then (c)'s sensitivity to prediction error: each
trial's predicted run time missed by a lognormal factor (σ of its log 0.15, 0.3, 0.5).

    python benchmarks/cluster_placement.py [--seeds 5] [--jobs 16] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from schedulers.placement.cluster import A100, H100, V100, Cluster
from schedulers.placement.policies import (EarliestFinish, ElasticEarliestFinish, ElasticHeterogeneityAware,
                                           HeterogeneityAware, TypeOblivious)
from schedulers.placement.simulator import job_stream, simulate

CLUSTER = Cluster.of((H100, 2), (A100, 2), (V100, 4))
LOADS = {"high (10 min)": 600.0, "medium (15 min)": 900.0, "low (30 min)": 1800.0}
POLICIES = {
    "(a) type-oblivious (Ray)": TypeOblivious,
    "(b0) greedy gain": lambda: HeterogeneityAware(min_efficiency=0.5),
    "(c0) (b0) + elastic merge": lambda: ElasticHeterogeneityAware(min_efficiency=0.5),
    "(b) earliest finish": EarliestFinish,
    "(c) (b) + elastic merge": ElasticEarliestFinish,
}
ERRORS = (0.15, 0.3, 0.5)
METRICS = ("gpu_hours", "makespan_s", "mean_queueing_s", "mean_jct_s")


def main() -> None:
    parser = argparse.ArgumentParser(prog="cluster_placement")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    started = time.perf_counter()
    rows, timelines = [], {}
    for load, interarrival in LOADS.items():
        for seed in range(args.seeds):
            jobs = job_stream(args.jobs, seed=seed, mean_interarrival_s=interarrival, steps_per_epoch=2000)
            results = {name: simulate(CLUSTER, jobs, make(), name) for name, make in POLICIES.items()}
            tuned = {(tuple(r.best_configs), tuple(r.member_epochs)) for r in results.values()}
            if len(tuned) != 1:
                raise AssertionError(f"policies tuned differently (best configurations, member-epochs): {tuned}")
            for name, result in results.items():
                rows.append({"load": load, "seed": seed, **result.to_dict()})
                if seed == 0 and load == "medium (15 min)":
                    timelines[name] = result.busy
    table = []
    for load in LOADS:
        means = {name: {m: float(np.mean([r[m] for r in rows if r["load"] == load and r["policy"] == name]))
                        for m in METRICS} for name in POLICIES}
        base = means[next(iter(POLICIES))]
        for name, mean in means.items():
            by_type = {gpu: float(np.mean([r["gpu_seconds_by_type"][gpu] for r in rows
                                           if r["load"] == load and r["policy"] == name])) / 3600
                       for gpu in CLUSTER.counts}
            table.append({"load": load, "policy": name, **mean, "gpu_hours_by_type": by_type,
                          **{f"{m}_vs_a": mean[m] / base[m] - 1 for m in METRICS}})
    print(f"cluster {dict(CLUSTER.counts)}; {args.jobs} jobs x {args.seeds} seeds per load; same best configuration "
          f"and member-epochs under every policy: yes; {time.perf_counter() - started:.1f} s")
    print(f"{'load':<16} {'policy':<26} {'GPU-hours':>10} {'vs (a)':>7} {'makespan h':>11} {'vs (a)':>7} "
          f"{'queue min':>10} {'JCT h':>7} {'vs (a)':>7}  GPU-hours on {'/'.join(CLUSTER.counts)}")
    for r in table:
        print(f"{r['load']:<16} {r['policy']:<26} {r['gpu_hours']:>10.1f} {r['gpu_hours_vs_a']:>+7.0%} "
              f"{r['makespan_s'] / 3600:>11.2f} {r['makespan_s_vs_a']:>+7.0%} {r['mean_queueing_s'] / 60:>10.1f} "
              f"{r['mean_jct_s'] / 3600:>7.2f} {r['mean_jct_s_vs_a']:>+7.0%}  "
              + "/".join(f"{h:.1f}" for h in r["gpu_hours_by_type"].values()))
    sweep = sensitivity(args.jobs, args.seeds)
    print("\nsensitivity of (c) to prediction error (σ of log(predicted / actual run time) per trial): change vs (a)")
    print(f"{'load':<16} {'σ':>5} {'GPU-hours':>10} {'makespan':>9} {'JCT':>6}")
    for r in sweep:
        print(f"{r['load']:<16} {r['prediction_error']:>5.2f} {r['gpu_hours_vs_a']:>+10.0%} "
              f"{r['makespan_s_vs_a']:>+9.0%} {r['mean_jct_s_vs_a']:>+6.0%}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "cluster_placement.json"
    out.write_text(json.dumps({"cluster": dict(CLUSTER.counts), "loads": LOADS, "table": table, "sensitivity": sweep,
                               "runs": rows}, indent=2))
    print(f"wrote {out}")
    print(f"wrote {plot(table, timelines, args.out / 'cluster_placement.png')}")


def sensitivity(jobs: int, seeds: int) -> list[dict]:
    """(c) with its predicted run times missed by a lognormal factor per trial (σ in ``ERRORS``), relative to
    (a), mean over seeds."""
    rows = []
    for load, interarrival in LOADS.items():
        streams = [job_stream(jobs, seed=s, mean_interarrival_s=interarrival, steps_per_epoch=2000)
                   for s in range(seeds)]
        base = [simulate(CLUSTER, stream, TypeOblivious()) for stream in streams]
        for error in ERRORS:
            runs = [simulate(CLUSTER, stream, ElasticEarliestFinish(), prediction_error=error, seed=s)
                    for s, stream in enumerate(streams)]
            rows.append({"load": load, "prediction_error": error, **{
                f"{m}_vs_a": float(np.mean([getattr(r, m) for r in runs]) / np.mean([getattr(r, m) for r in base]) - 1)
                for m in METRICS}})
    return rows


def plot(table: list[dict], timelines: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    loads, names = list(LOADS), list(POLICIES)
    width = 0.8 / len(names)
    for ax, (metric, label, scale) in zip(axes, [("gpu_hours", "GPU-hours", 1), ("makespan_s", "makespan (h)", 3600),
                                                 ("mean_queueing_s", "mean queueing delay (min)", 60)]):
        for k, name in enumerate(names):
            values = [next(r[metric] for r in table if r["load"] == load and r["policy"] == name) / scale
                      for load in loads]
            ax.bar(np.arange(len(loads)) + k * width, values, width, label=name)
        ax.set_xticks(np.arange(len(loads)) + width * (len(names) - 1) / 2, loads, fontsize=8)
        ax.set_title(label)
    axes[0].legend(fontsize=7)
    for name, busy in timelines.items():
        t, held = zip(*busy)
        axes[3].step(np.array(t) / 3600, held, where="post", label=name)
    axes[3].set_title("GPUs held (medium load, seed 0)")
    axes[3].set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


if __name__ == "__main__":
    main()
