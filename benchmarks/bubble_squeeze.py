"""Fill the bubbles of one real 1F1B pipeline stage, on a GPU (``--device cuda``) or a CPU core, with Hydro's fused
trials; the stage's neighbours are emulated (:class:`hydro.pipeline.emulated.EmulatedNeighbours`: they answer each
send and receive when the full pipeline's other stages, with the real stage's profiled operation times, would), so
one device has the real bubbles of a ``--stages``-stage pipeline.

The fill trials are what a ``HydroSearcher`` starts: µP surrogates (width ÷ ``--scale``) of a user ``TuneSpec``
(``hydro.tune.examples.digits_mlp``: an MLP on scikit-learn's digits, plain torch SGD) on the stage's device,
``--members`` fused, in a fill process (:class:`hydro.bubbles.FillProcess`); a thread plays the Tune proxy and lets
every member go on after each epoch. The same main job in three modes, interleaved in rounds (alone, gated, naive,
alone, ...) so drifts of a shared machine hit all alike: alone; with a gated fill (its units run only inside the
stage's device bubbles, one at a time, each waited for; on a CPU under ``SCHED_IDLE`` on the stage's core); with
naive co-location (the fill simply runs alongside). Reported per mode: iteration time, slowdown (median over rounds
of mode / alone of the same round, with quartiles), bubble fraction (the device's waits / iteration time), fill
member-steps/s and bubble use (the fill's unit time, device time on a GPU, CPU time on a CPU / bubble time).
Writes JSON and a PNG timeline of one iteration.

    python benchmarks/bubble_squeeze.py --device cuda|cpu [--rounds 10] [--iterations 30] [--stages 4]
                                        [--members 4] [--scale 4] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import threading
import time
from pathlib import Path

import torch

from hydro.bubbles import BubbleGate, FillProcess, SlotMode
from hydro.pipeline import BubbleRecorder, PipelineSpec, PipelineStage
from hydro.pipeline.emulated import EmulatedNeighbours
from hydro.bubbles.fill_process import start_fill_server
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.tune.examples import digits_mlp
from hydro.tune.pipeline.job import FILL_PRELOAD, pickled_workload

SETTLE = 2  # iterations before each measured block
MODES = ("alone", SlotMode.GATED.value, SlotMode.NAIVE.value)


class OneStage:
    """Stage ``stage`` of a ``num_stages``-stage 1F1B pipeline of ``spec`` on ``device``, the others emulated,
    profiled; its bubbles go to :attr:`gate` (swapped per mode)."""

    def __init__(self, spec: PipelineSpec, stage: int, num_stages: int, device: str) -> None:
        self.device = torch.device(device)
        self.gate = BubbleGate()
        self.recorder = BubbleRecorder(self.gate)
        self.stage = PipelineStage(spec, stage, num_stages, self.recorder, self.device,
                                   transport=EmulatedNeighbours(stage, num_stages, spec.microbatches, self.device))
        self.stage.profile(3)

    def block(self, iterations: int) -> dict:
        """Run ``iterations``: their wall time and the device's bubbles (seconds)."""
        self.stage.timeline.clear()
        self.stage.device_bubbles.clear()
        start = time.perf_counter()
        for _ in range(iterations):
            self.stage.run_iteration()
        return {"wall_s": time.perf_counter() - start,
                "bubble_s": sum(b.length for b in self.stage.device_bubbles)}


class Fill:
    """A fused fill trial beside the stage in ``mode`` (gated or naive) while it lives; a thread decides its
    epochs (every member goes on)."""

    def __init__(self, host: OneStage, mode: str, workload: bytes, plan: TrialPlan) -> None:
        gated = mode == SlotMode.GATED.value
        self.gate = BubbleGate(always_open=not gated)
        host.recorder.listeners = [self.gate]
        cpus = set(os.sched_getaffinity(0)) if host.device.type == "cpu" else None  # CPU: the stage's core
        self.process = FillProcess(self.gate, cpus, workload=workload, plan=plan,
                                   member_ids=[m for m, _ in plan.members], idle=gated)
        self.stop_deciding = threading.Event()
        self.decider = threading.Thread(target=self._decide, daemon=True)
        self.decider.start()

    def _decide(self) -> None:
        while not self.stop_deciding.is_set():
            self.process.wait_news(0.5)
            result = self.process.poll()["result"]
            if result is not None:
                self.process.decide(result.member_ids)

    def progress(self) -> tuple[int, float]:
        return self.process.completed_steps, self.process.compute_s

    def end(self, host: OneStage) -> list[tuple[float, float]]:
        """Stop the fill; returns its recent units' wall-clock times."""
        self.stop_deciding.set()
        self.decider.join(timeout=60)
        activity = self.process.activity()
        self.process.stop()
        host.recorder.listeners = [host.gate]
        return activity


