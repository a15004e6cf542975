"""A model and an optimizer factory for merge tests (importable by Ray workers): an MLP whose shared-input layer has
no bias, whose gradient's reduction order would depend on the fusion count (see hydro.trial.merge); SGD whose
parameter groups depend on the config, so that trials of one spec may not merge."""
import torch
from torch import nn


def mlp_without_input_bias(config):
    hidden = config.get("hidden", 16)
    return nn.Sequential(nn.Linear(64, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, 10))


def grouped_sgd(params, config):
    """SGD with weight decay on weights only, in two parameter groups, where ``config["groups"]``; else one group."""
    params = list(params)
    groups = [{"params": [p for p in params if p.dim() > 1]},
              {"params": [p for p in params if p.dim() == 1], "weight_decay": 0.0}] if config["groups"] else params
    return torch.optim.SGD(groups, lr=config["lr"], momentum=0.9, weight_decay=1e-3)
