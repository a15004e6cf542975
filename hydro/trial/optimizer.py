"""Plain-torch optimizer factories translated into one fused ``hydro.optim`` optimizer for all members.

The user's factory is called once per member on a dummy parameter; the hyperparameters of the optimizer it
returns become the members' values of the fused optimizer's per-member hyperparameters.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from hydro import optim as fused_optim
from hydro.optim.dynamo_guard import optimizers_unguarded

# torch class -> (hydro class, per-member hyperparameters, flags that must be equal across members)
_TRANSLATIONS = {
    torch.optim.SGD: (fused_optim.SGD, ("lr", "momentum", "dampening", "weight_decay"), ("nesterov", "maximize")),
    torch.optim.Adam: (fused_optim.Adam, ("lr", "betas", "eps", "weight_decay"), ("amsgrad", "maximize")),
    torch.optim.AdamW: (fused_optim.AdamW, ("lr", "betas", "eps", "weight_decay"), ("amsgrad", "maximize")),
}


class UnsupportedOptimizer(TypeError):
    """The user's optimizer factory cannot be expressed as one fused ``hydro.optim`` optimizer."""


def fused_optimizer(factory: Callable[..., torch.optim.Optimizer], configs: Sequence[Mapping],
                    params: Iterable[torch.Tensor]) -> torch.optim.Optimizer:
    """A ``hydro.optim`` optimizer over fused ``params`` (leading dim F = ``len(configs)``) whose member ``i``
    has the hyperparameters ``factory(params, configs[i])`` would give."""
    probes = [_probe(factory, config) for config in configs]
    kind = type(probes[0])
    if kind not in _TRANSLATIONS:
        raise UnsupportedOptimizer(f"the optimizer factory returned {kind.__module__}.{kind.__name__}; fused "
                                   f"training supports torch.optim.SGD, Adam and AdamW")
    if any(type(p) is not kind for p in probes):
        raise UnsupportedOptimizer("the optimizer factory returned different optimizer classes for different "
                                   "configurations; put the key that chooses it in TuneSpec.group_by")
    target, per_member, flags = _TRANSLATIONS[kind]
    groups = [p.param_groups[0] for p in probes]
    for flag in flags:
        if len({g[flag] for g in groups}) > 1:
            raise UnsupportedOptimizer(f"members differ in the optimizer flag {flag!r}; put the key that sets it "
                                       f"in TuneSpec.group_by")
    values = {name: [_plain(g[name]) for g in groups] for name in per_member}
    if "betas" in values:
        values["betas"] = tuple(zip(*values["betas"]))
    return target(params, **values, **{flag: groups[0][flag] for flag in flags})


def _probe(factory, config: Mapping) -> torch.optim.Optimizer:
    with optimizers_unguarded():  # a probe: nothing compiles it (and torch._dynamo takes 1 s to import)
        optimizer = factory([torch.nn.Parameter(torch.zeros(1))], config)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedOptimizer(f"the optimizer factory must return a torch.optim.Optimizer, got "
                                   f"{type(optimizer).__name__}")
    if len(optimizer.param_groups) != 1:
        raise UnsupportedOptimizer("the optimizer factory created several parameter groups; fused training "
                                   "translates factories with one group (per-member hyperparameters only)")
    return optimizer


def _plain(value):
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value
