"""One GPU suite: what a GPU session should run first, in priority order, within a time budget.

    python -m benchmarks.gpu_suite --budget-s 480            # on a GPU machine
    python -m benchmarks.gpu_suite --dry-run                 # the same on the CPU at toy sizes (CI)

Sections, each run only while the budget lasts (what did not fit is listed as skipped, with why):
  (a) tests:   the GPU test tier, ``pytest -m gpu tests/gpu`` (fused = members alone, optimizers, a real
               out-of-memory split, pinned-memory Datasets, CUDA RNG checkpoints, zero host syncs per step);
  (b) profile: one steady-state fused training step of a trial (``FusedTrial``, SGD with momentum) at F = 4 and
               32: aten operations, host syncs (counted by dispatch, and on CUDA by ``set_sync_debug_mode``), CUDA
               kernels and launches, and the GPU's idle share of the step (``torch.profiler``);
  (c) table:   the fused-layer table (``benchmarks/fusion_throughput.py``'s methods): ResNet-18 S=8 fp32/bf16
               with NCHW and channels_last (cuDNN autotune off/on), Transformer S=8 with TF32 off/on and bf16,
               hydro eager / compiled / CUDA-graphed, sequential eager / compiled / CUDA-graphed, vmap;
  (d) e2e:     the small end-to-end tuning run (``benchmarks/e2e_tuning.py --quick``), only if Ray imports.

Ray on a GPU machine without it: build the offline bundle on a machine with PyPI access
(``echo /.gpu-bundle/ >> .git/info/exclude && bash /work/shared/tools/ray-gpu-bundle.sh .gpu-bundle``), copy
``.gpu-bundle`` along with the checkout, and on the GPU machine ``source .gpu-bundle/install.sh`` (unpacks Ray and
Optuna into /tmp/site and exports PYTHONPATH) before running this suite.

Writes ``gpu_suite_<device>.json`` and ``gpu_suite_<device>.md`` under ``--out`` (``benchmarks/results``; the
dry run's files end in ``_dry``) and prints where each second went.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from benchmarks import fusion_throughput as throughput
from hydro.trial.backend import MemoryFormat, batch_in, set_backend_flags, to_memory_format
from hydro.trial.host_syncs import HostSyncCounter
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.precision import Precision, autocast
from hydro.trial.spec import TuneSpec
from hydro.trial.unit import FusedTrial

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("tests", "profile", "table", "e2e")
BUNDLE_HINT = ("Ray is not importable: build the offline bundle where PyPI is reachable (bash "
               "/work/shared/tools/ray-gpu-bundle.sh .gpu-bundle), copy .gpu-bundle with the checkout, then "
               "`source .gpu-bundle/install.sh` on the GPU machine and rerun")


@dataclass(frozen=True)
class Sizes:
    """The workloads and sizes of a run: the GPU's, or the dry run's toy ones on the CPU."""

    image: str          # fusion_throughput workload names
    sequence: str
    batch: int
    members: int        # F of the table
    profile_members: tuple[int, ...]
    min_time_s: float   # timed seconds per table cell
    cell_s: float       # the least budget a table cell needs to start (a compiled cell: 4x)


GPU_SIZES = Sizes("resnet18-s8", "transformer-s8", 256, 64, (4, 32), 0.5, 15.0)
DRY_SIZES = Sizes("cnn", "transformer", 8, 2, (2, 4), 0.01, 0.5)


@dataclass(frozen=True)
class Cell:
    """One row of the fused-layer table."""

    workload: str
    method: str                     # fusion_throughput.METHODS
    precision: Precision = Precision.FP32
    memory_format: MemoryFormat = MemoryFormat.CONTIGUOUS
    tf32: bool | None = None
    cudnn_benchmark: bool = False
    compile: bool | str = False     # the hydro model's, or each sequential member's; a string: torch.compile mode
    members: int | None = None      # None: Sizes.members

    def name(self) -> str:
        parts = [self.workload, self.method, str(self.precision), str(self.memory_format)]
        parts += [f"tf32={self.tf32}"] if self.tf32 is not None else []
        parts += ["cudnn.benchmark"] if self.cudnn_benchmark else []
        parts += [f"compile={self.compile}"] if self.compile else []
        return " ".join(parts + ([f"F={self.members}"] if self.members else []))


def table_cells(sizes: Sizes) -> list[Cell]:
    """The table's cells in priority order: the goals' cells first, baselines next, compiled cells last."""
    image, sequence, bf16, last = sizes.image, sizes.sequence, Precision.BF16, MemoryFormat.CHANNELS_LAST
    return [
        Cell(image, "hydro"), Cell(image, "hydro", memory_format=last),
        Cell(image, "hydro", bf16), Cell(image, "hydro", bf16, last),
        Cell(image, "hydro", bf16, last, cudnn_benchmark=True),
        Cell(sequence, "hydro", tf32=False), Cell(sequence, "hydro", tf32=True), Cell(sequence, "hydro", bf16),
        Cell(image, "sequential", bf16), Cell(sequence, "sequential", bf16),
        Cell(image, "hydro", bf16, members=1), Cell(image, "sequential", bf16, members=1),
        Cell(image, "vmap", bf16), Cell(sequence, "vmap", bf16),
        Cell(sequence, "hydro", bf16, compile=True), Cell(image, "hydro", bf16, last, compile=True),
        Cell(sequence, "hydro", bf16, compile="reduce-overhead"),
        Cell(sequence, "sequential", bf16, compile=True), Cell(sequence, "sequential", bf16, compile="reduce-overhead"),
        Cell(image, "sequential", bf16, last, compile="reduce-overhead"),
    ]


@dataclass
class Budget:
    """Seconds left of ``total`` since the suite started, and where they went."""

    total: float
    start: float = field(default_factory=time.perf_counter)
    spent: dict[str, float] = field(default_factory=dict)

    def left(self) -> float:
        return self.total - (time.perf_counter() - self.start)

    @contextlib.contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start


def run_tests(budget: Budget) -> dict:
    """(a) ``pytest -m gpu tests/gpu`` in a child process (skipped tests on a machine without CUDA)."""
    with tempfile.TemporaryDirectory() as directory:
        report = Path(directory) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                   f"--junitxml={report}", "-o", "addopts="]
        timeout = max(1.0, budget.left() / 2)  # the tier may use half the budget: the sections after it matter too
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        except subprocess.TimeoutExpired:
            return {"status": "timed out", "timeout_s": timeout}
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if report.exists():
            suite = ElementTree.parse(report).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {key: int(suite.get(key, 0)) for key in counts}
        failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
        return {"status": "ran", "returncode": done.returncode, **counts,
                "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                "failed_tests": failed, "tail": done.stdout.splitlines()[-3:]}


def _trial(sizes: Sizes, members: int, device: torch.device) -> FusedTrial:
    """A fused trial of ``members`` copies of the image workload's model (SGD with momentum, per-member lr) on a
    synthetic split of 8 batches."""
    factory, make_x, classes = throughput.WORKLOADS[sizes.image]
    torch.manual_seed(0)
    template = factory()
    x, y = make_x(8 * sizes.batch), torch.randint(0, classes, (8 * sizes.batch,))
    spec = TuneSpec(model=lambda config: copy.deepcopy(template), data=lambda: ((x, y), (x, y)),
                    loss=nn.CrossEntropyLoss(), batch_size=sizes.batch, device=str(device),
                    optimizer=lambda params, config: torch.optim.SGD(params, lr=config["lr"], momentum=0.9))
    configs = [(f"m{i}", {"lr": 0.01 * (1 + i % 4)}) for i in range(members)]
    return FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, configs), spec.data())


def _busy_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``intervals``."""
    busy, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def profile_step(sizes: Sizes, members: int, device: torch.device) -> dict:
    """(b) One steady-state training step of a fused trial: counts and the GPU's idle share."""
    trial = _trial(sizes, members, device)
    for _ in range(3):  # optimizer state, training mode, cuDNN's choices
        trial.train_step()
    with HostSyncCounter() as counter:
        trial.train_step()
    row = {"members": members, "aten_ops": sum(n for k, n in counter.ops.items() if k.startswith("aten.")),
           "host_syncs_dispatch": sum(counter.syncs().values()), "syncs": counter.syncs()}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trial.train_step()
                torch.cuda.synchronize(device)  # not counted: set_sync_debug_mode ignores explicit synchronize
            finally:
                torch.cuda.set_sync_debug_mode("default")
        row["host_syncs_cuda"] = sum("synchroniz" in str(w.message) for w in caught)
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        trial.train_step()
        if cuda:
            torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
    events = prof.events()
    row["step_s"] = wall
    if cuda:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        row["kernels"] = len(kernels)
        row["launches"] = sum(e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                         "cuLaunchKernelEx", "cudaGraphLaunch") for e in events)
        intervals = [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in kernels]
        span = (max(s for _, s in intervals) - min(s for s, _ in intervals)) if intervals else 0.0
        row["gpu_busy_s"] = _busy_s(intervals)
        row["gpu_idle_share"] = 1 - row["gpu_busy_s"] / wall if wall else None
        row["gpu_kernel_span_s"] = span
    return row


