"""A member whose own metric or loss raises fails alone, as a diverged (NaN) member does: its siblings in the same
fused trial train on with exactly the values they have without it; a trial whose every member raises raises."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune import accuracy
from tests.tune.workload import small_digits, spec

HEALTHY, DIVERGING = {"lr": 0.1, "momentum": 0.0}, {"lr": math.nan, "momentum": 0.0}  # NaN weights after a step


def strict_accuracy(output, target):
    """Accuracy that refuses non-finite outputs, as scikit-learn's metrics do."""
    if not torch.isfinite(output).all():
        raise ValueError("Input contains NaN, infinity or a value too large")
    return accuracy(output, target)


def strict_loss(output, target):
    """Cross-entropy that refuses non-finite outputs (data-dependent: no vmap rule, computed member by member)."""
    if not torch.isfinite(output).all():
        raise FloatingPointError("non-finite logits")
    return nn.functional.cross_entropy(output, target)


def trained(configs, epochs=2, ids=None, **overrides):
    workload = spec(epochs=epochs, **overrides)
    members = list(zip(ids or [f"m{i}" for i in range(len(configs))], configs))  # a member's init: of its id
    trial = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, members, 1, False), small_digits())
    return trial, [trial.run_epoch() for _ in range(epochs)]


def test_a_metric_that_raises_fails_only_its_member_and_siblings_are_exact():
    trial, epochs = trained([HEALTHY, DIVERGING, HEALTHY], metrics={"val_acc": strict_accuracy})
    _, alone = trained([HEALTHY, HEALTHY], ids=["m0", "m2"], metrics={"val_acc": accuracy})
    assert list(trial.member_errors) == ["m1"] and trial.member_errors["m1"].startswith("ValueError: Input contains")
    for mine, reference in zip(epochs, alone):
        assert all(math.isnan(v) for v in (mine["val_acc"][1], mine["val_loss"][1], mine["train_loss"][1]))
        assert torch.equal(mine["val_acc"][[0, 2]], reference["val_acc"])
        assert torch.equal(mine["val_loss"][[0, 2]], reference["val_loss"])


def test_a_loss_that_raises_fails_only_its_member_without_a_gradient_and_siblings_train_on():
    trial, epochs = trained([HEALTHY, DIVERGING], loss=strict_loss)
    _, alone = trained([HEALTHY, HEALTHY])
    assert list(trial.member_errors) == ["m1"] and trial.member_errors["m1"] == "FloatingPointError: non-finite logits"
    for mine, reference in zip(epochs, alone):
        assert math.isnan(mine["train_loss"][1]) and math.isnan(mine["val_acc"][1])
        assert mine["train_loss"][0].item() == pytest.approx(reference["train_loss"][0].item(), rel=1e-5)
        assert mine["val_acc"][0].item() == pytest.approx(reference["val_acc"][0].item())


def test_when_every_member_raises_the_error_is_raised():
    with pytest.raises(ValueError, match="Input contains NaN"):
        trained([DIVERGING, DIVERGING], metrics={"val_acc": strict_accuracy})
    with pytest.raises(FloatingPointError, match="non-finite logits"):
        trained([DIVERGING], loss=strict_loss)


def test_a_fused_loss_error_that_no_member_raises_alone_stands():
    def per_sample(output, target):  # no reduction: every member computes it, the fused loss refuses it
        return nn.functional.cross_entropy(output, target, reduction="none")

    with pytest.raises(ValueError, match="reduce each member's loss to a scalar"):
        trained([HEALTHY, HEALTHY], loss=per_sample)


def test_the_workload_check_tries_other_configurations_after_a_numeric_failure(caplog):
    from hydro.tune.run import prepare
    from tests.tune.fault_workloads import some_diverging_draws

    prepare(*some_diverging_draws())  # the first draw diverges at once; the fourth trains: the space is not refused
    assert "{'lr': 1e+30, 'momentum': 0.0} fails numerically in the workload check" in caplog.text


def test_a_fused_loss_fault_that_no_member_repeats_is_raised_not_hidden():
    calls = []

    def fails_once(output, target):  # the loss's own fault on its first call, not a member's
        calls.append(1)
        if len(calls) == 1:
            raise ZeroDivisionError("fault of the loss")
        return nn.functional.cross_entropy(output, target)

    with pytest.raises(ZeroDivisionError, match="fault of the loss"):
        trained([HEALTHY, HEALTHY], loss=fails_once)
