"""Held-out error of the step-time model (PALEO FLOP rate vs the per-kind regressor) on this device.

Layers of a grid of shapes (Linear, Conv2d, BatchNorm2d, ReLU; batch 32..256) are timed fused F = 1, 4, 16
times (forward + backward, median of 5 rounds; the layers of each F take turns round by round); the model is
fitted on the even-indexed shapes of each kind and predicts the odd-indexed ones (held-out shapes, never timed
for the fit). Then whole training steps of the
example models (whose layers were not in the grid) are predicted and measured at several F, and the fusion
planner's two or three predicted candidates are compared with the full measured ladder of ``plan_fusion``
(the throughput of both chosen F re-measured the same way).

On CPU the default clock is ``thread``: one torch thread, timed by its own CPU time (``time.thread_time``), so a
machine shared with other work gives what an idle core would (``--clock wall`` for wall time).

    python benchmarks/step_time_prediction.py [--device cpu] [--clock thread|wall] [--out benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import hydro
from hydro.examples.models import CNN, MLP
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.fusion_measure import plan_fusion
from hydro.profiling import (device_name, measure_training_step, profile_layers, step_features, time_layers,
                             time_optimizer, training_tensors)
from schedulers.prediction.step_time import StepTimeModel, candidate_counts, median_error, memory_bytes

MEMBERS = (1, 4, 16)
LINEAR = [(32, 64, 64), (64, 64, 256), (64, 128, 128), (128, 256, 256), (64, 256, 512), (128, 512, 512),
          (256, 128, 1024), (32, 512, 256), (256, 784, 256), (128, 1024, 1024), (64, 96, 320), (256, 64, 64)]
CONV = [(32, 1, 16, 8), (64, 16, 32, 8), (32, 8, 8, 16), (64, 3, 16, 16), (32, 32, 32, 8), (64, 16, 16, 16),
        (32, 16, 64, 8), (64, 32, 32, 4)]  # (N, C_in, C_out, H=W), 3x3 padding 1
ELEMENTWISE = [(32, 16, 8), (64, 32, 8), (128, 16, 16), (64, 64, 4), (256, 8, 8), (32, 32, 16)]  # (N, C, H=W)
WORKLOADS = {
    "mlp-64-256-256-10": (lambda: MLP((64, 256, 256, 10)), lambda n: torch.randn(n, 64)),
    "mlp-784-512-512-10": (lambda: MLP((784, 512, 512, 10)), lambda n: torch.randn(n, 784)),
    "cnn-16-32": (CNN, lambda n: torch.randn(n, 1, 8, 8)),
}


def grid_layers() -> list[tuple[str, int, object]]:
    """(kind, index within kind, ProfiledLayer) for every shape of the grid."""
    rows = []
    for i, (n, fan_in, fan_out) in enumerate(LINEAR):
        rows.append(("Linear", i, profile_layers(nn.Linear(fan_in, fan_out), torch.randn(n, fan_in))[0]))
    for i, (n, c_in, c_out, hw) in enumerate(CONV):
        conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        rows.append(("Conv2d", i, profile_layers(conv, torch.randn(n, c_in, hw, hw))[0]))
    for i, (n, c, hw) in enumerate(ELEMENTWISE):
        rows.append(("BatchNorm2d", i, profile_layers(nn.BatchNorm2d(c), torch.randn(n, c, hw, hw))[0]))
        rows.append(("ReLU", i, profile_layers(nn.ReLU(), torch.randn(n, c, hw, hw))[0]))
    return rows


def error_row(model: StepTimeModel, kind: str, timings: list) -> dict:
    """Median relative errors of the regressor and of PALEO on ``timings``."""
    measured = [t.seconds for t in timings]
    return {"kind": kind, "held_out": len(timings),
            "regressor_median_error": median_error([model.layer_seconds(t.features, t.members) for t in timings],
                                                   measured),
            "paleo_median_error": median_error([model.paleo_seconds(t.features, t.members) for t in timings],
                                               measured)}


def measured_step(factory, x, y, members: int, device, clock) -> tuple[float, int]:
    model = hydro.fuse([factory() for _ in range(members)]).to(device)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=False)
        trial_losses(nn.CrossEntropyLoss(), model(x), y).sum().backward()
        optimizer.step()

    return measure_training_step(step, lambda: training_tensors(model, optimizer), device, steps=5, min_time_s=0.3,
                                 clock=clock)


def main() -> None:
    parser = argparse.ArgumentParser(prog="step_time_prediction")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--clock", choices=["thread", "wall"], default=None,
                        help="default: thread on CPU (one torch thread), wall on CUDA")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    clock_name = args.clock or ("thread" if device.type == "cpu" else "wall")
    if clock_name == "thread":
        if device.type != "cpu":
            parser.error("--clock thread counts CPU time and cannot time CUDA work; use --clock wall")
        torch.set_num_threads(1)
    clock = time.thread_time if clock_name == "thread" else time.perf_counter
    started = time.perf_counter()

    # 1. layers: fit on even-indexed shapes, predict the odd-indexed (held-out) ones
    train, held_out = [], []
    grid = grid_layers()
    for f in MEMBERS:
        timings = time_layers([layer for _, _, layer in grid], f, device, clock=clock)
        for (_, index, _), timing in zip(grid, timings):
            (train if index % 2 == 0 else held_out).append(timing)
    workload_models = {name: factory() for name, (factory, _) in WORKLOADS.items()}
    for f in MEMBERS:  # the optimizer pseudo-layer, timed on two parameter sizes not used below
        train.append(time_optimizer(MLP((32, 64, 10)), f, device, clock=clock))
        train.append(time_optimizer(MLP((128, 512, 10)), f, device, clock=clock))
    model = StepTimeModel.fit(device_name(device), train)
    kinds = sorted({t.features.kind for t in held_out})
    layer_rows = [error_row(model, kind, [t for t in held_out if t.features.kind == kind]) for kind in kinds]
    layer_rows.append(error_row(model, "all", held_out))

    # 2. whole training steps of the example models (batch 64), predicted from layer features only
    step_rows = []
    for name, (factory, make) in WORKLOADS.items():
        x = make(64).to(device)
        y = torch.randint(0, 10, (64,), device=device)
        features = step_features(workload_models[name], x)
        for f in MEMBERS:
            seconds, peak = measured_step(factory, x, y, f, device, clock)
            step_rows.append({"workload": name, "members": f, "measured_s": seconds,
                              "predicted_s": model.step_seconds(features, f),
                              "measured_bytes": peak, "predicted_bytes": memory_bytes(features, f)})
    for row in step_rows:
        row["error"] = abs(row["predicted_s"] - row["measured_s"]) / row["measured_s"]
        row["memory_error"] = abs(row["predicted_bytes"] - row["measured_bytes"]) / row["measured_bytes"]

    # 3. the fusion planner: measure the predicted candidates only vs the full ladder
    plan_rows = []
    for name, (factory, make) in WORKLOADS.items():
        x = make(64).to(device)
        y = torch.randint(0, 10, (64,), device=device)
        features = step_features(workload_models[name], x)
        candidates = candidate_counts(model, features, 64, max_members=64)
        t0 = time.perf_counter()
        ladder = plan_fusion(factory, (x, y), nn.CrossEntropyLoss(), max_members=64, steps=5, device=device)
        t1 = time.perf_counter()
        predicted = plan_fusion(factory, (x, y), nn.CrossEntropyLoss(), max_members=64, steps=5, device=device,
                                candidates=candidates)
        t2 = time.perf_counter()
        speed = {f: f * 64 / measured_step(factory, x, y, f, device, clock)[0]
                 for f in {ladder.num_members, predicted.num_members}}
        plan_rows.append({"workload": name, "candidates": candidates, "ladder_F": ladder.num_members,
                          "predicted_F": predicted.num_members,
                          "ladder_counts": [m.num_members for m in ladder.measurements],
                          "ladder_s": t1 - t0, "predicted_s": t2 - t1,
                          "throughput_ratio": speed[predicted.num_members] / speed[ladder.num_members]})

    print(f"device: {model.device}; clock {clock_name}; torch threads {torch.get_num_threads()}; "
          f"load average {os.getloadavg()}")
    print("\nlayer time on held-out shapes (median relative error, F in 1/4/16)")
    print(f"{'kind':<12} {'n':>4} {'regressor':>10} {'PALEO':>8}")
    for r in layer_rows:
        print(f"{r['kind']:<12} {r['held_out']:>4} {r['regressor_median_error']:>10.1%} "
              f"{r['paleo_median_error']:>8.1%}")
    print("\nwhole training step (batch 64), predicted from features vs measured")
    print(f"{'workload':<20} {'F':>3} {'measured ms':>12} {'predicted ms':>13} {'error':>7} {'mem error':>10}")
    for r in step_rows:
        print(f"{r['workload']:<20} {r['members']:>3} {1e3 * r['measured_s']:>12.2f} {1e3 * r['predicted_s']:>13.2f} "
              f"{r['error']:>7.1%} {r['memory_error']:>10.1%}")
    print(f"median step error: {statistics.median(r['error'] for r in step_rows):.1%}")
    print("\nplan_fusion: full ladder vs the model's candidates")
    print(f"{'workload':<20} {'ladder':>18} {'F':>3} {'s':>6} {'candidates':>12} {'F':>3} {'s':>6} {'speed ratio':>11}")
    for r in plan_rows:
        print(f"{r['workload']:<20} {str(r['ladder_counts']):>18} {r['ladder_F']:>3} {r['ladder_s']:>6.1f} "
              f"{str(r['candidates']):>12} {r['predicted_F']:>3} {r['predicted_s']:>6.1f} "
              f"{r['throughput_ratio']:>11.2f}")
    meta = {"device": model.device, "clock": clock_name, "platform": platform.platform(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
            "seconds": time.perf_counter() - started}
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"step_time_prediction_{device.type}.json"
    out.write_text(json.dumps({"meta": meta, "model": model.to_dict(), "layers": layer_rows, "steps": step_rows,
                               "plans": plan_rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