def run_mode(host: OneStage, mode: str, workload: bytes, plan: TrialPlan, iterations: int) -> dict:
    """One block of ``iterations`` in ``mode``."""
    fill = Fill(host, mode, workload, plan) if mode != "alone" else None
    host.block(SETTLE)
    steps, compute = fill.progress() if fill else (0, 0.0)
    measured = host.block(iterations)
    if fill:
        steps_after, compute_after = fill.progress()
        steps, compute = steps_after - steps, compute_after - compute
    report = {"stage": host.stage.stage, "ops": [dataclasses.asdict(o) for o in host.stage.timeline],
              "bubbles": [dataclasses.asdict(b) for b in host.stage.device_bubbles]}
    if fill:
        report["fill_activity"] = fill.end(host)
    members = len(plan.members)
    return {"mode": mode, "iteration_s": measured["wall_s"] / iterations,
            "bubble_s_per_iteration": measured["bubble_s"] / iterations,
            "bubble_fraction": measured["bubble_s"] / measured["wall_s"],
            "fill_member_steps_per_s": steps * members / measured["wall_s"],
            "bubble_use": compute / measured["bubble_s"] if measured["bubble_s"] else 0.0, "reports": [report]}


def measure(device: str, rounds: int, iterations: int, stages: int, members: int, scale: int,
            spec: PipelineSpec) -> list[dict]:
    """Every mode's summary over ``rounds`` interleaved rounds (see the module's docstring)."""
    start_fill_server(FILL_PRELOAD)
    threads, cores = torch.get_num_threads(), os.sched_getaffinity(0)
    torch.set_num_threads(1)
    if device == "cpu":  # the stage (and its gated fill) on one core
        os.sched_setaffinity(0, {min(cores)})
    try:
        return _measure(device, rounds, iterations, stages, members, scale, spec)
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)


def _measure(device: str, rounds: int, iterations: int, stages: int, members: int, scale: int,
             spec: PipelineSpec) -> list[dict]:
    host = OneStage(spec, stage=0, num_stages=stages, device=device)
    tune_spec, _ = digits_mlp(epochs=10_000)
    workload = pickled_workload(dataclasses.replace(tune_spec, device=device))
    plan = TrialPlan(TrialKind.SURROGATE, [(f"m{i}", {"lr": 0.1 / (i + 1), "momentum": 0.9, "weight_decay": 0.0})
                                           for i in range(members)], scale=scale, mup=scale > 1)
    blocks: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            blocks[mode].append(run_mode(host, mode, workload, plan, iterations))
    return [summarize(blocks[mode], blocks["alone"]) | {"last": blocks[mode][-1]} for mode in MODES]


def plot_timeline(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reports = result["last"]["reports"]
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
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iterations", type=int, default=30, help="iterations per mode and round")
    parser.add_argument("--stages", type=int, default=4, help="pipeline stages (one real, the others emulated)")
    parser.add_argument("--members", type=int, default=4, help="fused members of the fill trial")
    parser.add_argument("--scale", type=int, default=4, help="surrogate width divisor of the fill trial")
    parser.add_argument("--width", type=int, default=None, help="main model width (default 4096 cuda, 512 cpu)")
    parser.add_argument("--microbatch-size", type=int, default=None, help="(default 64 cuda, 32 cpu)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    cuda = args.device == "cuda"
    width = args.width or (4096 if cuda else 512)
    spec = PipelineSpec(width=width, depth=16, microbatches=8, microbatch_size=args.microbatch_size or (64 if cuda else 32))
    results = measure(args.device, args.rounds, args.iterations, args.stages, args.members, args.scale, spec)
    name = torch.cuda.get_device_name() if cuda else "CPU core"
    print(f"main job: stage 0 of {args.stages} (others emulated), MLP width {width} x 16 layers split evenly, "
          f"{spec.microbatches} microbatches of {spec.microbatch_size}, on {name}; fill: {args.members} fused "
          f"digits-MLP surrogates (64-512-512-10 / {args.scale}); {args.rounds} rounds x {args.iterations} iterations "
          f"per mode; load {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<9} {'iter ms':>8} {'slowdown (q1..q3)':>22} {'bubble %':>9} {'fill member-steps/s':>20} "
          f"{'bubble use':>11}")
    for r in results:
        spread = f"{r['slowdown']:+.1%} ({r['slowdown_q1']:+.1%}..{r['slowdown_q3']:+.1%})"
        print(f"{r['mode']:<9} {1e3 * r['iteration_s']:>8.2f} {spread:>22} {r['bubble_fraction']:>9.1%} "
              f"{r['fill_member_steps_per_s']:>20.1f} {r['bubble_use']:>11.1%}")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_timeline(results[1], args.out / f"bubble_timeline_{args.device}.png")
    for r in results:
        del r["last"]
    path = args.out / f"bubble_squeeze_{args.device}.json"
    path.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "device": name,
                                "results": results}, indent=2))
    print(f"wrote {path} and {args.out / f'bubble_timeline_{args.device}.png'}")


if __name__ == "__main__":
    main()
