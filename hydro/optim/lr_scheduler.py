"""LR schedulers for fused optimizers: every schedule parameter is a scalar or one value per member.

They follow ``torch.optim.lr_scheduler``'s closed forms: after ``k`` calls of ``step()`` member ``i``'s
lr is ``lr_at(base_lr[i], k)``. All members step together, so the step count is shared.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from hydro.checks import check, is_count
from .base import FusedOptimizer, per_member


class TrialLRScheduler:
    """Base: sets each group's per-member ``lr`` ``[F]`` from its base lr and the step count.

    Subclasses list their per-member parameters in ``per_member`` and implement ``lr_at``.
    """

    per_member: tuple[str, ...] = ()

    def __init__(self, optimizer: FusedOptimizer, last_epoch: int = -1, **params) -> None:
        if not isinstance(optimizer, FusedOptimizer):
            raise TypeError(f"{type(self).__name__} needs a hydro.optim optimizer, got {type(optimizer).__name__}")
        self.optimizer = optimizer
        for name, value in params.items():
            setattr(self, name, per_member(value, optimizer.num_members, name, type(self).__name__)
                    if name in self.per_member else value)
        self.check()
        self.base_lrs = [group.setdefault("initial_lr", group["lr"].clone()) for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._mark_shared()
        self.step()

    def _mark_shared(self) -> None:
        """Which groups' learning rates every member shares at every step (shared base lr and schedule
        parameters): told to the optimizer with each lr set, so that it reads none of them."""
        self.shared = [self.params_shared() and bool((base == base[0]).all()) for base in self.base_lrs]

    def params_shared(self) -> bool:
        """Whether every member has the same schedule parameters."""
        return all(bool((v == v[0]).all()) for v in (getattr(self, name) for name in self.per_member))

    def check(self) -> None:
        """Refuse schedule parameters that would give a negative, infinite or NaN learning rate."""

    def require(self, name: str, ok, rule: str) -> None:
        """``hydro.checks.check`` of the parameter ``name``."""
        check(f"{type(self).__name__}: ", (name, getattr(self, name), ok, rule))

    def lr_at(self, base_lr: Tensor, epoch: int) -> Tensor:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for group, base, shared in zip(self.optimizer.param_groups, self.base_lrs, self.shared):
            group["lr"] = self.lr_at(base, self.last_epoch)
            self.optimizer.mark_uniform(group["lr"], shared)

    def get_last_lr(self) -> list[Tensor]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def keep_members(self, index: Tensor) -> None:
        index = index.cpu()
        self.base_lrs = [base.index_select(0, index) for base in self.base_lrs]
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base
        for name in self.per_member:
            setattr(self, name, getattr(self, name).index_select(0, index))
        self._mark_shared()

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


class StepLR(TrialLRScheduler):
    """``lr = base * gamma ** (epoch // step_size)``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, step_size: int, gamma=0.1, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, step_size=step_size, gamma=gamma)

    def check(self) -> None:
        self.require("step_size", is_count, "an int >= 1 (steps)")
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(TrialLRScheduler):
    """``lr = base * gamma ** (number of milestones <= epoch)``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, milestones: Sequence[int], gamma=0.1, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, milestones=sorted(milestones), gamma=gamma)

    def check(self) -> None:
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** sum(m <= epoch for m in self.milestones)


class ExponentialLR(TrialLRScheduler):
    """``lr = base * gamma ** epoch``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, gamma, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, gamma=gamma)

    def check(self) -> None:
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch):
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(TrialLRScheduler):
    """``lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``; ``T_max``, ``eta_min`` per member."""

    per_member = ("T_max", "eta_min")

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch: int = -1) -> None:  # noqa: N803 (torch's name)
        super().__init__(optimizer, last_epoch, T_max=T_max, eta_min=eta_min)

    def check(self) -> None:
        self.require("T_max", lambda v: v > 0, "> 0 (steps to the minimum) for every member")

    def lr_at(self, base_lr, epoch):
        return self.eta_min + (base_lr - self.eta_min) * (1 + torch.cos(math.pi * epoch / self.T_max)) / 2


class LinearLR(TrialLRScheduler):
    """Linear warm-up: the factor goes from ``start_factor`` to ``end_factor`` over ``total_iters`` steps."""

    per_member = ("start_factor", "end_factor", "total_iters")

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, start_factor=start_factor, end_factor=end_factor,
                         total_iters=total_iters)

    def check(self) -> None:  # torch's rule for the factors
        self.require("start_factor", lambda v: (v > 0) & (v <= 1), "in (0, 1] for every member")
        self.require("end_factor", lambda v: (v >= 0) & (v <= 1), "in [0, 1] for every member")
        self.require("total_iters", lambda v: v >= 1, ">= 1 (steps) for every member")

    def lr_at(self, base_lr, epoch):
        progress = torch.clamp(epoch / self.total_iters, max=1.0)
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)


class SequentialLR(TrialLRScheduler):
    """``schedulers[k]`` from ``milestones[k-1]`` on, counting its steps from there (e.g. warm-up, then cosine)."""

    def __init__(self, optimizer, schedulers: Sequence[TrialLRScheduler], milestones: Sequence[int],
                 last_epoch: int = -1) -> None:
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR needs len(schedulers) - 1 = {len(schedulers) - 1} milestones, "
                             f"got {len(milestones)}")
        super().__init__(optimizer, last_epoch, schedulers=list(schedulers), milestones=list(milestones))

    def lr_at(self, base_lr, epoch):
        starts = [0, *self.milestones]
        k = sum(m <= epoch for m in self.milestones)
        return self.schedulers[k].lr_at(base_lr, epoch - starts[k])

    def params_shared(self) -> bool:
        return all(scheduler.params_shared() for scheduler in self.schedulers)

    def keep_members(self, index: Tensor) -> None:
        for scheduler in self.schedulers:
            for name in scheduler.per_member:
                setattr(scheduler, name, getattr(scheduler, name).index_select(0, index.cpu()))
        super().keep_members(index)
