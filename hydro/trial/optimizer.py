"""Plain-torch optimizer factories translated into one fused ``hydro.optim`` optimizer for all members.

The user's factory is called once per member — on that member's own model, so that parameter groups it builds
(e.g. no weight decay on biases and norms) are kept, or on a dummy parameter when only fused parameters are
given — and the hyperparameters of each group of the optimizer it returns become the members' values of that
group of the fused optimizer.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

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


class ScheduleInOptimizerFactory(ValueError):
    """The optimizer factory created an LR scheduler, which fused training cannot follow (nor can plain
    members': nothing steps it)."""


def fused_optimizer(factory: Callable[..., torch.optim.Optimizer], configs: Sequence[Mapping],
                    params: Iterable[torch.Tensor] | nn.Module,
                    members: Sequence[nn.Module] | None = None) -> torch.optim.Optimizer:
    """A ``hydro.optim`` optimizer over fused parameters (leading dim F = ``len(configs)``) whose member ``i``
    has the hyperparameters ``factory(params, configs[i])`` would give.

    Args:
        params: the fused parameters, or the fused model (needed with ``members``).
        members: the member models ``params`` (a fused model) was fused from: the factory is called on each
            member's parameters and its parameter groups (matched by parameter name) kept, per member.
    Raises:
        UnsupportedOptimizer: an optimizer class other than SGD/Adam/AdamW, or members that differ in it, in a
            flag or in how they group parameters.
        ScheduleInOptimizerFactory: the factory created an LR scheduler.
    """
    return translate(factory, configs, params, members)[0]


def translate(factory, configs: Sequence[Mapping], params, members: Sequence[nn.Module] | None = None
              ) -> tuple[torch.optim.Optimizer, list[torch.optim.Optimizer]]:
    """:func:`fused_optimizer` and the members' plain-torch optimizers it was read from (one per member, on
    the members' parameters or a dummy one, never stepped)."""
    if members is None:
        probes = [build_optimizer(factory, [nn.Parameter(torch.zeros(1))], config) for config in configs]
        if any(len(p.param_groups) != 1 for p in probes):
            raise UnsupportedOptimizer("the optimizer factory created several parameter groups; pass the member "
                                       "models (members=) so that they can be matched by parameter name")
        groups = [list(params)]
    else:
        probes = [build_optimizer(factory, model.parameters(), config)
                  for model, config in zip(members, configs, strict=True)]
        groups = _fused_groups(params, members, probes)
    kind = type(probes[0])
    if kind not in _TRANSLATIONS:
        raise UnsupportedOptimizer(f"the optimizer factory returned {kind.__module__}.{kind.__name__}; fused "
                                   f"training supports torch.optim.SGD, Adam and AdamW")
    if any(type(p) is not kind for p in probes):
        raise UnsupportedOptimizer("the optimizer factory returned different optimizer classes for different "
                                   "configurations; put the key that chooses it in TuneSpec.group_by")
    target, per_member, flags = _TRANSLATIONS[kind]
    fused_groups = []
    for index, fused_params in enumerate(groups):
        member_groups = [p.param_groups[index] for p in probes]
        for flag in flags:
            if len({g[flag] for g in member_groups}) > 1:
                raise UnsupportedOptimizer(f"members differ in the optimizer flag {flag!r}; put the key that sets "
                                           f"it in TuneSpec.group_by")
        values = {name: [_plain(g[name]) for g in member_groups] for name in per_member}
        if "betas" in values:
            values["betas"] = tuple(zip(*values["betas"]))
        fused_groups.append({"params": fused_params, **values, **{f: member_groups[0][f] for f in flags}})
    return target(fused_groups), probes


def _fused_groups(fused: nn.Module, members: Sequence[nn.Module], probes: list[torch.optim.Optimizer]
                  ) -> list[list[torch.Tensor]]:
    """The fused parameters of each of the probes' parameter groups (by name), the same for every member."""
    if not isinstance(fused, nn.Module):
        raise TypeError("fused_optimizer: with members=, params must be the fused model")
    layouts = []
    for model, probe in zip(members, probes):
        names = {id(p): name for name, p in model.named_parameters()}
        layouts.append([[names.get(id(p)) for p in group["params"]] for group in probe.param_groups])
    if any(None in names for layout in layouts for names in layout):
        raise UnsupportedOptimizer("the optimizer factory optimizes tensors that are not the model's parameters; "
                                   "build its parameter groups from the params it is given")
    if any(layout != layouts[0] for layout in layouts[1:]):
        raise UnsupportedOptimizer("the optimizer factory groups the parameters differently for different "
                                   "configurations; put the key that decides it in TuneSpec.group_by")
    named = dict(fused.named_parameters())
    return [[named[name] for name in names] for names in layouts[0]]


@contextlib.contextmanager
def _schedulers_created() -> Iterator[list]:
    """Within: every torch LR scheduler constructed is recorded in the yielded list."""
    created: list = []
    classes = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    originals = {cls: cls.__dict__["__init__"] for cls in classes}

    def recording(original):
        def init(self, *args, **kwargs):
            if not any(s is self for s in created):
                created.append(self)
            original(self, *args, **kwargs)
        return init

    for cls, original in originals.items():
        cls.__init__ = recording(original)
    try:
        yield created
    finally:
        for cls, original in originals.items():
            cls.__init__ = original


def build_optimizer(factory, params, config: Mapping) -> torch.optim.Optimizer:
    """``factory(params, config)``, refused when it creates an LR scheduler or returns no optimizer."""
    with optimizers_unguarded(), _schedulers_created() as schedulers:  # a probe: nothing compiles it (and
        optimizer = factory(params, config)                             # torch._dynamo takes 1 s to import)
    if schedulers:
        kind = type(schedulers[0])
        raise ScheduleInOptimizerFactory(
            f"the optimizer factory created an LR scheduler ({kind.__module__}.{kind.__name__}); Hydro would "
            f"train with the learning rate it set first and never step it. Fix: return only the optimizer and "
            f"give the schedule as TuneSpec(lr_scheduler=lambda optimizer, config: {kind.__name__}(optimizer, "
            f"...)), with TuneSpec.lr_scheduler_interval 'epoch' or 'batch'")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UnsupportedOptimizer(f"the optimizer factory must return a torch.optim.Optimizer, got "
                                   f"{type(optimizer).__name__}")
    return optimizer


def _plain(value):
    if isinstance(value, torch.Tensor):
        return float(value)
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value
