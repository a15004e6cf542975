"""The memory a trial may use (``TuneSpec.memory_budget_bytes``, or its share of a GPU): training members beyond
it raises ``torch.OutOfMemoryError``, which the fused-trial unit answers by splitting those members.

CUDA: the caching allocator's per-process limit (``torch.cuda.set_per_process_memory_fraction``, this process's
own setting, not the GPU's). CPU: the members' resident tensors (weights, gradients, optimizer state, buffers)
plus the tensors autograd saves in their forward, the lower bound of a step's peak that ``plan_fusion``
measures on CPU.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn


_FRACTION_BEFORE: dict[int, float] = {}  # CUDA device index -> this process's fraction before a budget set it


class MemoryBudget:
    """``budget_bytes`` (``None``: no budget beyond the device's own memory) on ``device``. On CUDA, a budget
    sets this process's allocator fraction; a later trial of the same process (Ray reuses actors) without a
    budget gets the fraction back that the process had before."""

    def __init__(self, budget_bytes: int | None, device: torch.device) -> None:
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"hydro.trial.memory: a memory budget must be > 0 bytes, got {budget_bytes}")
        self.budget_bytes, self.device = budget_bytes, device
        if device.type == "cuda":
            index = torch.cuda.current_device() if device.index is None else device.index
            if budget_bytes is not None:
                _FRACTION_BEFORE.setdefault(index, torch.cuda.get_per_process_memory_fraction(index))
                total = torch.cuda.get_device_properties(index).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, budget_bytes / total), index)
            elif index in _FRACTION_BEFORE:
                torch.cuda.set_per_process_memory_fraction(_FRACTION_BEFORE.pop(index), index)

    @contextlib.contextmanager
    def watch(self, modules: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> Iterator[None]:
        """Raise ``torch.OutOfMemoryError`` inside the block when training ``modules`` goes over the budget."""
        if self.budget_bytes is None or self.device.type == "cuda":  # CUDA: the allocator enforces it
            yield
            return
        resident = _resident_bytes(modules, optimizers)
        seen: set[int] = set()
        total = resident

        def pack(tensor: Tensor) -> Tensor:
            nonlocal total
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
                if total > self.budget_bytes:
                    raise torch.OutOfMemoryError(
                        f"hydro.trial.memory: training these members needs more than the memory budget of "
                        f"{self.budget_bytes:,} bytes ({resident:,} resident + saved activations)")
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield


def _resident_bytes(modules: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]) -> int:
    """Weights and buffers, a gradient per weight, and the optimizer state."""
    params = [p for m in modules for p in m.parameters()]
    state = [t for o in optimizers for s in o.state.values() for t in s.values() if isinstance(t, Tensor)]
    return sum(2 * p.nbytes for p in params) + sum(b.nbytes for m in modules for b in m.buffers()) + \
        sum(t.nbytes for t in state)
