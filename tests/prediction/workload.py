"""A model for merge tests (importable by Ray workers): an MLP whose shared-input layer has no bias, whose
gradient's reduction order would depend on the fusion count (see hydro.trial.merge)."""
from torch import nn


def mlp_without_input_bias(config):
    hidden = config.get("hidden", 16)
    return nn.Sequential(nn.Linear(64, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, 10))
