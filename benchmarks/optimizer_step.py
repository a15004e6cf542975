"""One fused optimizer step over a CIFAR ResNet-18 shrunk S=8 (62 stacked parameters): the multi-tensor
(``torch._foreach_*``) step against the per-parameter loop it replaced (``tests/loop_optimizers.py``).

Reported per optimizer: aten operations dispatched and host reads of tensor values in one steady-state step
(deterministic CPU proxies: each operation is at least one kernel launch on a GPU, each read waits for it), the
same for a whole training step with a per-step warm-up + cosine schedule and per-member gradient clipping, and
the step-time ratio loop / multi-tensor (medians of interleaved steps, on the same machine and process).

On the CPU a second table: nanoseconds per parameter (element) of one step over all members, for torch's
optimizer on each member alone (default and ``fused=True``) and Hydro's (multi-tensor and ``cpu_kernel``: torch's
fused kernel member by member), medians of interleaved steps.

    python -m benchmarks.optimizer_step [--members 4] [--steps 20] [--device cpu] [--threads 1]
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
TORCH = {"SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}


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
        optimizer = make(fused.parameters(), **kwargs(members), cpu_kernel=False)
        optimizer.step()
        optimizer.step()
        with HostSyncCounter() as counts:
            optimizer.step()
        row[f"{label}_ops"], row[f"{label}_reads"] = counts.total, counts.reads
        row["groups"] = len(optimizer.param_groups)
        runs[label] = optimizer
        train = fused_resnet(members, device)
        train_opt = make(train.parameters(), **kwargs(members), cpu_kernel=False)
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
    times = _interleaved({label: optimizer.step for label, optimizer in runs.items()}, steps, device)
    row["loop_ms"] = 1e3 * times["loop"]
    row["foreach_ms"] = 1e3 * times["foreach"]
    row["speedup"] = row["loop_ms"] / row["foreach_ms"]
    return row


def _interleaved(steps_by_label: dict, steps: int, device: torch.device) -> dict[str, float]:
    """The median seconds of each labelled step, timed ``steps`` times in turn (load on the machine hits all
    alike)."""
    times: dict[str, list[float]] = {label: [] for label in steps_by_label}
    for _ in range(steps):
        for label, step in steps_by_label.items():
            _sync(device)
            start = time.perf_counter()
            step()
            _sync(device)
            times[label].append(time.perf_counter() - start)
    return {label: statistics.median(t) for label, t in times.items()}


KERNEL_LABELS = ("torch", "torch_fused", "hydro_multi_tensor", "hydro_kernel")


def measure_cpu_kernel(name: str, members: int, steps: int) -> dict:
    """Nanoseconds per parameter element of one step over all ``members`` of the fused ResNet on the CPU: torch's
    optimizer on each member's own tensors alone (its default, then ``fused=True``; one parameter group, without
    µP's), Hydro's multi-tensor step and its per-member fused kernel (``cpu_kernel``)."""
    cls, kwargs = OPTIMIZERS[name]
    cpu = torch.device("cpu")
    member_kwargs = [{k: v[m] if isinstance(v, list) else v for k, v in kwargs(members).items()}
                     for m in range(members)]
    steppers = {}
    for label in KERNEL_LABELS:
        fused = fused_resnet(members, cpu)
        params = list(fused.parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        if label.startswith("hydro"):
            steppers[label] = cls(params, **kwargs(members), cpu_kernel=label == "hydro_kernel").step
            continue
        alone = [[p[m].detach().clone() for p in params] for m in range(members)]
        for t in (t for tensors in alone for t in tensors):
            t.grad = torch.randn_like(t)
        optimizers = [TORCH[name](tensors, fused=True if label == "torch_fused" else None, **member_kwargs[m])
                      for m, tensors in enumerate(alone)]
        steppers[label] = lambda optimizers=optimizers: [o.step() for o in optimizers]
    elements = sum(p.numel() for p in params)
    for step in steppers.values():  # state created
        step()
    times = _interleaved(steppers, steps, cpu)
    return {"optimizer": name, "members": members, "elements": elements,
            **{f"{label}_ns": 1e9 * times[label] / elements for label in KERNEL_LABELS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=4, help="F, the fused members")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each implementation (interleaved)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
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
    kernel_rows = []
    if device.type == "cpu":
        header = f"{'optimizer':<9} {'elements':>9} " + " ".join(f"{label + ' ns':>21}" for label in KERNEL_LABELS)
        print(f"\nns per parameter element of one step over all members\n{header}\n{'-' * len(header)}")
        for name in OPTIMIZERS:
            row = measure_cpu_kernel(name, args.members, args.steps)
            kernel_rows.append(row)
            print(f"{name:<9} {row['elements']:>9} "
                  + " ".join(f"{row[label + '_ns']:>21.3f}" for label in KERNEL_LABELS))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "optimizer_step.json"
    path.write_text(json.dumps({"device": str(device), "members": args.members, "load": load, "rows": rows,
                                "cpu_kernel_rows": kernel_rows}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
