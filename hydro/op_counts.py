"""Deterministic CPU proxies of GPU cost: the aten operations a piece of code dispatches (each is at least one
kernel launch on a GPU) and the tensor values it reads on the host (``.item()``, ``float()``, ``bool()``,
``.tolist()``: on a GPU each waits for the device)."""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_READ = torch.ops.aten._local_scalar_dense.default  # behind .item(), float(), int(), bool() of a tensor


@dataclass
class OpCounts:
    """What ran inside :func:`count_ops`: ``ops`` (aten overload name -> calls) and ``reads`` (host reads of
    tensor values; ``.tolist()`` counts once per call)."""

    ops: Counter = field(default_factory=Counter)
    reads: int = 0

    @property
    def total(self) -> int:
        """All aten operations dispatched."""
        return sum(self.ops.values())


class _Recorder(TorchDispatchMode):
    def __init__(self, counts: OpCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts.ops[str(func)] += 1
        if func is _READ:
            self.counts.reads += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_ops() -> Iterator[OpCounts]:
    """Count, within, every aten operation dispatched from this thread and every host read of a tensor value.
    An operation that runs others inside (e.g. a ``torch._foreach_*`` op) counts once."""
    counts = OpCounts()
    tolist = torch.Tensor.tolist

    def counted_tolist(tensor):
        counts.reads += 1
        return tolist(tensor)

    torch.Tensor.tolist = counted_tolist
    try:
        with _Recorder(counts):
            yield counts
    finally:
        torch.Tensor.tolist = tolist
