"""The memory a trial may use (``TuneSpec.memory_budget_bytes``, or its share of a GPU): training members beyond
it raises ``torch.OutOfMemoryError`` (or a library's allocation failure, :func:`is_out_of_memory`), which the
fused-trial unit answers by splitting those members.

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


CUDA_CONTEXT_BYTES = 768 * 2**20
"""Memory one process's CUDA context takes on its GPU outside torch's caching allocator (driver state, kernel
images loaded lazily, cuDNN/cuBLAS handles): about 500-700 MiB with CUDA 12 on recent cards."""

# Messages of allocation failures that arrive as a plain RuntimeError (cuDNN, cuBLAS, cuFFT, cuSOLVER, NCCL)
_ALLOCATION_FAILURES = ("out of memory", "ALLOC_FAILED")

_FRACTION_BEFORE: dict[int, float] = {}  # CUDA device index -> this process's fraction before a budget set it


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a failure to allocate memory: ``torch.OutOfMemoryError`` (the caching allocator, or
    over a :class:`MemoryBudget`), or a ``RuntimeError`` of a CUDA library that could not allocate (e.g.
    ``CUBLAS_STATUS_ALLOC_FAILED``, ``CUDNN_STATUS_ALLOC_FAILED``, ``CUDA error: out of memory``)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(mark in str(error) for mark in _ALLOCATION_FAILURES)


def gpu_share_bytes(share: float, total_bytes: int, context_bytes: int = CUDA_CONTEXT_BYTES) -> int:
    """The memory budget of a process given ``share`` (0 < share <= 1) of a GPU of ``total_bytes``: its share of
    the card less its own CUDA context, since every process sharing the card holds one outside the allocator
    (``share`` of the card holds ``1 / share`` such processes' contexts at most). Raises ``ValueError`` when the
    share holds no more than a context."""
    if not 0 < share <= 1:
        raise ValueError(f"hydro.trial.memory: a GPU share must be in (0, 1], got {share}")
    budget = int(share * total_bytes) - context_bytes
    if budget <= 0:
        raise ValueError(f"hydro.trial.memory: {share:g} of a GPU of {total_bytes / 2**30:.1f} GiB leaves no memory "
                         f"beyond the process's CUDA context (about {context_bytes / 2**20:.0f} MiB); give each "
                         f"trial a larger share (gpus_per_trial)")
    return budget


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
