"""Host synchronisations in a steady-state training step, counted on the CPU: every ``.item()``, ``float(t)``,
``.tolist()`` and ``bool(t)`` of a tensor dispatches ``aten._local_scalar_dense`` (on a GPU: a blocking copy to the
host), and ``nonzero``/``masked_select``/``unique`` have data-dependent shapes (on a GPU: a sync to size their
output). The trial's own paths — the fp16 per-member loss scale and skipped steps, BatchNorm with
``momentum=None``, losses with class weights — must make none (the optimizer's, LR scheduler's, gradient
clipping's and the data index's reads are counted by their own tests)."""
from __future__ import annotations

import collections

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec

SYNCING = {"Tensor.tolist", "Tensor.numpy", "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique2",
           "aten.item", "aten.equal"}
PLAN = TrialPlan(TrialKind.SURROGATE, [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.01, "momentum": 0.0})])


class SyncCount(TorchDispatchMode):
    """The aten operations run inside, by name, and calls of ``Tensor.tolist``/``Tensor.numpy`` (which read a CPU
    tensor's memory without dispatching an operation)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self._patched: dict[str, object] = {}

    def __enter__(self):
        for name in ("tolist", "numpy"):
            original = self._patched[name] = getattr(torch.Tensor, name)

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.ops[f"Tensor.{_name}"] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    def syncs(self) -> dict[str, int]:
        return {name: count for name, count in self.ops.items() if name in SYNCING}


def batchnorm_mlp(config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16, momentum=None), nn.ReLU(),
                         nn.Linear(16, 10))


def steady_state_syncs(**overrides) -> tuple[dict[str, int], int]:
    trial = FusedTrial(spec(model=batchnorm_mlp, **overrides), PLAN, small_digits())
    for _ in range(3):  # the first steps create optimizer state and put the modules in training mode
        trial.train_step()
    with SyncCount() as count:
        trial.train_step()
    return count.syncs(), sum(count.ops.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_steady_state_step_reads_nothing_back_to_the_host(precision):
    syncs, ops = steady_state_syncs(precision=precision)
    assert ops > 50  # the step ran under the counter
    assert syncs == {}


def test_a_step_with_class_weights_reads_nothing_back_to_the_host():
    syncs, _ = steady_state_syncs(loss=nn.CrossEntropyLoss(weight=torch.linspace(0.5, 1.5, 10)))
    assert syncs == {}


def test_the_counter_sees_a_scalar_read():
    with SyncCount() as count:
        float(torch.ones(2).sum())
        torch.arange(3).tolist()
        torch.ones(3).nonzero()
    assert count.syncs() == {"aten._local_scalar_dense": 1, "Tensor.tolist": 1, "aten.nonzero": 1}
    assert torch.Tensor.tolist(torch.arange(2)) == [0, 1]  # unpatched again
