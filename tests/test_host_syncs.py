"""Host synchronisations in a steady-state training step, counted on the CPU: every ``.item()``, ``float(t)``,
``.tolist()`` and ``bool(t)`` of a tensor dispatches ``aten._local_scalar_dense`` (on a GPU: a blocking copy to the
host), and ``nonzero``/``masked_select``/``unique`` have data-dependent shapes (on a GPU: a sync to size their
output). The trial's own paths — the fp16 per-member loss scale and skipped steps, BatchNorm with
``momentum=None``, losses with class weights — must make none (the optimizer's, LR scheduler's, gradient
clipping's and the data index's reads are counted by their own tests)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hydro.trial.host_syncs import HostSyncCounter
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec

PLAN = TrialPlan(TrialKind.SURROGATE, [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.01, "momentum": 0.0})])


def batchnorm_mlp(config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.BatchNorm1d(16, momentum=None), nn.ReLU(),
                         nn.Linear(16, 10))


def steady_state_syncs(**overrides) -> tuple[dict[str, int], int]:
    trial = FusedTrial(spec(model=batchnorm_mlp, **overrides), PLAN, small_digits())
    for _ in range(3):  # the first steps create optimizer state and put the modules in training mode
        trial.train_step()
    with HostSyncCounter() as count:
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
    with HostSyncCounter() as count:
        float(torch.ones(2).sum())
        torch.arange(3).tolist()
        torch.ones(3).nonzero()
    assert count.syncs() == {"aten._local_scalar_dense": 1, "Tensor.tolist": 1, "aten.nonzero": 1}
    assert torch.Tensor.tolist(torch.arange(2)) == [0, 1]  # unpatched again
