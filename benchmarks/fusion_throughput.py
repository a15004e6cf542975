"""Training throughput of F models: sequential torch vs torch.func vmap ensemble vs hydro.fuse.

For each workload and F, one training step (forward, backward, SGD with momentum) of all F members on a
shared batch is timed; reported: samples/s per member (batch / step time), speed-up over sequential,
and peak memory (CUDA: allocator peak; CPU: resident tensors + peak live autograd-saved tensors).

    python benchmarks/fusion_throughput.py [--members 1 4 16 64] [--batch 64] [--device cpu]
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

import hydro
from hydro.examples.models import CNN, MLP, TransformerClassifier
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.planning import measure_training_step, optimized_tensors, training_tensors

WORKLOADS = {
    "mlp-784-256-256-10": (lambda: MLP((784, 256, 256, 10)), lambda b: torch.randn(b, 784), 10),
    "mlp-64-32-32-10": (lambda: MLP((64, 32, 32, 10)), lambda b: torch.randn(b, 64), 10),
    "cnn": (CNN, lambda b: torch.randn(b, 1, 8, 8), 10),
    "transformer": (TransformerClassifier, lambda b: torch.randint(0, 32, (b, 12)), 4),
}
LOSS = nn.CrossEntropyLoss()
MIN_TIME = 0.5  # seconds of timed steps per measurement


def sequential(models, x, y, device):
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for m in models]

    def step():
        for model, opt in zip(models, optimizers):
            opt.zero_grad(set_to_none=False)
            LOSS(model(x), y).backward()
            opt.step()

    return measure_training_step(step, lambda: [t for m, o in zip(models, optimizers)
                                                for t in training_tensors(m, o)], device, min_time_s=MIN_TIME)


def vmap_ensemble(models, x, y, device):
    params, buffers = stack_module_state(models)  # leaves [F, ...] that require grad
    base = copy.deepcopy(models[0]).to("meta")
    optimizer = torch.optim.SGD(list(params.values()), lr=1e-3, momentum=0.9)

    def member_loss(p, b, x_, y_):
        return LOSS(functional_call(base, (p, b), (x_,)), y_)

    batched = torch.vmap(member_loss, in_dims=(0, 0, None, None), randomness="different")

    def step():
        optimizer.zero_grad(set_to_none=False)
        batched(params, buffers, x, y).sum().backward()
        optimizer.step()

    return measure_training_step(step, lambda: [*optimized_tensors(optimizer), *buffers.values()], device,
                                 min_time_s=MIN_TIME)


def fused(models, x, y, device):
    model = hydro.fuse(models)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=False)
        trial_losses(LOSS, model(x), y).sum().backward()
        optimizer.step()

    return measure_training_step(step, lambda: training_tensors(model, optimizer), device, min_time_s=MIN_TIME)


METHODS = {"sequential": sequential, "vmap": vmap_ensemble, "hydro": fused}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64], help="batch sizes (shared by members)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell; the best is kept")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    header = f"{'workload':<20} {'batch':>5} {'F':>3} {'method':<11} {'samples/s/member':>17} {'vs seq':>7} {'peak MiB':>9}"
    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(header)
    print("-" * len(header))
    for name, batch, count in [(n, b, c) for n in args.workloads for b in args.batch for c in args.members]:
        factory, make_x, classes = WORKLOADS[name]
        torch.manual_seed(0)
        x, y = make_x(batch).to(device), torch.randint(0, classes, (batch,), device=device)
        seq_time = None
        for method, run in METHODS.items():
            best = None
            for _ in range(args.repeats):
                models = [factory().to(device) for _ in range(count)]
                try:
                    result = run(models, x, y, device)
                except RuntimeError as error:  # e.g. vmap cannot batch a layer's in-place buffer update
                    result = None
                    note = str(error).splitlines()[0][:80]
                best = result if best is None or (result and result[0] < best[0]) else best
            if best is None:
                rows.append({"workload": name, "batch": batch, "members": count, "method": method, "error": note})
                print(f"{name:<20} {batch:>5} {count:>3} {method:<11} failed: {note}")
                continue
            step_time, peak = best
            seq_time = step_time if method == "sequential" else seq_time
            row = {"workload": name, "batch": batch, "members": count, "method": method, "step_time_s": step_time,
                   "samples_per_s_per_member": batch / step_time, "speedup_vs_sequential": seq_time / step_time,
                   "peak_bytes": peak}
            rows.append(row)
            print(f"{name:<20} {batch:>5} {count:>3} {method:<11} {row['samples_per_s_per_member']:>17,.0f} "
                  f"{row['speedup_vs_sequential']:>6.2f}x {peak / 2**20:>9.1f}")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"fusion_throughput_{device.type}.json"
    meta = {"device": str(device), "threads": torch.get_num_threads(), "batches": args.batch, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine()}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
