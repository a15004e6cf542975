"""The user's LR schedule (``TuneSpec.lr_scheduler``) as one fused ``hydro.optim.lr_scheduler`` scheduler.

Closed forms per member (torch steps some schedules recursively): learning rates agree with torch's to float64
roundoff. ``OneCycleLR`` needs ``cycle_momentum=False`` (fused training does not cycle the momentum).

``lr_scheduler(optimizer, config)`` is called once per member on that member's plain-torch optimizer (as the
optimizer factory built it, never stepped); the torch schedulers it returns — one class for all members — give
each member's schedule parameters.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import Enum

import torch
from torch.optim import lr_scheduler as torch_sched

from hydro.optim import FusedOptimizer
from hydro.optim import lr_scheduler as fused_sched


class ScheduleInterval(str, Enum):
    """When ``TuneSpec.lr_scheduler`` steps: after every training batch, or after every epoch (torch's usual)."""

    BATCH = "batch"
    EPOCH = "epoch"


class UnsupportedSchedule(TypeError):
    """The user's LR scheduler cannot be expressed as one fused scheduler."""


SUPPORTED = ("LambdaLR", "LinearLR", "CosineAnnealingLR", "StepLR", "MultiStepLR", "ExponentialLR", "SequentialLR",
             "OneCycleLR", "ReduceLROnPlateau")


def fused_schedule(factory: Callable, configs: Sequence[Mapping], probes: Sequence[torch.optim.Optimizer],
                   optimizer: FusedOptimizer):
    """The fused scheduler of ``optimizer`` whose member ``i`` follows ``factory(probes[i], configs[i])``.

    Raises:
        UnsupportedSchedule: a scheduler class not in :data:`SUPPORTED`, different classes for different members,
            or members that differ in a parameter that must be shared (named in the message).
    """
    return _translate([factory(probe, config) for probe, config in zip(probes, configs, strict=True)], optimizer)


def _translate(schedulers: list, optimizer: FusedOptimizer):
    kind = type(schedulers[0])
    if kind.__module__ != torch_sched.__name__ or kind.__name__ not in SUPPORTED:
        raise UnsupportedSchedule(f"TuneSpec.lr_scheduler returned {kind.__module__}.{kind.__name__}; fused "
                                  f"training supports torch.optim.lr_scheduler's {', '.join(SUPPORTED)}")
    if any(type(s) is not kind for s in schedulers):
        raise UnsupportedSchedule("TuneSpec.lr_scheduler returned different scheduler classes for different "
                                  "configurations; put the key that chooses it in TuneSpec.group_by")

    def each(name: str) -> list:
        return [getattr(s, name) for s in schedulers]

    def shared(name: str, read=lambda v: v):
        values = [read(v) for v in each(name)]
        if any(v != values[0] for v in values[1:]):
            raise UnsupportedSchedule(f"members differ in {kind.__name__}.{name} ({values}); fused members share "
                                      f"it: put the key that sets it in TuneSpec.group_by")
        return values[0]

    if kind is torch_sched.LambdaLR:
        return fused_sched.LambdaLR(optimizer, [list(fs) for fs in zip(*each("lr_lambdas"))])
    if kind is torch_sched.StepLR:
        return fused_sched.StepLR(optimizer, shared("step_size"), gamma=each("gamma"))
    if kind is torch_sched.MultiStepLR:
        return fused_sched.MultiStepLR(optimizer, shared("milestones", lambda m: sorted(m.elements())),
                                       gamma=each("gamma"))
    if kind is torch_sched.ExponentialLR:
        return fused_sched.ExponentialLR(optimizer, gamma=each("gamma"))
    if kind is torch_sched.CosineAnnealingLR:
        return fused_sched.CosineAnnealingLR(optimizer, T_max=each("T_max"), eta_min=each("eta_min"))
    if kind is torch_sched.LinearLR:
        return fused_sched.LinearLR(optimizer, start_factor=each("start_factor"), end_factor=each("end_factor"),
                                    total_iters=each("total_iters"))
    if kind is torch_sched.OneCycleLR:
        if shared("cycle_momentum"):
            raise UnsupportedSchedule("OneCycleLR with cycle_momentum=True also cycles the momentum, which fused "
                                      "training does not follow; pass cycle_momentum=False")
        return fused_sched.OneCycleLR(
            optimizer, [[s.optimizer.param_groups[g]["max_lr"] for s in schedulers]
                        for g in range(len(optimizer.param_groups))],
            shared("total_steps"), anneal_strategy=shared("_anneal_func_type"), three_phase=len(shared(
                "_schedule_phases", lambda p: [phase["end_step"] for phase in p])) == 3,
            pct_start=(shared("_schedule_phases", lambda p: p[0]["end_step"]) + 1) / schedulers[0].total_steps,
            div_factor=shared("optimizer", lambda o: o.param_groups[0]["max_lr"] / o.param_groups[0]["initial_lr"]),
            final_div_factor=shared("optimizer",
                                    lambda o: o.param_groups[0]["initial_lr"] / o.param_groups[0]["min_lr"]))
    if kind is torch_sched.SequentialLR:
        children = [_translate(list(parts), optimizer) for parts in zip(*each("_schedulers"))]
        return fused_sched.SequentialLR(optimizer, children, shared("_milestones"))
    min_lrs = [set(m) for m in each("min_lrs")]
    if any(len(m) != 1 for m in min_lrs):
        raise UnsupportedSchedule("ReduceLROnPlateau: one min_lr per parameter group is not supported; give one "
                                  "min_lr")
    return fused_sched.ReduceLROnPlateau(
        optimizer, mode=shared("mode"), factor=each("factor"), patience=shared("patience"),
        threshold=each("threshold"), threshold_mode=shared("threshold_mode"), cooldown=shared("cooldown"),
        min_lr=[m.pop() for m in min_lrs], eps=shared("eps"))
