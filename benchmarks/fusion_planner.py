"""The searcher's fusion planner: measure every count of the ladder (``MeasuredFusion``, the default) against the
step-time model's two or three candidates (``PredictedFusion``, its model fitted on the group's own layers).

For each workload (the e2e benchmark's and the bundled examples, at the surrogate scale they are tuned at), one
member configuration is drawn (seed 0) and the planners choose F on this machine with one torch thread, in
turns (``--rounds`` rounds, the order swapped each round), as ``HydroSearcher`` would before its first trial
(``--max-members``: e.g. 64 configurations over 2 trial slots): the ladder; the predicted candidates with the
model fitted in the planning (as ``PredictedFusion()`` does); the predicted candidates with a model fitted
beforehand (its best case: a model reused across groups, its fit's CPU time reported apart). Per planner: the F
chosen, the counts measured, the planning time (wall and this process's CPU time). Then the throughput of the
ladder's and the predicted planner's chosen F (the most frequent) is measured again, interleaved, and their ratio
reported (predicted ÷ ladder; 1.00 when both chose the same F): "as good" means the predicted plan's F trains as
fast as the ladder's.

    python -m benchmarks.fusion_planner [--rounds 2] [--max-members 32] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from benchmarks.transfer_fidelity import residual_mlp
from hydro.fusion_measure import measure_fusion
from hydro.profiling import fit_step_time_model
from hydro.trial.fusion import PLAN_STEPS, MeasuredFusion, PredictedFusion
from hydro.trial.surrogate import build_member
from hydro.tune.examples import char_lm, digits_cnn, digits_gru, digits_mlp
from hydro.tune.search.random_search import RandomSearch

WORKLOADS = {  # name -> (spec and space, the scale it is tuned at)
    "e2e-digits-mlp-1024/S8": (lambda: digits_mlp(hidden=1024), 8),
    "e2e-resmlp-wide-1024/S8": (lambda: residual_mlp(15, 1024), 8),
    "e2e-resmlp-wide-1024/S1": (lambda: residual_mlp(15, 1024), 1),
    "digits-mlp-512/S8": (lambda: digits_mlp(), 8),
    "digits-cnn/S8": (lambda: digits_cnn(), 8),
    "digits-gru/S8": (lambda: digits_gru(), 8),
    "char-lm/S8": (lambda: char_lm(), 8),
}
CPU = torch.device("cpu")
PLANNERS = {  # name -> a fresh planner of (spec, scale, data, max_members, a step-time model fitted beforehand)
    "ladder": lambda spec, scale, data, most, model: MeasuredFusion(spec, scale, data, most, 1, CPU),
    "predicted": lambda spec, scale, data, most, model: PredictedFusion(spec, scale, data, most, 1, device=CPU),
    "predicted, model reused": lambda spec, scale, data, most, model: PredictedFusion(spec, scale, data, most, 1,
                                                                                      model, CPU),
}


def fitted_model(spec, scale: int, data, config: dict):
    """The step-time model ``PredictedFusion`` fits on the group's member, and the CPU seconds fitting took."""
    template = build_member(spec.model, config, scale, shrink_options=spec.shrink_options())
    x, _ = data[0].sample(spec.batch_size_of(config))
    cpu = time.process_time()
    model = fit_step_time_model(template, x)
    return model, time.process_time() - cpu