def measure_cell(cell: Cell, sizes: Sizes, device: torch.device) -> dict:
    """(c) One cell of the table with fusion_throughput's methods (its best of one measurement)."""
    factory, make_x, classes = throughput.WORKLOADS[cell.workload]
    count = cell.members or sizes.members
    torch.manual_seed(0)
    template = factory()
    x = batch_in(make_x(sizes.batch).to(device), cell.memory_format)
    y = torch.randint(0, classes, (sizes.batch,), device=device)
    models = [copy.deepcopy(template).to(device) for _ in range(count)]
    throughput.CAST = lambda: autocast(device, cell.precision)
    throughput.MIN_TIME = sizes.min_time_s
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    set_backend_flags(device, cell.tf32, cell.cudnn_benchmark)
    try:
        if cell.method == "hydro":
            step_s, peak = throughput.fused(models, x, y, device, cell.compile, cell.memory_format)
        else:
            to_memory_format(models, cell.memory_format)
            if cell.compile and cell.method == "sequential":
                mode = cell.compile if isinstance(cell.compile, str) else None
                models = [torch.compile(m, mode=mode) for m in models]
            step_s, peak = throughput.METHODS[cell.method](models, x, y, device)
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = flags
        del models
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"step_time_s": step_s, "model_samples_per_s": count * sizes.batch / step_s, "peak_bytes": peak,
            "members": count, "batch": sizes.batch}


