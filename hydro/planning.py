"""Fusion planning: choose how many members to fuse from measured memory and throughput.

``plan_fusion`` trains fused models of 1, 2, 4, ... members for a few steps on the current device,
measures step time and peak memory, and returns the fusion count of highest total throughput
(member-samples/s) that fits the memory budget; near-ties (within ``tolerance``) go to the larger count,
which needs fewer fused trials. Memory on CUDA is the allocator's peak; on CPU it is parameters +
gradients + optimizer state + the tensors autograd saved for backward (measured, a lower bound of the
process's peak), since the CPU allocator keeps no statistics.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from hydro.binder import fuse
from hydro.loss import trial_losses
from hydro.optim import SGD


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
                steps: int = 3, tolerance: float = 0.05, threads: int | None = None) -> FusionPlan:
    """Measure fused training of ``model_factory()`` members on ``batch`` (inputs, targets) and pick F.

    ``max_members`` caps F (e.g. the number of configurations to run); ``memory_budget_bytes`` defaults to
    90% of free CUDA memory, or half of the available RAM on CPU. ``threads``: torch CPU threads to measure
    with, as many as the training will have (default: this process's setting).
    """
    with _torch_threads(threads):
        return _plan(model_factory, batch, loss_fn, max_members, memory_budget_bytes, device, steps, tolerance)


@contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op CPU threads set to ``threads`` inside the block (``None``: unchanged)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _plan(model_factory, batch, loss_fn, max_members, memory_budget_bytes, device, steps, tolerance) -> FusionPlan:
    if max_members < 1:
        raise ValueError(f"max_members must be >= 1, got {max_members}")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    budget = memory_budget_bytes if memory_budget_bytes is not None else _default_budget(device)
    candidates = sorted({*(2 ** k for k in range(max_members.bit_length()) if 2 ** k <= max_members), max_members})
    measurements: list[FusionMeasurement] = []
    reason = f"measured up to F={candidates[-1]} (max_members)"
    for count in candidates:
        if len(measurements) >= 2 and _predicted_bytes(measurements, count) > budget:
            reason = f"F={count} is predicted to need more than the {budget / 2**20:.0f} MiB budget"
            break
        m = _measure(model_factory, batch, loss_fn, count, device, steps)
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


def free_memory_bytes(device: torch.device | str = "cpu") -> int:
    """Free memory of ``device``: CUDA's free device memory, or the available RAM (Linux ``MemAvailable``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable")) * 1024


def _default_budget(device: torch.device) -> int:
    return int(0.9 * free_memory_bytes(device)) if device.type == "cuda" else free_memory_bytes(device) // 2


def _predicted_bytes(measurements: list[FusionMeasurement], count: int) -> float:
    """Linear extrapolation ``a + b F`` through the last two measurements."""
    (f0, m0), (f1, m1) = [(x.num_members, x.peak_bytes) for x in measurements[-2:]]
    slope = (m1 - m0) / (f1 - f0)
    return m1 + slope * (count - f1)


def _measure(model_factory, batch, loss_fn, count: int, device: torch.device, steps: int) -> FusionMeasurement:
    inputs, targets = (t.to(device) for t in batch)
    model = fuse([model_factory() for _ in range(count)]).to(device)
    optimizer = SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        trial_losses(loss_fn, model(inputs), targets).sum().backward()
        optimizer.step()

    elapsed, peak = measure_training_step(step, lambda: training_tensors(model, optimizer), device, steps)
    return FusionMeasurement(count, elapsed, peak, count * inputs.shape[0] / elapsed)


def training_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """Parameters, buffers, gradients and optimizer state: what stays resident between steps."""
    return [*optimized_tensors(optimizer), *model.buffers()]


def optimized_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The optimizer's parameters, their gradients and its state."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
    return [*params, *(p.grad for p in params if p.grad is not None), *state]


def measure_training_step(step: Callable[[], None], resident: Callable[[], list[Tensor]],
                          device: torch.device | str = "cpu", steps: int = 3, min_time_s: float = 0.0
                          ) -> tuple[float, int]:
    """Mean seconds of ``step()`` (after one warm-up; at least ``steps`` calls and ``min_time_s`` seconds)
    and its peak memory in bytes.

    CUDA: the allocator's peak. CPU: the distinct storages of ``resident()`` plus the peak of the tensors
    autograd holds for backward at any one time (a lower bound of the process's peak).
    """
    device = torch.device(device)
    step()  # warm-up: allocates gradients and optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start, calls = time.perf_counter(), 0
    while calls < steps or time.perf_counter() - start < min_time_s:
        step()
        calls += 1
        if device.type == "cuda" and calls >= steps:
            torch.cuda.synchronize(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / calls, torch.cuda.max_memory_allocated(device)
    elapsed = (time.perf_counter() - start) / calls
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in resident()}
    saved = _LiveSavedBytes(exclude=set(storages))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        step()
    return elapsed, sum(storages.values()) + saved.peak


class _LiveSavedBytes:
    """Peak bytes of the distinct storages autograd holds for backward at one time, ignoring ``exclude``."""

    def __init__(self, exclude: set[int]) -> None:
        self.peak, self._total, self._live, self._exclude = 0, 0, {}, exclude

    def pack(self, tensor: Tensor) -> Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key in self._exclude:
            return tensor
        count, size = self._live.get(key, (0, tensor.untyped_storage().nbytes()))
        self._live[key] = (count + 1, size)
        if count == 0:
            self._total += size
            self.peak = max(self.peak, self._total)
        weakref.finalize(tensor, self._release, key)
        return tensor

    def _release(self, key: int) -> None:
        count, size = self._live[key]
        if count == 1:
            del self._live[key]
            self._total -= size
        else:
            self._live[key] = (count - 1, size)
