"""Training throughput of F models: sequential torch vs torch.func vmap ensemble vs hydro.fuse.

For each workload and F, one training step (forward, backward, SGD with momentum) of all F members on a
shared batch is timed; reported: samples/s per member (batch / step time), model-samples/s (all F members
together), speed-up over sequential, peak memory (CUDA: allocator peak; CPU: resident tensors + peak live
autograd-saved tensors) and that peak per member.

    python benchmarks/fusion_throughput.py [--members 1 4 16 64] [--batch 64] [--device cpu]
    python benchmarks/fusion_throughput.py --suite gpu --device cuda --precision bf16 [--compile]
        # the GPU suite: CIFAR ResNet-18, Transformer (d 512) and MLP 784-4096-4096-10, each shrunk S=8 (µP),
        # batch 256, F in 1 8 32 64 256

``--precision bf16`` runs forward and loss under autocast for all three methods; ``--compile`` compiles the
hydro fused model only (``torch.compile``; sequential and vmap run eagerly).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import platform
from pathlib import Path

import torch
from torch import nn
from torch.func import functional_call, stack_module_state

import hydro
from hydro.examples.models import CNN, MLP, ResNet18, TransformerClassifier
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.profiling import measure_training_step, optimized_tensors, training_tensors
from hydro.trial.backend import MemoryFormat, to_memory_format
from hydro.trial.precision import Precision, autocast

WORKLOADS = {
    "mlp-784-256-256-10": (lambda: MLP((784, 256, 256, 10)), lambda b: torch.randn(b, 784), 10),
    "mlp-64-32-32-10": (lambda: MLP((64, 32, 32, 10)), lambda b: torch.randn(b, 64), 10),
    "cnn": (CNN, lambda b: torch.randn(b, 1, 8, 8), 10),
    "transformer": (TransformerClassifier, lambda b: torch.randint(0, 32, (b, 12)), 4),
    # the GPU suite: full-size models shrunk to their S=8 µP surrogates
    "resnet18-s8": (lambda: hydro.shrink(ResNet18(), 8), lambda b: torch.randn(b, 3, 32, 32), 10),
    "transformer-s8": (lambda: hydro.shrink(TransformerClassifier(1000, 512, 8, 2, 2048, 10, max_len=128), 8),
                       lambda b: torch.randint(0, 1000, (b, 128)), 10),
    "mlp-4096-s8": (lambda: hydro.shrink(MLP((784, 4096, 4096, 10)), 8), lambda b: torch.randn(b, 784), 10),
}
SUITES = {  # workloads, members, batch sizes
    "small": (["mlp-784-256-256-10", "mlp-64-32-32-10", "cnn", "transformer"], [1, 4, 16, 64], [16, 64]),
    "gpu": (["resnet18-s8", "transformer-s8", "mlp-4096-s8"], [1, 8, 32, 64, 256], [256]),
}
LOSS = nn.CrossEntropyLoss()
MIN_TIME = 0.5  # seconds of timed steps per measurement
CAST = contextlib.nullcontext  # forward and loss context: set from --device/--precision in main()


def sequential(models, x, y, device, compile_model=False):
    optimizers = [torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9) for m in models]

    def step():
        for model, opt in zip(models, optimizers):
            opt.zero_grad(set_to_none=False)
            with CAST():
                loss = LOSS(model(x), y)
            loss.backward()
            opt.step()

    return measure_training_step(step, lambda: [t for m, o in zip(models, optimizers)
                                                for t in training_tensors(m, o)], device, min_time_s=MIN_TIME)


def vmap_ensemble(models, x, y, device, compile_model=False):
    params, buffers = stack_module_state(models)  # leaves [F, ...] that require grad
    base = copy.deepcopy(models[0]).to("meta")
    optimizer = torch.optim.SGD(list(params.values()), lr=1e-3, momentum=0.9)

    def member_loss(p, b, x_, y_):
        return LOSS(functional_call(base, (p, b), (x_,)), y_)

    batched = torch.vmap(member_loss, in_dims=(0, 0, None, None), randomness="different")

    def step():
        optimizer.zero_grad(set_to_none=False)
        with CAST():
            losses = batched(params, buffers, x, y)
        losses.sum().backward()
        optimizer.step()

    return measure_training_step(step, lambda: [*optimized_tensors(optimizer), *buffers.values()], device,
                                 min_time_s=MIN_TIME)


def fused(models, x, y, device, compile_model=False, memory_format=MemoryFormat.CONTIGUOUS):
    """``compile_model``: False, True, or a ``torch.compile`` mode (e.g. ``"reduce-overhead"``: CUDA graphs)."""
    model = hydro.fuse(models)
    to_memory_format([model], memory_format)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)
    mode = compile_model if isinstance(compile_model, str) else None
    forward = torch.compile(model, mode=mode) if compile_model else model

    def step():
        optimizer.zero_grad(set_to_none=False)
        with CAST():
            losses = trial_losses(LOSS, forward(x), y)
        losses.sum().backward()
        optimizer.step()

    return measure_training_step(step, lambda: training_tensors(model, optimizer), device, min_time_s=MIN_TIME)


METHODS = {"sequential": sequential, "vmap": vmap_ensemble, "hydro": fused}


def main() -> None:
    global CAST
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=list(SUITES), default="small",
                        help="default workloads, F and batch sizes (the options below override them)")
    parser.add_argument("--members", type=int, nargs="+")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS))
    parser.add_argument("--batch", type=int, nargs="+", help="batch sizes (shared by members)")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per cell; the best is kept")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", choices=[Precision.FP32.value, Precision.BF16.value], default="fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile the hydro fused model")
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    workloads, members, batches = SUITES[args.suite]
    args.workloads, args.members, args.batch = args.workloads or workloads, args.members or members, args.batch or batches
    device, precision = torch.device(args.device), Precision(args.precision)
    CAST = lambda: autocast(device, precision)  # noqa: E731
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    rows = []
    header = (f"{'workload':<20} {'batch':>5} {'F':>3} {'method':<11} {'samples/s/member':>17} {'model-samples/s':>16} "
              f"{'vs seq':>7} {'peak MiB':>9} {'MiB/member':>10}")
    print(f"device={device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.machine()}) "
          f"precision={precision} compile={args.compile} cudnn.benchmark={args.cudnn_benchmark} "
          f"threads={torch.get_num_threads()} torch={torch.__version__}")
    print(header)
    print("-" * len(header))
    for name, batch, count in [(n, b, c) for n in args.workloads for b in args.batch for c in args.members]:
        factory, make_x, classes = WORKLOADS[name]
        torch.manual_seed(0)
        template = factory()  # built (and shrunk) once: copies time the same, and a Transformer's shrink takes 1 s
        x, y = make_x(batch).to(device), torch.randint(0, classes, (batch,), device=device)
        seq_time = None
        for method, run in METHODS.items():
            best, note = None, ""
            for _ in range(args.repeats):
                models = [copy.deepcopy(template).to(device) for _ in range(count)]
                try:
                    result = run(models, x, y, device, compile_model=args.compile)
                except RuntimeError as error:  # e.g. vmap cannot batch a layer's in-place buffer update; OOM
                    result = None
                    note = str(error).splitlines()[0][:80]
                del models
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                best = result if best is None or (result and result[0] < best[0]) else best
            if best is None:
                rows.append({"workload": name, "batch": batch, "members": count, "method": method, "error": note})
                print(f"{name:<20} {batch:>5} {count:>3} {method:<11} failed: {note}")
                continue
            step_time, peak = best
            seq_time = step_time if method == "sequential" else seq_time
            row = {"workload": name, "batch": batch, "members": count, "method": method, "step_time_s": step_time,
                   "samples_per_s_per_member": batch / step_time, "model_samples_per_s": count * batch / step_time,
                   "speedup_vs_sequential": seq_time / step_time if seq_time else None, "peak_bytes": peak,
                   "peak_bytes_per_member": peak / count}
            rows.append(row)
            speedup = f"{row['speedup_vs_sequential']:>6.2f}x" if seq_time else f"{'-':>7}"
            print(f"{name:<20} {batch:>5} {count:>3} {method:<11} {row['samples_per_s_per_member']:>17,.0f} "
                  f"{row['model_samples_per_s']:>16,.0f} {speedup} {peak / 2**20:>9.1f} {peak / count / 2**20:>10.2f}",
                  flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "" if precision is Precision.FP32 and not args.compile and args.suite == "small" else \
        f"_{args.suite}_{precision}{'_compile' if args.compile else ''}"
    out = args.out / f"fusion_throughput_{device.type}{suffix}.json"
    meta = {"device": str(device), "threads": torch.get_num_threads(), "batches": args.batch, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "precision": str(precision),
            "compile": args.compile, "cudnn_benchmark": args.cudnn_benchmark, "suite": args.suite}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