def run_e2e(budget: Budget, device: torch.device, dry_run: bool) -> dict:
    """(d) The small end-to-end tuning run, in a child process, if Ray imports."""
    if importlib.util.find_spec("ray") is None:
        return {"status": "skipped", "why": BUNDLE_HINT}
    if dry_run:
        options = ["--quick", "--samples", "2", "--epochs", "1", "--hidden", "16", "--runs", "a", "--concurrency", "1"]
    else:
        options = ["--quick", "--runs", "ab", "--device", "cuda", "--gpus-per-trial", "0.25", "--concurrency", "4"]
    with tempfile.TemporaryDirectory() as storage:
        command = [sys.executable, "-m", "benchmarks.e2e_tuning", *options, "--storage", storage]
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, budget.left()),
                                  env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"})
        except subprocess.TimeoutExpired:
            return {"status": "timed out", "command": " ".join(command[1:])}
    return {"status": "ran", "returncode": done.returncode, "command": " ".join(command[1:]),
            "tail": (done.stdout + done.stderr).splitlines()[-12:]}


def run_suite(args: argparse.Namespace) -> dict:
    """Every section in priority order within ``args.budget_s``; the results and where the time went."""
    device = torch.device("cpu" if args.dry_run else args.device)
    sizes = DRY_SIZES if args.dry_run else GPU_SIZES
    budget = Budget(args.budget_s)
    results: dict = {"meta": _meta(device, args), "skipped": []}

    def section(name: str, run: Callable[[], object], needs_s: float) -> None:
        if name not in args.sections:
            return
        if budget.left() < needs_s:
            results["skipped"].append({"what": name, "why": f"budget: {budget.left():.0f} s left"})
            return
        print(f"== ({'abcd'[SECTIONS.index(name)]}) {name}: {budget.left():.0f} s left", flush=True)
        with budget.timed(name):
            results[name] = run()

    def profile() -> list[dict]:
        rows = []
        for members in sizes.profile_members:
            rows.append(profile_step(sizes, members, device))
            print(f"   F={members}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in rows[-1].items() if k != "syncs"), flush=True)
        return rows

    def table() -> list[dict]:
        rows = []
        for cell in table_cells(sizes):
            if cell.compile and args.dry_run:
                results["skipped"].append({"what": cell.name(), "why": "dry run: compiling takes minutes on a CPU"})
                continue
            needs = sizes.cell_s * (4 if cell.compile else 1)
            if budget.left() < needs:
                results["skipped"].append({"what": cell.name(), "why": f"budget: {budget.left():.0f} s left"})
                continue
            start = time.perf_counter()
            try:
                row = {"cell": cell.name(), **measure_cell(cell, sizes, device)}
            except (RuntimeError, torch.OutOfMemoryError) as error:  # e.g. vmap cannot batch BatchNorm's update
                row = {"cell": cell.name(), "error": str(error).splitlines()[0][:160]}
            row["seconds"] = time.perf_counter() - start
            budget.spent[f"table: {cell.name()}"] = row["seconds"]
            rows.append(row)
            shown = f"{row['model_samples_per_s']:>12,.0f} model-samples/s" if "error" not in row else row["error"]
            print(f"   {cell.name():<70} {shown}", flush=True)
        return rows

    section("tests", lambda: run_tests(budget), 5.0)
    section("profile", profile, 2 * sizes.cell_s)
    section("table", table, sizes.cell_s)
    section("e2e", lambda: run_e2e(budget, device, args.dry_run), 30.0 if args.dry_run else 120.0)
    results["seconds"] = {"total": time.perf_counter() - budget.start,
                          **{k: v for k, v in budget.spent.items() if not k.startswith("table: ")},
                          "table cells": {k[len("table: "):]: v for k, v in budget.spent.items()
                                          if k.startswith("table: ")}}
    return results


def _meta(device: torch.device, args: argparse.Namespace) -> dict:
    meta = {"device": str(device), "dry_run": args.dry_run, "budget_s": args.budget_s, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(device)
    return meta


def markdown(results: dict) -> str:
    """The suite's results as a markdown report."""
    meta, lines = results["meta"], []
    lines += [f"# GPU suite on {meta.get('gpu', meta['device'])}" + (" (dry run)" if meta["dry_run"] else ""), "",
              f"torch {meta['torch']}, budget {meta['budget_s']:.0f} s, {results['seconds']['total']:.0f} s used", ""]
    if "tests" in results:
        tests = results["tests"]
        lines += ["## (a) GPU test tier", "", f"{tests.get('passed', 0)} passed, {tests.get('failures', 0)} failed, "
                  f"{tests.get('errors', 0)} errors, {tests.get('skipped', 0)} skipped ({tests['status']})", ""]
        lines += [f"- {line}" for line in tests.get("failed_tests", [])] + [""]
    if "profile" in results:
        keys = [k for k in results["profile"][0] if k != "syncs"]
        lines += ["## (b) One fused training step", "", "| " + " | ".join(keys) + " |",
                  "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(_cell(row.get(k)) for k in keys) + " |" for row in results["profile"]] + [""]
    if "table" in results:
        lines += ["## (c) Fused-layer table", "", "| cell | model-samples/s | step ms | peak MiB |", "|---|---|---|---|"]
        for row in results["table"]:
            if "error" in row:
                lines.append(f"| {row['cell']} | failed: {row['error']} | | |")
            else:
                lines.append(f"| {row['cell']} | {row['model_samples_per_s']:,.0f} | {row['step_time_s'] * 1e3:.2f} "
                             f"| {row['peak_bytes'] / 2**20:.1f} |")
        lines.append("")
    if "e2e" in results:
        lines += ["## (d) End-to-end", "", f"{results['e2e']['status']}: {results['e2e'].get('why', '')}", "",
                  "```", *results["e2e"].get("tail", []), "```", ""]
    lines += ["## Skipped", ""] + [f"- {s['what']}: {s['why']}" for s in results["skipped"]] + [""]
    lines += ["## Where the time went", "", "| what | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in results["seconds"].items() if isinstance(v, float)]
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds for the whole suite")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU at toy sizes (no compiled cells)")
    parser.add_argument("--device", default="cuda", help="the GPU to measure (ignored with --dry-run)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --dry-run (the CPU at toy sizes) or on a GPU machine")
    results = run_suite(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpu_suite_{torch.device(results['meta']['device']).type}{'_dry' if args.dry_run else ''}"
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str))
    stem.with_suffix(".md").write_text(markdown(results))
    print("\nwhere the time went:")
    total = results["seconds"]["total"]
    for name, seconds in results["seconds"].items():
        if isinstance(seconds, float):
            print(f"  {name:<10} {seconds:8.1f} s  {seconds / max(total, 1e-9):6.1%}")
    for name, seconds in results["seconds"]["table cells"].items():
        print(f"    {name:<70} {seconds:6.1f} s")
    for skipped in results["skipped"]:
        print(f"  skipped {skipped['what']}: {skipped['why']}")
    print(f"wrote {stem.with_suffix('.json')} and {stem.with_suffix('.md')}")


if __name__ == "__main__":
    main()
