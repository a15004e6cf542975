"""Counting what a piece of torch code reads back to the host: every ``.item()``, ``float(t)``, ``bool(t)`` of a
tensor dispatches ``aten._local_scalar_dense`` (on a GPU: a blocking copy to the host), operations with
data-dependent output shapes (``nonzero``, ``masked_select``, ``unique``) wait for the GPU to size their output,
and ``Tensor.tolist``/``Tensor.numpy`` read a CPU tensor's memory without dispatching anything (so they are
counted as calls). The same count on the CPU says how many synchronisations the code makes on a GPU."""
from __future__ import annotations

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = frozenset({"Tensor.tolist", "Tensor.numpy", "aten._local_scalar_dense", "aten.nonzero",
                     "aten.masked_select", "aten.unique", "aten._unique2", "aten.item", "aten.equal"})


class HostSyncCounter(TorchDispatchMode):
    """``with HostSyncCounter() as count: ...``; then ``count.ops`` (every aten operation dispatched from this
    thread and every ``Tensor.tolist``/``Tensor.numpy`` call, by name; an operation that runs others inside, e.g. a
    ``torch._foreach_*`` op, counts once), :attr:`total` (the aten operations: each is at least one kernel launch
    on a GPU), ``count.syncs()`` and :attr:`reads` (those that synchronise with a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self._patched: dict[str, object] = {}

    def __enter__(self) -> HostSyncCounter:
        for name in ("tolist", "numpy"):
            original = self._patched[name] = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.ops[f"Tensor.{_name}"] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        self._patched = {}
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Aten operations dispatched (``Tensor.tolist``/``numpy`` calls not included)."""
        return sum(count for name, count in self.ops.items() if not name.startswith("Tensor."))

    @property
    def reads(self) -> int:
        """Synchronising operations and host reads counted."""
        return sum(self.syncs().values())

    def syncs(self) -> dict[str, int]:
        """The synchronising operations counted, by name."""
        return {name: count for name, count in self.ops.items() if name in SYNCING}
