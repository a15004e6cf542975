"""A tiny plain-torch workload for the tuner tests: a 64-16-10 MLP on a slice of scikit-learn's digits."""
from __future__ import annotations

import torch
from ray import tune
from torch import nn

from hydro.examples.data import digits
from hydro.examples.models import MLP
from hydro.tune import TuneSpec, accuracy


def small_digits():
    train, val = digits()
    return (train.x[:320], train.y[:320]), (val.x[:160], val.y[:160])


def mlp(config):
    return MLP((64, config.get("hidden", 16), 10))


def sgd(params, config):
    return torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"])


def spec(epochs: int = 3, **overrides) -> TuneSpec:
    fields = dict(model=mlp, data=small_digits, loss=nn.CrossEntropyLoss(), optimizer=sgd, metric="val_acc",
                  mode="max", metrics={"val_acc": accuracy}, epochs=epochs, batch_size=32)
    return TuneSpec(**{**fields, **overrides})


SPACE = {"lr": tune.loguniform(1e-3, 1.0), "momentum": tune.choice([0.0, 0.9])}
