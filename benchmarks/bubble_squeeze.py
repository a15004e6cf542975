"""Fill the bubbles of a 2-stage 1F1B pipeline job (one stage per CPU core) with Hydro's own fused trials.

The fill trials are what a ``HydroSearcher`` starts: µP surrogates (width ÷ ``--scale``) of a user ``TuneSpec``
(``hydro.tune.examples.digits_mlp``: an MLP on scikit-learn's digits, plain torch SGD), ``--members`` fused per
stage; a thread per stage plays the Tune proxy (``hydro.tune.fill_trainable``): it follows the stage's fill trial as
the proxy does (a status request that the host answers when the fill posts an epoch) and lets every member go on
after each epoch. The same main job in four modes: alone; with a busy
loop under ``SCHED_IDLE`` on each stage's core and no fill (the floor: what any work in the bubbles costs the job on
this machine, e.g. by keeping its cores from idling); with a gated fill trial in every stage (runs only inside
bubbles, layer by layer); with naive co-location (fill trials simply run alongside). The modes are interleaved in
rounds (alone, idle spin, gated, naive, alone, ...) so drifts of a shared machine hit
all of them alike; the slowdown is the median over rounds of (mode / alone of the same round). Reported: main-job
iteration time and slowdown, fill throughput (member-steps/s), and the fraction of bubble time turned into fill
work (fill CPU seconds / bubble seconds). Writes JSON and a PNG timeline of one iteration.

    python benchmarks/bubble_squeeze.py [--rounds 10] [--iterations 30] [--members 4] [--scale 4]
                                        [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import ray

from hydro.bubbles import PipelineSpec, SlotMode
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.tune.examples import digits_mlp
from hydro.tune.fill_trainable import WAIT_S
from hydro.tune.cli import worker_pythonpath
from hydro.tune.pipeline_job import PipelineJob

CHUNK = 5  # iterations per job.run call
IDLE_SPIN = "idle spin"  # the mode with busy loops under SCHED_IDLE on the stages' cores and no fill
SPINNER = ("import os, sys\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
           "os.sched_setaffinity(0, {int(sys.argv[1])})\nprint(flush=True)\nwhile True:\n    pass")

REPO = Path(__file__).resolve().parents[1]


def run_mode(job: PipelineJob, mode: SlotMode | str | None, spec: TuneSpec, plan: TrialPlan, iterations: int) -> dict:
    """One block of ``iterations`` in ``mode`` (a fill's :class:`SlotMode`, :data:`IDLE_SPIN` or ``None``: alone)."""
    if mode == IDLE_SPIN:
        cores = sorted(os.sched_getaffinity(0))  # each stage's core, as StageHost picks it
        spinners = [subprocess.Popen([sys.executable, "-c", SPINNER, str(cores[stage % len(cores)])],
                                     stdout=subprocess.PIPE) for stage in range(job.num_stages)]
        for spinner in spinners:  # its start-up ran at normal priority: measure only once it spins idle, pinned
            spinner.stdout.readline()
        try:
            return {**run_mode(job, None, spec, plan, iterations), "mode": IDLE_SPIN}
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
                spinner.stdout.close()
    proxy, failures = threading.Event(), []  # set: the proxy stops; what failed in its threads
    deciders = [threading.Thread(target=_let_members_go_on, args=(job, stage, proxy, failures))
                for stage in range(job.num_stages)]
    if mode is not None:
        for stage in range(job.num_stages):
            job.attach_fill(stage, spec, plan, mode)
        for decider in deciders:
            decider.start()
    job.run(2)  # settle
    chunks = []
    for done in range(0, iterations, CHUNK):
        chunks.append(job.run(min(CHUNK, iterations - done), fill_activity=done + CHUNK >= iterations))
    if mode is not None:
        proxy.set()
        for decider in deciders:
            decider.join()
        if failures:
            raise RuntimeError(failures[0])
        for stage in range(job.num_stages):
            job.detach_fill(stage)
    reports = [_merge([chunk[stage] for chunk in chunks]) for stage in range(job.num_stages)]
    wall = max(r["wall_s"] for r in reports)
    bubble_s = sum(b["length"] for r in reports for b in r["bubbles"])
    fill_cpu = sum(r.get("fill_compute_s", 0.0) for r in reports)
    member_steps = sum(r.get("fill_steps", 0) * r.get("fill_members", 0) for r in reports)
    return {"mode": mode.value if mode else "alone", "iteration_s": wall / iterations,
            "bubble_s_per_iteration": bubble_s / iterations, "bubble_fraction": bubble_s / (wall * job.num_stages),
            "fill_member_steps_per_s": member_steps / wall, "bubble_use": fill_cpu / bubble_s if bubble_s else 0.0,
            "reports": [chunks[-1][stage] for stage in range(job.num_stages)]}


def _let_members_go_on(job: PipelineJob, stage: int, stop: threading.Event, failures: list[str]) -> None:
    """The Tune proxy's part for ``stage`` until ``stop``: its fill trial's posted epoch results are decided (all
    members go on) as the proxy hears of them; a failed fill ends it with its cause in ``failures``."""
    while not stop.is_set():
        status = job.fill_status(stage, WAIT_S)
        if status is not None and "failed" in status:
            failures.append(f"the fill trial of stage {stage} failed: {status['failed']}")
            return
        if status is not None and status["result"] is not None:
            ray.get(job.stages[stage].fill_decide.remote(status["result"].member_ids))


def _merge(reports: list[dict]) -> dict:
    """One stage's chunk reports as one (times summed, bubbles concatenated)."""
    merged = {"stage": reports[0]["stage"], "wall_s": sum(r["wall_s"] for r in reports),
              "bubbles": [b for r in reports for b in r["bubbles"]], "ops": reports[-1]["ops"]}
    for key in ("fill_steps", "fill_compute_s"):
        merged[key] = sum(r.get(key, 0) for r in reports)
    merged["fill_members"] = max((r.get("fill_members", 0) for r in reports), default=0)
    return merged


def plot_timeline(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = result["reports"]
    last_f0 = [max(o["start"] for o in r["ops"] if o["label"] == "F0") for r in reports]
    start = min(last_f0)  # the last iteration
    end = max(o["end"] for r in reports for o in r["ops"])
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for r in reports:
        y = r["stage"]
        for o in r["ops"]:
            if o["start"] >= start:
                color = "#4c72b0" if o["label"].startswith("F") else "#dd8452"
                ax.barh(y, o["end"] - o["start"], left=o["start"] - start, color=color, edgecolor="white", height=0.5)
                ax.text((o["start"] + o["end"]) / 2 - start, y, o["label"], ha="center", va="center", fontsize=7,
                        color="white")
        for b in r["bubbles"]:
            if b["end"] >= start:
                ax.barh(y + 0.33, b["end"] - max(b["start"], start), left=max(b["start"], start) - start,
                        color="#cccccc", height=0.14)
        for a, z in r.get("fill_activity", []):
            if a >= start and z <= end:
                ax.barh(y - 0.33, z - a, left=a - start, color="#55a868", height=0.14)
    ax.set_yticks(range(len(reports)), [f"stage {r['stage']}" for r in reports])
    ax.invert_yaxis()
    ax.set_xlabel("seconds into the iteration")
    ax.set_title("1F1B iteration: forward (blue), backward (orange); bubbles (grey, below), fill work (green, above)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def summarize(blocks: list[dict], alone: list[dict]) -> dict:
    """One mode over all rounds: median iteration time, median paired slowdown (and its quartiles), totals."""
    slowdowns = [b["iteration_s"] / a["iteration_s"] - 1 for b, a in zip(blocks, alone)]
    quartiles = statistics.quantiles(slowdowns, n=4) if len(slowdowns) > 1 else slowdowns * 3
    wall = sum(b["iteration_s"] for b in blocks)
    bubble = sum(b["bubble_s_per_iteration"] for b in blocks)
    return {"mode": blocks[0]["mode"], "iteration_s": statistics.median(b["iteration_s"] for b in blocks),
            "slowdown": statistics.median(slowdowns), "slowdown_q1": quartiles[0], "slowdown_q3": quartiles[2],
            "bubble_fraction": statistics.median(b["bubble_fraction"] for b in blocks),
            "fill_member_steps_per_s": sum(b["fill_member_steps_per_s"] * b["iteration_s"] for b in blocks) / wall,
            "bubble_use": sum(b["bubble_use"] * b["bubble_s_per_iteration"] for b in blocks) / bubble,
            "rounds": len(blocks), "round_slowdowns": slowdowns,
            "round_iteration_s": [b["iteration_s"] for b in blocks]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=30, help="iterations per mode and round")
    parser.add_argument("--members", type=int, default=4, help="fused members per fill trial (one per stage)")
    parser.add_argument("--scale", type=int, default=4, help="surrogate width divisor of the fill trials")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath(str(REPO))}})
    spec = PipelineSpec(width=args.width, depth=8, microbatches=4, microbatch_size=32)
    tune_spec, _ = digits_mlp(epochs=10_000)
    plan = TrialPlan(TrialKind.SURROGATE, [(f"m{i}", {"lr": 0.1 / (i + 1), "momentum": 0.9, "weight_decay": 0.0})
                                           for i in range(args.members)], scale=args.scale, mup=args.scale > 1)
    job = PipelineJob(spec, num_stages=2)
    job.profile(3)
    modes = (None, IDLE_SPIN, SlotMode.GATED, SlotMode.NAIVE)
    blocks: dict[SlotMode | str | None, list[dict]] = {mode: [] for mode in modes}
    for _ in range(args.rounds):
        for mode in modes:
            blocks[mode].append(run_mode(job, mode, tune_spec, plan, args.iterations))
    job.shutdown()
    results = [summarize(blocks[mode], blocks[None]) for mode in modes]
    print(f"main job: MLP width {args.width} x 8 layers, 2 stages (1 CPU core each), 4 microbatches of 32; "
          f"fill: {args.members} fused digits-MLP surrogates (64-512-512-10 / {args.scale}) per stage; {args.rounds} rounds x "
          f"{args.iterations} iterations per mode")
    print(f"{'mode':<9} {'iter ms':>8} {'slowdown (q1..q3)':>22} {'bubble %':>9} {'fill member-steps/s':>20} "
          f"{'bubble use':>11}")
    for r in results:
        spread = f"{r['slowdown']:+.1%} ({r['slowdown_q1']:+.1%}..{r['slowdown_q3']:+.1%})"
        print(f"{r['mode']:<9} {1e3 * r['iteration_s']:>8.2f} {spread:>22} {r['bubble_fraction']:>9.1%} "
              f"{r['fill_member_steps_per_s']:>20.1f} {r['bubble_use']:>11.1%}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_timeline(blocks[SlotMode.GATED][-1], args.out / "bubble_timeline.png")
    (args.out / "bubble_squeeze.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                              "results": results}, indent=2))
    print(f"wrote {args.out / 'bubble_squeeze.json'} and {args.out / 'bubble_timeline.png'}")


if __name__ == "__main__":
    main()
