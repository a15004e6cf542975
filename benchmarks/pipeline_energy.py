"""Perseus on the simulated 4-stage 1F1B job: profile, time-energy frontier (lowtime), free and 5%-slowdown
savings, and the slack policy's choice per stage (energy or tuning trials).

Profiles come from the SIMULATED DVFS device (:class:`hydro.energy.frequency.SimulatedDVFSDevice`), not a
GPU: each stage's forward and backward of the reference pipeline (``PipelineSpec``, 4 stages of 3/2/2/2
linear layers, 8 microbatches) is timed on one CPU thread at the top clock (the fastest of ``--samples`` runs:
on a shared machine, contention would otherwise decide the plan), and the device stretches that host time to each clock
(time ~ 1/f for the compute-bound share) and charges DVFS power (static + f·V²), scanning down from 1740 MHz
in 15 MHz steps until energy rose five times in a row (Perseus's rule). Plans are evaluated on the profile
(every plan's time and energy are the profile's, not lowtime's model). Prints the tables; writes the
Perseus CSV, JSON and a PNG of the frontier.

    python benchmarks/pipeline_energy.py [--samples 100] [--microbatch-size 256] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hydro.pipeline.schedule import one_f_one_b
from hydro.pipeline.stage import PipelineSpec
from hydro.energy.frequency import DVFSModel
from hydro.pipeline.profiler import reference_instructions, simulated_pipeline_profile
from schedulers.pipeline_energy import (
    ByMaxSlowdown,
    EnergyOrTrials,
    Instruction,
    InstructionDAG,
    PlanPoint,
    apply_choices,
    lowtime_frontier,
    stage_slack,
)

CLOCKS_MHZ = tuple(range(1740, 645, -15))  # the seed's range: 1740 .. 660 MHz


def host_times(spec: PipelineSpec, stages: int, samples: int) -> list[dict[Instruction, float]]:
    """Fastest CPU seconds of each stage's forward and backward (one microbatch) of the reference pipeline."""
    fastest = []
    for stage in range(stages):
        runs = reference_instructions(spec, stage, stages)
        stage_times = {}
        for kind, run in runs.items():
            run()  # warm-up
            times = []
            for _ in range(samples):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            stage_times[kind] = min(times)
        fastest.append(stage_times)
    return fastest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=256)
    parser.add_argument("--samples", type=int, default=100, help="CPU timings per instruction (the fastest counts)")
    parser.add_argument("--unit-ms", type=float, default=None,
                        help="lowtime's time unit (default: the smaller of fastest instruction/10, iteration/1000)")
    parser.add_argument("--fill-share", type=float, default=0.62,
                        help="share of bubble time the squeezer turns into trial compute (README: 62%% measured)")
    parser.add_argument("--trial-value-w", type=float, default=None,
                        help="J one second of trial work is worth (default: a dedicated device's power at max clock)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(1)
    spec = PipelineSpec(width=256, depth=8, microbatches=args.microbatches, microbatch_size=args.microbatch_size)
    model = DVFSModel(CLOCKS_MHZ)
    host_s = host_times(spec, args.stages, args.samples)
    profile = simulated_pipeline_profile(host_s, model)
    profile.write_csv(args.out / "pipeline_energy_profile.csv")
    dag = InstructionDAG(one_f_one_b(args.stages, args.microbatches))
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    fastest = min(min(stage.values()) for stage in host_s)
    unit_s = args.unit_ms / 1000 if args.unit_ms else min(fastest / 10, baseline.time_s / 1000)
    started = time.perf_counter()
    frontier = lowtime_frontier(dag, profile, unit_s)
    solve_s = time.perf_counter() - started

    print(f"simulated DVFS device ({len(CLOCKS_MHZ)} clocks {CLOCKS_MHZ[0]}..{CLOCKS_MHZ[-1]} MHz, P2P blocking "
          f"{profile.p2p_power_w:.0f} W); {args.stages} stages x {args.microbatches} microbatches (1F1B), "
          f"microbatch {args.microbatch_size}")
    print("host ms per instruction (forward/backward): " + ", ".join(
        f"S{s} {m[Instruction.FORWARD] * 1e3:.3f}/{m[Instruction.BACKWARD] * 1e3:.3f}" for s, m in enumerate(host_s)))
    print(f"profile rows: {len(profile.rows)}; lowtime: {len(frontier)} Pareto-optimal plans in {solve_s:.1f} s "
          f"(unit {unit_s * 1e6:.1f} us)\n")
    print("| iteration ms | energy J | vs all-max time | vs all-max energy |")
    print("|---|---|---|---|")
    step = max(1, len(frontier) // 12)
    for point in frontier[::step] + ([frontier[-1]] if (len(frontier) - 1) % step else []):
        print(f"| {point.time_s * 1e3:.3f} | {point.energy_j:.3f} | {point.time_s / baseline.time_s - 1:+.1%} | "
              f"{point.energy_j / baseline.energy_j - 1:+.1%} |")

    choices = {name: ByMaxSlowdown(slowdown).choose(frontier, baseline)
               for name, slowdown in (("zero slowdown", 0.0), ("5% slowdown", 0.05))}
    print("\n| plan | iteration ms | slowdown | energy J | energy saved |")
    print("|---|---|---|---|---|")
    for name, point in [("all max clocks", baseline), *choices.items()]:
        print(f"| {name} | {point.time_s * 1e3:.3f} | {point.time_s / baseline.time_s - 1:+.2%} | "
              f"{point.energy_j:.3f} | {1 - point.energy_j / baseline.energy_j:.1%} |")

    free = choices["zero slowdown"]
    policy = EnergyOrTrials(args.trial_value_w if args.trial_value_w is not None else model.power_w(model.max_mhz))
    slacks = stage_slack(dag, profile, free, fill_share=args.fill_share, fill_power_w=model.power_w(model.max_mhz))
    decisions = [policy.choose(s) for s in slacks]
    combined = apply_choices(dag, profile, free, decisions)
    print(f"\nslack policy on the zero-slowdown plan (a second of trial work is worth {policy.joules_per_trial_s:.0f} J; "
          f"the squeezer turns {args.fill_share:.0%} of bubble time into trial work):")
    print("| stage | slack ms/iter | energy saved J/iter | trial work ms/iter | trial value J/iter | trials win above "
          "| choice |")
    print("|---|---|---|---|---|---|---|")
    for slack, use in zip(slacks, decisions):
        print(f"| {slack.stage} | {slack.slack_s * 1e3:.3f} | {slack.energy_saved_j:.3f} | "
              f"{slack.trial_work_s * 1e3:.3f} | {policy.trials_value_j(slack):.3f} | {slack.break_even_w:.0f} W "
              f"| {use.value} |")
    print(f"combined plan: {combined.time_s * 1e3:.3f} ms ({combined.time_s / baseline.time_s - 1:+.2%}), "
          f"{combined.energy_j:.3f} J without the fill's energy (saved {1 - combined.energy_j / baseline.energy_j:.1%})")

    def row(p: PlanPoint) -> dict:
        return {"time_s": p.time_s, "energy_j": p.energy_j, "stage_energy_j": list(p.stage_energy_j)}

    result = {
        "device": "simulated DVFS (hydro.energy.frequency.SimulatedDVFSDevice), not a GPU",
        "args": {k: str(v) for k, v in vars(args).items()}, "dvfs_model": {k: v for k, v in vars(model).items()
                                                                           if k != "frequencies_mhz"},
        "host_s": [{k.value: v for k, v in m.items()} for m in host_s], "p2p_power_w": profile.p2p_power_w,
        "unit_s": unit_s, "solve_s": solve_s, "baseline": row(baseline), "frontier": [row(p) for p in frontier],
        "plans": {name: {**row(p), "stage_frequencies_mhz": dag.stage_plans(p.frequencies),
                         "energy_saved": 1 - p.energy_j / baseline.energy_j} for name, p in choices.items()},
        "slack_policy": [{**vars(s), "trials_value_j": policy.trials_value_j(s), "break_even_w": s.break_even_w,
                          "choice": u.value}
                         for s, u in zip(slacks, decisions)],
        "combined": row(combined),
    }
    (args.out / "pipeline_energy.json").write_text(json.dumps(result, indent=1))
    title = f"Simulated DVFS device, {args.stages}-stage 1F1B, {args.microbatches} microbatches"
    plot(frontier, baseline, choices, title, args.out / "pipeline_energy_frontier.png")
    print(f"wrote {args.out / 'pipeline_energy.json'}, {args.out / 'pipeline_energy_frontier.png'} and "
          f"{args.out / 'pipeline_energy_profile.csv'}")


def plot(frontier: list[PlanPoint], baseline: PlanPoint, choices: dict[str, PlanPoint], title: str,
         path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot([p.time_s * 1e3 for p in frontier], [p.energy_j for p in frontier], ".-", label="Pareto frontier (lowtime)")
    ax.plot(baseline.time_s * 1e3, baseline.energy_j, "rx", markersize=9, label="all max clocks")
    for marker, (name, point) in zip(("go", "bs"), choices.items()):
        ax.plot(point.time_s * 1e3, point.energy_j, marker, label=name)
    ax.axvline(baseline.time_s * 1e3, color="grey", lw=0.6, ls=":")
    ax.set_xlabel("iteration time (ms)")
    ax.set_ylabel("iteration energy (J)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)


if __name__ == "__main__":
    main()
