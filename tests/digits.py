"""The tiny digits workload of the tuner and bubble tests (a 64-16-10 MLP on a slice of scikit-learn's digits, plain
torch SGD), without Ray: fill processes unpickle workloads made of these without importing Ray Tune."""
from __future__ import annotations

import torch

from hydro.examples.data import digits
from hydro.examples.models import MLP


def small_digits():
    train, val = digits()
    return (train.x[:320], train.y[:320]), (val.x[:160], val.y[:160])


def mlp(config):
    return MLP((64, config.get("hidden", 16), 10))


def sgd(params, config):
    return torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"])
