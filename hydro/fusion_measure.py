"""Fusion measurement: choose how many members to fuse from measured memory and throughput.

``plan_fusion`` trains fused models of 1, 2, 4, ... members for a few steps on the current device,
measures step time and peak memory, and returns the fusion count of highest total throughput
(member-samples/s) that fits the memory budget; near-ties (within ``tolerance``) go to the larger count,
which needs fewer fused trials. Memory on CUDA is the allocator's peak; on CPU it is parameters +
gradients + optimizer state + the tensors autograd saved for backward (measured, a lower bound of the
process's peak), since the CPU allocator keeps no statistics.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from hydro.binder import fuse
from hydro.checks import check, is_count
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.profiling import (free_memory_bytes, measure_training_step, throughput_clock, torch_threads,
                             training_tensors)


@dataclass
class FusionMeasurement:
    num_members: int
    step_time_s: float
    peak_bytes: int
    samples_per_s: float  # all members together


@dataclass
class FusionPlan:
    num_members: int
    device: str
    memory_budget_bytes: int
    reason: str
    measurements: list[FusionMeasurement] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def plan_fusion(model_factory: Callable[[], nn.Module], batch: tuple[Tensor, Tensor], loss_fn: Callable, *,
                max_members: int = 64, memory_budget_bytes: int | None = None, device: str | torch.device | None = None,
                steps: int = 3, tolerance: float = 0.05, threads: int | None = None,
                candidates: Sequence[int] | None = None) -> FusionPlan:
    """Measure fused training of ``model_factory()`` members on ``batch`` (inputs, targets) and pick F.

    ``max_members`` caps F (e.g. the number of configurations to run); ``memory_budget_bytes`` defaults to
    90% of free CUDA memory, or half of the available RAM on CPU. ``threads``: torch CPU threads to measure
    with, as many as the training will have (default: this process's setting). ``candidates``: the counts to
    measure (e.g. the two or three a step-time model predicts best), instead of the ladder 1, 2, 4, ...
    Steps are timed by :func:`~hydro.profiling.throughput_clock`: with one CPU thread by that thread's CPU time,
    so that a load spike during one count's steps does not make it look slower than the others.
    """
    _check_arguments(model_factory, batch, max_members, memory_budget_bytes, steps, tolerance, threads, candidates)
    with torch_threads(threads):
        return _plan(model_factory, batch, loss_fn, max_members, memory_budget_bytes, device, steps, tolerance,
                     candidates)


def _check_arguments(model_factory, batch, max_members, memory_budget_bytes, steps, tolerance, threads,
                     candidates) -> None:
    """Refuse arguments that cannot plan, before anything is measured."""
    if isinstance(model_factory, nn.Module) or not callable(model_factory):
        raise TypeError(f"plan_fusion: model_factory must be a function returning a new model (each member is "
                        f"built by it), got {type(model_factory).__name__}. Fix: lambda: copy.deepcopy(model)")
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, Tensor) for t in batch)):
        raise TypeError(f"plan_fusion: batch must be (inputs, targets) tensors, got {type(batch).__name__}")
    check("plan_fusion: ",
          ("max_members", max_members, is_count, "an int >= 1"),
          ("memory_budget_bytes", memory_budget_bytes, lambda v: v is None or v > 0, "None (the device's) or > 0"),
          ("steps", steps, is_count, "an int >= 1 (timed steps per count)"),
          ("tolerance", tolerance, lambda v: v >= 0, ">= 0 (1: the largest count that fits)"),
          ("threads", threads, lambda v: v is None or is_count(v), "None (this process's) or an int >= 1"),
          ("candidates", candidates,
           lambda v: v is None or (bool(v) and all(is_count(c) and c <= max_members for c in v)),
           f"None or a non-empty list of ints in 1..max_members ({max_members})"))


def _plan(model_factory, batch, loss_fn, max_members, memory_budget_bytes, device, steps, tolerance,
          candidates) -> FusionPlan:
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    budget = memory_budget_bytes if memory_budget_bytes is not None else _default_budget(device)
    candidates = sorted(set(candidates)) if candidates is not None else sorted(
        {*(2 ** k for k in range(max_members.bit_length()) if 2 ** k <= max_members), max_members})
    clock = throughput_clock(device)
    measurements: list[FusionMeasurement] = []
    reason = f"measured up to F={candidates[-1]} (max_members)"
    for count in candidates:
        if len(measurements) >= 2 and _predicted_bytes(measurements, count) > budget:
            reason = f"F={count} is predicted to need more than the {budget / 2**20:.0f} MiB budget"
            break
        m = measure_fusion(model_factory, batch, loss_fn, count, device, steps, clock=clock)
        if m.peak_bytes > budget:
            reason = f"F={count} needed {m.peak_bytes / 2**20:.0f} MiB > budget {budget / 2**20:.0f} MiB"
            break
        measurements.append(m)
        best = max(x.samples_per_s for x in measurements)
        if m.samples_per_s < (1 - 2 * tolerance) * best:
            reason = f"throughput saturated (F={count} is below the best measured)"
            break
    if not measurements:
        raise MemoryError(f"plan_fusion: even one member needs more than the memory budget of "
                          f"{budget / 2**20:.0f} MiB on {device}; use a smaller batch or model (e.g. hydro.shrink)")
    best = max(x.samples_per_s for x in measurements)
    chosen = max(x.num_members for x in measurements if x.samples_per_s >= (1 - tolerance) * best)
    return FusionPlan(chosen, str(device), int(budget), reason, measurements)


def extrapolated_plan(plan: FusionPlan, max_members: int, tolerance: float = 0.05) -> FusionPlan:
    """From a plan that measured F = 1 and 2 only: where two members fused lose no throughput (within
    ``tolerance``), the largest F <= ``max_members`` whose memory, extrapolated linearly from the two, fits the
    plan's budget (a prediction: a trial that runs out of memory splits its members); else the plan as is."""
    counts = [m.num_members for m in plan.measurements]
    if counts != [1, 2] or max_members <= 2:
        return plan
    one, two = plan.measurements
    if two.samples_per_s < (1 - tolerance) * one.samples_per_s:
        return plan
    fits = [f for f in range(max_members, 2, -1) if _predicted_bytes(plan.measurements, f) <= plan.memory_budget_bytes]
    if not fits:
        return plan
    return dataclasses.replace(plan, num_members=fits[0], reason=f"F={fits[0]} extrapolated from F=1 and 2 (memory "
                                                                 f"{_predicted_bytes(plan.measurements, fits[0]) / 2**20:.0f} MiB predicted)")


def _default_budget(device: torch.device) -> int:
    return int(0.9 * free_memory_bytes(device)) if device.type == "cuda" else free_memory_bytes(device) // 2


def _predicted_bytes(measurements: list[FusionMeasurement], count: int) -> float:
    """Linear extrapolation ``a + b F`` through the last two measurements."""
    (f0, m0), (f1, m1) = [(x.num_members, x.peak_bytes) for x in measurements[-2:]]
    slope = (m1 - m0) / (f1 - f0)
    return m1 + slope * (count - f1)


def measure_fusion(model_factory: Callable[[], nn.Module], batch: tuple[Tensor, Tensor], loss_fn: Callable,
                   count: int, device: torch.device, steps: int, min_time_s: float = 0.0,
                   clock: Callable[[], float] = time.perf_counter, memory: bool = True) -> FusionMeasurement:
    """Time ``count`` members of ``model_factory()`` fused, trained with SGD on ``batch`` (inputs ``[N, ...]``,
    targets) on ``device``: the mean step over at least ``steps`` steps and ``min_time_s`` seconds by ``clock``,
    and its peak memory (see :func:`~hydro.profiling.measure_training_step`; 0 on a CPU without ``memory``, which
    saves a step)."""
    inputs, targets = (t.to(device) for t in batch)
    model = fuse([model_factory() for _ in range(count)]).to(device)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        trial_losses(loss_fn, model(inputs), targets).sum().backward()
        optimizer.step()

    elapsed, peak = measure_training_step(step, (lambda: training_tensors(model, optimizer)) if memory else None,
                                          device, steps, min_time_s, clock)
    return FusionMeasurement(count, elapsed, peak, count * inputs.shape[0] / elapsed)