def plan_once(make_planner, spec, scale: int, data, config: dict, max_members: int, model) -> dict:
    """One planning by a fresh planner: F, the counts it measured, wall and CPU seconds."""
    planner = make_planner(spec, scale, data, max_members, model)
    measured: list[int] = []
    original = planner.candidates

    def candidates(template, x):
        chosen = original(template, x)
        measured.extend(chosen or [])
        return chosen

    planner.candidates = candidates
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        count = planner.fusion_for("group", config)
    except ValueError as error:  # e.g. the step-time model cannot profile a recurrent layer
        return {"F": None, "refused": str(error), "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu}
    return {"F": count, "candidates": measured or "ladder", "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu}


def throughput_ratio(spec, scale: int, data, config: dict, counts: tuple[int, int], rounds: int = 3) -> float:
    """Member-samples/s at ``counts[0]`` ÷ at ``counts[1]``, measured in alternation (median of ``rounds``)."""
    if counts[0] == counts[1]:
        return 1.0
    template = build_member(spec.model, config, scale, shrink_options=spec.shrink_options())
    x, y = data[0].sample(spec.batch_size_of(config))
    speeds: dict[int, list[float]] = {c: [] for c in counts}
    for _ in range(rounds):
        for count in counts:
            m = measure_fusion(lambda: copy.deepcopy(template), (x, y), spec.loss, count, torch.device("cpu"),
                               PLAN_STEPS, min_time_s=0.2, clock=time.process_time, memory=False)
            speeds[count].append(m.samples_per_s)
    return statistics.median(speeds[counts[0]]) / statistics.median(speeds[counts[1]])


def main() -> None:
    parser = argparse.ArgumentParser(prog="fusion_planner")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-members", type=int, default=32)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    started, load_before = time.perf_counter(), os.getloadavg()
    rows = []
    for name in args.workloads.split(","):
        make, scale = WORKLOADS[name]
        spec, space = make()
        data = spec.load_data()
        config = RandomSearch(space, seed=0).suggest("member")
        try:
            model, fit_cpu_s = fitted_model(spec, scale, data, config)
        except ValueError:  # the planners that need it are refused below, with the reason
            model, fit_cpu_s = None, None
        runs: dict[str, list[dict]] = {p: [] for p in PLANNERS}
        for r in range(args.rounds):
            for planner in (PLANNERS if r % 2 == 0 else reversed(PLANNERS)):
                runs[planner].append(plan_once(PLANNERS[planner], spec, scale, data, config, args.max_members, model))
        chosen = {p: [run["F"] for run in rs] for p, rs in runs.items()}
        cpu = {p: statistics.median(run["cpu_s"] for run in rs) for p, rs in runs.items()}
        ladder_f, predicted_f = statistics.mode(chosen["ladder"]), statistics.mode(chosen["predicted"])
        row = {"workload": name, "runs": runs, "chosen_F": chosen, "median_cpu_s": cpu, "model_fit_cpu_s": fit_cpu_s,
               "ladder_F": ladder_f, "predicted_F": predicted_f,
               "throughput_ratio": None if predicted_f is None else throughput_ratio(spec, scale, data, config,
                                                                                      (predicted_f, ladder_f))}
        rows.append(row)
        print(f"{name}: F {chosen}; candidates {runs['predicted'][0].get('candidates')}; CPU s {cpu}; speed ratio "
              f"{row['throughput_ratio']}", flush=True)
    print(f"\nload average before {load_before}, after {os.getloadavg()}; one torch thread; max members "
          f"{args.max_members}; F per round, median CPU seconds of planning")
    print(f"{'workload':<26} {'ladder F':>10} {'CPU s':>6} {'predicted F':>12} {'CPU s':>6} {'reused F':>10} "
          f"{'CPU s':>6} {'speed of F':>10}")
    for r in rows:
        f, cpu = r["chosen_F"], r["median_cpu_s"]
        print(f"{r['workload']:<26} {str(f['ladder']):>10} {cpu['ladder']:>6.1f} {str(f['predicted']):>12} "
              f"{cpu['predicted']:>6.1f} {str(f['predicted, model reused']):>10} "
              f"{cpu['predicted, model reused']:>6.1f} "
              f"{'refused' if r['throughput_ratio'] is None else format(r['throughput_ratio'], '.2f') + 'x':>10}")
    meta = {"platform": platform.platform(), "torch": torch.__version__, "threads": 1, "rounds": args.rounds,
            "max_members": args.max_members, "load_average": [load_before, os.getloadavg()],
            "seconds": time.perf_counter() - started}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "fusion_planner.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
