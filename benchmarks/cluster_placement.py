"""Simulated mixed cluster running a stream of tuning jobs: (a) Ray's type-oblivious placement, (b)
heterogeneity-aware placement, (c) (b) + elastic merge of survivors and release of freed GPUs.

Cluster: 2 H100 + 2 A100 + 4 V100, true relative throughput 3.5 : 2.2 : 1 (round numbers in line with NVIDIA's
published training results) and the same 8 ms per-step overhead (``schedulers.placement.cluster``) — assumed
constants of the simulated cluster. The earliest-finish policies (b) and (c) place by *learned* speeds
(``--speeds learned``, the default), as the product does: they start from a prior per type (``--prior uniform``,
the default: every type alike at the V100's rate — a type-oblivious prior; ``published``: the ratios above, the
product's ``prior_type``) and correct each type by the step times the trials that ran on it measured so far
(``schedulers.placement.learned_speeds``, the rule of ``PredictedFinish``), while the trials run at the true
speeds; ``--speeds known`` gives them the true speeds, and the table always shows (c) with known speeds for
comparison. Jobs
(``schedulers.placement.simulator.job_stream``): 16 per run, Poisson arrivals; each tunes 32 configurations as
S=8 µP surrogates fused 8 per trial with successive halving (rungs 1, 3, 9, 27 epochs, reduction 3; 2000 steps
per epoch; a full-size step is 0.25 s on a V100) and then trains the best configuration at full size for 27
epochs. Stopping depends on the job's trace only, so all policies tune to the same best configuration with the
same member-epochs per job (checked) — by construction of the simulator, not a finding. (b) and (c) place by earliest predicted finish
(``EarliestFinish``): a trial goes to the GPU type on which it would finish first, counting the predicted wait
for a busy GPU of that type behind the trials queued ahead of it. For reference, (b0) and (c0) are the
previous greedy-gain placement (``HeterogeneityAware``: fastest free GPUs to the trials that gain most; a trial
waits, at most 30 min, for a GPU on which it runs at >= 50% of its best speed), with known speeds. Three loads (mean inter-arrival
10, 15, 30 min), ``--seeds`` streams each; means reported. Then (c)'s sensitivity to prediction error: each
trial's predicted run time missed by a lognormal factor (σ of its log 0.15, 0.3, 0.5); and the gain's
sensitivity to the assumed speeds: GPU-hours saved by (b) and (c) against (a) for every per-step overhead of
``--overheads-ms`` and speed scale of ``--speed-scales`` (each type's true speed-up over the V100 scaled: rate ->
1 + scale × (rate − 1); 0: all types alike, 1: as assumed), with learned speeds the prior left as it is (so a
published prior is wrong by the sweep). The JSON's ``assumptions`` records every constant and the prior.

    python benchmarks/cluster_placement.py [--seeds 5] [--jobs 16] [--out benchmarks/results]
        [--speeds learned|known] [--prior uniform|published] [--overheads-ms 0 2 8 20 50] [--speed-scales 0 0.5 1 1.5]
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from schedulers.placement.cluster import A100, ASSUMED_OVERHEAD_S, H100, V100, Cluster, GpuType
from schedulers.placement.policies import (EarliestFinish, ElasticEarliestFinish, ElasticHeterogeneityAware,
                                           HeterogeneityAware, TypeOblivious)
from schedulers.placement.simulator import assumptions, job_stream, simulate

CLUSTER = Cluster.of((H100, 2), (A100, 2), (V100, 4))
LOADS = {"high (10 min)": 600.0, "medium (15 min)": 900.0, "low (30 min)": 1800.0}
# name -> (policy factory, whether it places by learned speeds when --speeds learned)
POLICIES = {
    "(a) type-oblivious (Ray)": (TypeOblivious, False),
    "(b0) greedy gain": (lambda: HeterogeneityAware(min_efficiency=0.5), False),
    "(c0) (b0) + elastic merge": (lambda: ElasticHeterogeneityAware(min_efficiency=0.5), False),
    "(b) earliest finish": (EarliestFinish, True),
    "(c) (b) + elastic merge": (ElasticEarliestFinish, True),
}
KNOWN_C = "(c) with known speeds"  # shown beside learned (c) for comparison
PRIORS = {
    "uniform": {name: GpuType(name, 1.0, ASSUMED_OVERHEAD_S, "prior: every type at the reference rate")
                for name in CLUSTER.types},
    "published": {name: GpuType(name, gpu.rate, gpu.overhead_s, "prior: " + gpu.source)
                  for name, gpu in CLUSTER.types.items()},
}
ERRORS = (0.15, 0.3, 0.5)
MERGE_S = 30.0  # simulate's default checkpoint-and-restore cost of a merge
SWEPT = {"b": EarliestFinish, "c": ElasticEarliestFinish}  # the policies whose gain the speed sweep shows
METRICS = ("gpu_hours", "makespan_s", "mean_queueing_s", "mean_jct_s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="cluster_placement")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--overheads-ms", type=float, nargs="+", default=[0.0, 2.0, 8.0, 20.0, 50.0],
                        help="per-step overheads (ms, every type) of the speed sweep")
    parser.add_argument("--speed-scales", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5],
                        help="speed-up scales of the speed sweep (rate -> 1 + scale x (rate - 1))")
    parser.add_argument("--speeds", choices=("learned", "known"), default="learned",
                        help="(b) and (c) place by speeds learned from measured steps, or by the true speeds")
    parser.add_argument("--prior", choices=sorted(PRIORS), default="uniform",
                        help="with learned speeds, the speeds per type before any measurement")
    args = parser.parse_args(argv)
    prior = PRIORS[args.prior] if args.speeds == "learned" else None
    policies = {name: (make, prior if learns else None) for name, (make, learns) in POLICIES.items()}
    if prior is not None:
        policies[KNOWN_C] = (ElasticEarliestFinish, None)
    started = time.perf_counter()
    rows, timelines = [], {}
    for load, interarrival in LOADS.items():
        for seed in range(args.seeds):
            jobs = job_stream(args.jobs, seed=seed, mean_interarrival_s=interarrival, steps_per_epoch=2000)
            results = {name: simulate(CLUSTER, jobs, make(), name, prior=seen)
                       for name, (make, seen) in policies.items()}
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
                        for m in METRICS} for name in policies}
        base = means[next(iter(policies))]
        for name, mean in means.items():
            by_type = {gpu: float(np.mean([r["gpu_seconds_by_type"][gpu] for r in rows
                                           if r["load"] == load and r["policy"] == name])) / 3600
                       for gpu in CLUSTER.counts}
            table.append({"load": load, "policy": name, **mean, "gpu_hours_by_type": by_type,
                          **{f"{m}_vs_a": mean[m] / base[m] - 1 for m in METRICS}})
    print(f"cluster {dict(CLUSTER.counts)}; (b), (c) place by {args.speeds} speeds"
          + (f" from the {args.prior} prior" if prior else "")
          + f"; {args.jobs} jobs x {args.seeds} seeds per load; same best configuration "
          f"and member-epochs under every policy: yes (by construction of the simulator); {time.perf_counter() - started:.1f} s")
    print(f"{'load':<16} {'policy':<26} {'GPU-hours':>10} {'vs (a)':>7} {'makespan h':>11} {'vs (a)':>7} "
          f"{'queue min':>10} {'JCT h':>7} {'vs (a)':>7}  GPU-hours on {'/'.join(CLUSTER.counts)}")
    for r in table:
        print(f"{r['load']:<16} {r['policy']:<26} {r['gpu_hours']:>10.1f} {r['gpu_hours_vs_a']:>+7.0%} "
              f"{r['makespan_s'] / 3600:>11.2f} {r['makespan_s_vs_a']:>+7.0%} {r['mean_queueing_s'] / 60:>10.1f} "
              f"{r['mean_jct_s'] / 3600:>7.2f} {r['mean_jct_s_vs_a']:>+7.0%}  "
              + "/".join(f"{h:.1f}" for h in r["gpu_hours_by_type"].values()))
    assumed = {**assumptions(CLUSTER, job_stream(args.jobs, steps_per_epoch=2000), MERGE_S),
               "mean_interarrival_s": LOADS, "seeds": args.seeds,
               "policies": {"(b0)/(c0) min_efficiency": 0.5, "(b0)/(c0) patience_s": HeterogeneityAware().patience_s},
               "placement_speeds": {"(b)/(c)": args.speeds, "prior": None if prior is None else {
                   "name": args.prior, "gpu_types": {n: asdict(g) for n, g in prior.items()},
                   "correction": "per type, the prior's overhead and work parts each scaled by a factor fitted "
                                 "to the step times the trials that ran on it measured (before two mixes of overhead "
                                 "and work were measured: the median ratio of measured / prior step times; "
                                 "schedulers.placement.predicted_finish.PredictedFinish.corrections)"}}}
    print_assumptions(assumed)
    speeds = speed_sensitivity(args.jobs, args.seeds, [ms / 1000 for ms in args.overheads_ms], args.speed_scales,
                               prior)
    print_speed_sensitivity(speeds)
    sweep = sensitivity(args.jobs, args.seeds, prior)
    print("\nsensitivity of (c) to prediction error (σ of log(predicted / actual run time) per trial): change vs (a)")
    print(f"{'load':<16} {'σ':>5} {'GPU-hours':>10} {'makespan':>9} {'JCT':>6}")
    for r in sweep:
        print(f"{r['load']:<16} {r['prediction_error']:>5.2f} {r['gpu_hours_vs_a']:>+10.0%} "
              f"{r['makespan_s_vs_a']:>+9.0%} {r['mean_jct_s_vs_a']:>+6.0%}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "cluster_placement.json"
    out.write_text(json.dumps({"cluster": dict(CLUSTER.counts), "loads": LOADS, "assumptions": assumed,
                               "table": table, "sensitivity": sweep, "speed_sensitivity": speeds, "runs": rows},
                              indent=2))
    print(f"wrote {out}")
    print(f"wrote {plot(table, timelines, list(policies), args.out / 'cluster_placement.png')}")


def print_assumptions(assumed: dict) -> None:
    print("\nassumed constants of the simulated cluster (its true speeds):")
    for name, gpu in assumed["gpu_types"].items():
        print(f"  {name}: {gpu['count']} GPUs, rate {gpu['rate']:g} x the V100, per-step overhead "
              f"{gpu['overhead_s'] * 1000:g} ms ({gpu['source']})")
    jobs = assumed["jobs"]
    print(f"  step time = {assumed['step_seconds']}; merge {assumed['merge_s']:g} s; jobs: {jobs['configs']} "
          f"configurations fused {jobs['fusion']} per trial, surrogate work {jobs['surrogate_work']} s/member-step, "
          f"target {jobs['target_work']} s/step on the V100, {jobs['steps_per_epoch']} steps per epoch, rungs "
          f"{jobs['rungs']}")
    speeds = assumed["placement_speeds"]
    if speeds["prior"] is None:
        print("  (b)/(c) place by the true speeds (known)")
    else:
        print(f"  (b)/(c) place by learned speeds: {speeds['prior']['name']} prior "
              + ", ".join(f"{n} rate {g['rate']:g}" for n, g in speeds["prior"]["gpu_types"].items())
              + f", each corrected by {speeds['prior']['correction']}")
    for claim in assumed["by_construction"]:
        print(f"  by construction of the simulator: {claim}")


def scaled_cluster(overhead_s: float, speed_scale: float) -> Cluster:
    """``CLUSTER`` with every type's per-step overhead ``overhead_s`` and its speed-up over the V100 scaled by
    ``speed_scale`` (rate -> 1 + speed_scale × (rate − 1))."""
    types = {name: GpuType(name, 1 + speed_scale * (gpu.rate - 1), overhead_s,
                           f"swept: overhead {overhead_s * 1000:g} ms, speed-up x{speed_scale:g} of the assumed")
             for name, gpu in CLUSTER.types.items()}
    return Cluster(types, CLUSTER.counts)


def speed_sensitivity(jobs: int, seeds: int, overheads_s: list[float], scales: list[float],
                      prior: dict[str, GpuType] | None = None) -> list[dict]:
    """GPU-hours of each of ``SWEPT`` relative to (a) (−0.3: 30% fewer), mean over seeds, for every (per-step
    overhead, speed scale) of the true speeds and load, ``SWEPT`` placing by speeds learned from ``prior`` (``None``:
    by the true speeds); the tuning result is checked equal under every policy at each point."""
    rows = []
    for load, interarrival in LOADS.items():
        streams = [job_stream(jobs, seed=s, mean_interarrival_s=interarrival, steps_per_epoch=2000)
                   for s in range(seeds)]
        for overhead in overheads_s:
            for scale in scales:
                cluster = scaled_cluster(overhead, scale)
                runs = {key: [simulate(cluster, stream, make(), prior=None if key == "a" else prior)
                              for stream in streams] for key, make in {"a": TypeOblivious, **SWEPT}.items()}
                for same_stream in zip(*runs.values()):
                    if len({(tuple(r.best_configs), tuple(r.member_epochs)) for r in same_stream}) != 1:
                        raise AssertionError(f"policies tuned differently at overhead {overhead} s, scale {scale}")
                base = float(np.mean([r.gpu_hours for r in runs["a"]]))
                rows.append({"load": load, "overhead_s": overhead, "speed_scale": scale,
                             "rates": {name: g.rate for name, g in cluster.types.items()}, "gpu_hours_a": base,
                             **{f"gpu_hours_vs_a_{key}": float(np.mean([r.gpu_hours for r in runs[key]])) / base - 1
                                for key in SWEPT}})
    return rows


def print_speed_sensitivity(rows: list[dict]) -> None:
    print("\nsensitivity to the true speeds (a learned speeds' prior stays as it is): GPU-hours vs (a) of (b) earliest "
          "finish / (c) + elastic merge, mean over seeds")
    print(f"{'overhead ms':>11} {'speed scale':>11} {'rates ' + '/'.join(CLUSTER.types):>20}"
          + "".join(f"{load:>18}" for load in LOADS))
    points = sorted({(r["overhead_s"], r["speed_scale"]) for r in rows})
    for overhead, scale in points:
        at = {r["load"]: r for r in rows if (r["overhead_s"], r["speed_scale"]) == (overhead, scale)}
        rates = "/".join(f"{v:.2f}" for v in next(iter(at.values()))["rates"].values())
        print(f"{overhead * 1000:>11g} {scale:>11g} {rates:>20}" + "".join(
            f"{at[load]['gpu_hours_vs_a_b']:>+9.0%} /{at[load]['gpu_hours_vs_a_c']:>+6.0%}" for load in LOADS))


def sensitivity(jobs: int, seeds: int, prior: dict[str, GpuType] | None = None) -> list[dict]:
    """(c) with its predicted run times missed by a lognormal factor per trial (σ in ``ERRORS``), relative to
    (a), mean over seeds; (c) places by speeds learned from ``prior`` (``None``: by the true speeds)."""
    rows = []
    for load, interarrival in LOADS.items():
        streams = [job_stream(jobs, seed=s, mean_interarrival_s=interarrival, steps_per_epoch=2000)
                   for s in range(seeds)]
        base = [simulate(CLUSTER, stream, TypeOblivious()) for stream in streams]
        for error in ERRORS:
            runs = [simulate(CLUSTER, stream, ElasticEarliestFinish(), prediction_error=error, seed=s, prior=prior)
                    for s, stream in enumerate(streams)]
            rows.append({"load": load, "prediction_error": error, **{
                f"{m}_vs_a": float(np.mean([getattr(r, m) for r in runs]) / np.mean([getattr(r, m) for r in base]) - 1)
                for m in METRICS}})
    return rows


def plot(table: list[dict], timelines: dict, names: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(20, 4))
    loads = list(LOADS)
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
