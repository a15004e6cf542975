"""A trial's device from end to end on the CPU: loss modules holding tensors follow the trial onto its device,
the driver's workload check stays on the CPU when the driver has a GPU, and a trial given several GPUs is refused.
The meta device stands in for a GPU: it holds no data and refuses operands from another device."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from hydro.loss import loss_on
from hydro.trial.check import check_workload
from hydro.trial.device import resolve_device
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune.search.trainable import trial_resources
from tests.tune.workload import small_digits, spec

CONFIGS = [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.01, "momentum": 0.0})]


@pytest.mark.parametrize("loss", [nn.CrossEntropyLoss(weight=torch.linspace(0.5, 1.5, 10)),
                                  nn.CrossEntropyLoss(weight=torch.ones(10), label_smoothing=0.1)])
def test_a_loss_module_with_class_weights_trains_on_the_trials_device(loss):
    trial = FusedTrial(spec(loss=loss), TrialPlan(TrialKind.SURROGATE, CONFIGS), small_digits(), device="meta")
    metrics = trial.run_epoch()  # the CPU weight against meta outputs would raise "not on the expected device"
    assert {t.device.type for t in metrics.values()} == {"meta"}
    assert loss.weight.device.type == "cpu"  # the user's module is left where it was


def test_loss_on_moves_modules_holding_tensors_only():
    bce = nn.BCEWithLogitsLoss(pos_weight=torch.tensor([2.0]))
    moved = loss_on(bce, "meta")
    assert moved is not bce and moved.pos_weight.device.type == "meta" and bce.pos_weight.device.type == "cpu"
    plain = nn.CrossEntropyLoss()
    assert loss_on(plain, "meta") is plain and loss_on(bce, "cpu") is bce
    function = nn.functional.cross_entropy
    assert loss_on(function, "meta") is function
    output = torch.randn(2, 4, 1, device="meta")
    assert moved(output[0], torch.ones(4, 1, device="meta")).device.type == "meta"


def test_the_workload_check_trains_on_the_cpu_when_the_driver_has_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # device="auto" would resolve to cuda:0 here
    assert resolve_device("auto") == torch.device("cuda", 0)
    check_workload(spec(), CONFIGS[0][1], 2, _sources())


def _sources():
    from hydro.trial.data import as_source

    train, val = small_digits()
    return as_source(train, "train", 0), as_source(val, "val", 0)


def test_a_trial_given_several_gpus_is_refused():
    with pytest.raises(ValueError, match="fused trial trains on one GPU.*gpus_per_trial=1"):
        resolve_device("auto", ["0", "1"])
    with pytest.raises(ValueError, match="gpus_per_trial=2, but a fused trial trains on one GPU"):
        trial_resources(spec(), gpus_per_trial=2)
    assert trial_resources(spec(), gpus_per_trial=1) == {"cpu": 1, "gpu": 1}
