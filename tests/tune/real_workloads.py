"""Workloads that bring what real ones do and the README's do not: keys that change the architecture (a width, a
dropout p) and batch sizes sampled as floats. Each function returns ``(TuneSpec, param_space)`` (``hydro tune
--workload tests.tune.real_workloads:<function>``)."""
from __future__ import annotations

from ray import tune
from torch import nn

from tests.tune.workload import spec


def mlp_of_width(config):
    return nn.Sequential(nn.Linear(64, config["width"]), nn.ReLU(), nn.Linear(config["width"], 10))


def mlp_with_dropout(config):
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(config["p"]), nn.Linear(32, 10))


def width_not_grouped(group_by=()):
    """A width sampled from 32 and 64 that ``TuneSpec.group_by`` leaves out."""
    space = {"lr": tune.loguniform(1e-3, 1.0), "momentum": 0.9, "width": tune.choice([32, 64])}
    return spec(model=mlp_of_width, group_by=group_by), space


def dropout_not_grouped():
    """A dropout p that ``TuneSpec.group_by`` leaves out (the module's repr differs, not its tensors)."""
    space = {"lr": tune.loguniform(1e-3, 1.0), "momentum": 0.9, "p": tune.choice([0.1, 0.3])}
    return spec(model=mlp_with_dropout), space


def float_batch_size():
    """``tune.uniform(16, 128)`` for the batch size: floats such as 97.7."""
    return spec(), {"lr": tune.loguniform(1e-3, 1.0), "momentum": 0.9, "batch_size": tune.uniform(16, 128)}
