"""One fused optimizer step over a CIFAR ResNet-18 shrunk S=8 (62 stacked parameters): the multi-tensor
(``torch._foreach_*``) step against the per-parameter loop it replaced (``tests/loop_optimizers.py``).

Reported per optimizer: aten operations dispatched and host reads of tensor values in one steady-state step
(deterministic CPU proxies: each operation is at least one kernel launch on a GPU, each read waits for it), the
same for a whole training step with a per-step warm-up + cosine schedule and per-member gradient clipping, and
the step-time ratio loop / multi-tensor (medians of interleaved steps, on the same machine and process).

    python -m benchmarks.optimizer_step [--members 4] [--steps 20] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import hydro
from hydro.examples.models import ResNet18
from hydro.trial.host_syncs import HostSyncCounter
from hydro.optim import SGD, AdamW, clip_grad_norm_
from hydro.optim import lr_scheduler as hsched
from tests.loop_optimizers import LOOP

OPTIMIZERS = {  # name -> (class, keyword arguments for F members)
    "SGD": (SGD, lambda f: dict(lr=[0.1 / (i + 1) for i in range(f)], momentum=0.9, weight_decay=5e-4)),
    "AdamW": (AdamW, lambda f: dict(lr=[1e-3 * (i + 1) for i in range(f)], weight_decay=1e-2)),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _training_step(fused, optimizer, schedule, x, y, members: int):
    def step():
        optimizer.zero_grad()
        nn.functional.cross_entropy(fused(x).flatten(0, 1), y.repeat(members)).backward()
        clip_grad_norm_(fused.parameters(), max_norm=[1.0] * members)
        optimizer.step()
        schedule.step()
    return step


def fused_resnet(members: int, device: torch.device) -> nn.Module:
    """F ResNet-18s shrunk S=8, fused (built anew each time: a copy would lose the µP shapes, hence µP's groups)."""
    torch.manual_seed(0)
    return hydro.fuse([hydro.shrink(ResNet18(), 8) for _ in range(members)]).to(device)


def measure(name: str, members: int, steps: int, device: torch.device) -> dict:
    cls, kwargs = OPTIMIZERS[name]
    row = {"optimizer": name, "members": members}
    runs = {}
    for label, make in (("loop", LOOP[cls]), ("foreach", cls)):
        fused = fused_resnet(members, device)
        for p in fused.parameters():
            p.grad = torch.randn_like(p)
        optimizer = make(fused.parameters(), **kwargs(members))
        optimizer.step()
        optimizer.step()
        with HostSyncCounter() as counts:
            optimizer.step()
        row[f"{label}_ops"], row[f"{label}_reads"] = counts.total, counts.reads
        row["groups"] = len(optimizer.param_groups)
        runs[label] = optimizer
        train = fused_resnet(members, device)
        train_opt = make(train.parameters(), **kwargs(members))
        schedule = hsched.SequentialLR(train_opt, [hsched.LinearLR(train_opt, start_factor=0.1, total_iters=5),
                                                   hsched.CosineAnnealingLR(train_opt, T_max=100)], [5])
        x = torch.randn(8, 3, 32, 32, device=device)
        y = torch.randint(0, 10, (8,), device=device)
        step = _training_step(train, train_opt, schedule, x, y, members)
        step()
        step()
        with HostSyncCounter() as counts:
            step()
        row[f"{label}_train_step_reads"] = counts.reads
    times: dict[str, list[float]] = {"loop": [], "foreach": []}
    for _ in range(steps):  # interleaved: load on the machine hits both alike
        for label, optimizer in runs.items():
            _sync(device)
            start = time.perf_counter()
            optimizer.step()
            _sync(device)
            times[label].append(time.perf_counter() - start)
    row["loop_ms"] = 1e3 * statistics.median(times["loop"])
    row["foreach_ms"] = 1e3 * statistics.median(times["foreach"])
    row["speedup"] = row["loop_ms"] / row["foreach_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4, help="F, the fused members")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each implementation (interleaved)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device={device} F={args.members} parameters=62 (ResNet-18 S=8) threads="
          f"{torch.get_num_threads()} load={load:.2f} torch={torch.__version__}")
    header = (f"{'optimizer':<9} {'ops loop':>9} {'ops foreach':>12} {'reads loop':>11} {'reads foreach':>14} "
              f"{'train-step reads loop/foreach':>30} {'ms loop':>8} {'ms foreach':>11} {'speed-up':>9}")
    print(header)
    print("-" * len(header))
    rows = []
    for name in OPTIMIZERS:
        row = measure(name, args.members, args.steps, device)
        rows.append(row)
        print(f"{name:<9} {row['loop_ops']:>9} {row['foreach_ops']:>12} {row['loop_reads']:>11} "
              f"{row['foreach_reads']:>14} {row['loop_train_step_reads']:>19} / {row['foreach_train_step_reads']:<8} "
              f"{row['loop_ms']:>8.2f} {row['foreach_ms']:>11.2f} {row['speedup']:>8.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "optimizer_step.json"
    path.write_text(json.dumps({"device": str(device), "members": args.members, "load": load, "rows": rows},
                               indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
