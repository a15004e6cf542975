"""Workloads with a fault in them, for ``hydro tune --workload tests/tune/fault_workloads.py:<function>`` (the
bad-input census) and the pre-check tests: each ``(TuneSpec, param_space)``."""
from __future__ import annotations

import torch
from ray import tune
from torch import nn

from hydro.examples.models import MLP
from hydro.tune import TuneSpec, accuracy
from tests.digits import mlp, sgd, small_digits
from tests.tune.workload import SPACE, spec


def nan_data_split():
    (x, y), val = small_digits()
    x = x.clone()
    x[5, 3] = float("nan")
    return (x, y), val


def regression_data():
    (x, y), (vx, vy) = small_digits()
    return (x, y.float()), (vx, vy.float())  # targets [N]


def strict_accuracy(output, target):
    """Accuracy that refuses non-finite outputs, as scikit-learn's metrics do."""
    if not torch.isfinite(output).all():
        raise ValueError("Input contains NaN, infinity or a value too large")
    return accuracy(output, target)


def empty_choice():
    return spec(), {**SPACE, "momentum": tune.choice([])}


def nan_data():
    return spec(data=nan_data_split), dict(SPACE)


def mse_broadcast():
    """A regression model with output [N, 1] trained against targets [N] with MSELoss."""
    return TuneSpec(model=lambda config: MLP((64, 16, 1)), data=regression_data, loss=nn.MSELoss(), optimizer=sgd,
                    metric="val_loss", mode="min", epochs=1, batch_size=32), dict(SPACE)


def diverging_draws():
    """Every configuration diverges at once (a NaN learning rate) and the metric refuses NaN outputs."""
    return spec(metrics={"val_acc": strict_accuracy}), {"lr": float("nan"), "momentum": tune.choice([0.0, 0.9])}


def some_diverging_draws():
    """The first configuration drawn (seed 0) diverges at once (a learning rate of 1e30), the next one does not."""
    return spec(metrics={"val_acc": strict_accuracy}, model=mlp), {"lr": tune.choice([0.1, 1e30]), "momentum": 0.0}
