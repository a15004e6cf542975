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

    def lr_at(self, base_lr: Tensor, epoch: int, group: int = 0) -> Tensor:
        """Group ``group``'s per-member lr ``[F]`` after ``epoch`` steps, from its base lr ``[F]``."""
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        for index, (group, base, shared) in enumerate(zip(self.optimizer.param_groups, self.base_lrs, self.shared)):
            group["lr"] = self.lr_at(base, self.last_epoch, index)
            self.optimizer.mark_uniform(group["lr"], shared)

    def get_last_lr(self) -> list[Tensor]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def keep_members(self, index: Tensor) -> None:
        index = index.cpu()
        self.base_lrs = [base.index_select(0, index) for base in self.base_lrs]
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["initial_lr"] = base
        self.keep_params(index)
        self._mark_shared()

    def keep_params(self, index: Tensor) -> None:
        """Keep the schedule parameters of the members at ``index`` (CPU)."""
        for name in self.per_member:
            setattr(self, name, getattr(self, name).index_select(0, index))

    def state_dict(self) -> dict:
        """Schedule parameters, base lrs and step count (no functions, no optimizer)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "shared", *self.unsaved)}

    unsaved: tuple[str, ...] = ()  # attributes rebuilt from the configuration, not saved

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)
        self._mark_shared()


class StepLR(TrialLRScheduler):
    """``lr = base * gamma ** (epoch // step_size)``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, step_size: int, gamma=0.1, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, step_size=step_size, gamma=gamma)

    def check(self) -> None:
        self.require("step_size", is_count, "an int >= 1 (steps)")
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch, group=0):
        return base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(TrialLRScheduler):
    """``lr = base * gamma ** (number of milestones <= epoch)``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, milestones: Sequence[int], gamma=0.1, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, milestones=sorted(milestones), gamma=gamma)

    def check(self) -> None:
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch, group=0):
        return base_lr * self.gamma ** sum(m <= epoch for m in self.milestones)


class ExponentialLR(TrialLRScheduler):
    """``lr = base * gamma ** epoch``; ``gamma`` per member."""

    per_member = ("gamma",)

    def __init__(self, optimizer, gamma, last_epoch: int = -1) -> None:
        super().__init__(optimizer, last_epoch, gamma=gamma)

    def check(self) -> None:
        self.require("gamma", lambda v: v >= 0, ">= 0 for every member")

    def lr_at(self, base_lr, epoch, group=0):
        return base_lr * self.gamma ** epoch


class CosineAnnealingLR(TrialLRScheduler):
    """``lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``; ``T_max``, ``eta_min`` per member."""

    per_member = ("T_max", "eta_min")

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch: int = -1) -> None:  # noqa: N803 (torch's name)
        super().__init__(optimizer, last_epoch, T_max=T_max, eta_min=eta_min)

    def check(self) -> None:
        self.require("T_max", lambda v: v > 0, "> 0 (steps to the minimum) for every member")

    def lr_at(self, base_lr, epoch, group=0):
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

    def lr_at(self, base_lr, epoch, group=0):
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

    def lr_at(self, base_lr, epoch, group=0):
        starts = [0, *self.milestones]
        k = sum(m <= epoch for m in self.milestones)
        return self.schedulers[k].lr_at(base_lr, epoch - starts[k], group)

    unsaved = ("schedulers",)

    def params_shared(self) -> bool:
        return all(scheduler.params_shared() for scheduler in self.schedulers)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "children": [scheduler.state_dict() for scheduler in self.schedulers]}

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        for scheduler, saved in zip(self.schedulers, state.pop("children"), strict=True):
            scheduler.load_state_dict(saved)
        super().load_state_dict(state)

    def keep_params(self, index: Tensor) -> None:
        for scheduler in self.schedulers:
            scheduler.keep_params(index)


class LambdaLR(TrialLRScheduler):
    """``lr = base * lr_lambdas[g][i](epoch)`` for group ``g``, member ``i``: ``lr_lambdas`` one function for all,
    one per member, or per group a list of one per member (torch's ``LambdaLR`` of each member)."""

    def __init__(self, optimizer, lr_lambdas, last_epoch: int = -1) -> None:
        groups, count = len(optimizer.param_groups), optimizer.num_members
        if callable(lr_lambdas):
            lr_lambdas = [[lr_lambdas] * count] * groups
        elif lr_lambdas and all(callable(f) for f in lr_lambdas):
            lr_lambdas = [list(lr_lambdas)] * groups
        if len(lr_lambdas) != groups or any(len(fs) != count or not all(callable(f) for f in fs)
                                             for fs in lr_lambdas):
            raise ValueError(f"LambdaLR: lr_lambdas must be a function, {count} functions (one per member) or "
                             f"{groups} lists of {count} (per parameter group, one per member)")
        super().__init__(optimizer, last_epoch, lr_lambdas=[list(fs) for fs in lr_lambdas])

    unsaved = ("lr_lambdas",)

    def params_shared(self) -> bool:
        return all(len(set(fs)) == 1 for fs in self.lr_lambdas)

    def lr_at(self, base_lr, epoch, group=0):
        return base_lr * torch.tensor([fn(epoch) for fn in self.lr_lambdas[group]], dtype=torch.float64)

    def keep_params(self, index: Tensor) -> None:
        self.lr_lambdas = [[fs[i] for i in index.tolist()] for fs in self.lr_lambdas]


class ReduceLROnPlateau:
    """``torch.optim.lr_scheduler.ReduceLROnPlateau`` for each member on its own metric: ``step(metrics)`` with
    ``metrics`` ``[F]``. ``factor``, ``threshold`` and ``min_lr`` are scalars or one value per member."""

    per_member = ("factor", "threshold", "min_lr")

    def __init__(self, optimizer: FusedOptimizer, mode: str = "min", factor=0.1, patience: int = 10,
                 threshold=1e-4, threshold_mode: str = "rel", cooldown: int = 0, min_lr=0.0,
                 eps: float = 1e-8) -> None:
        if not isinstance(optimizer, FusedOptimizer):
            raise TypeError(f"ReduceLROnPlateau needs a hydro.optim optimizer, got {type(optimizer).__name__}")
        if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"):
            raise ValueError(f"ReduceLROnPlateau: mode must be 'min' or 'max' and threshold_mode 'rel' or 'abs', "
                             f"got {mode!r}, {threshold_mode!r}")
        count = optimizer.num_members
        self.optimizer, self.mode, self.threshold_mode = optimizer, mode, threshold_mode
        self.patience, self.cooldown, self.eps, self.last_epoch = patience, cooldown, eps, 0
        for name, value in (("factor", factor), ("threshold", threshold), ("min_lr", min_lr)):
            setattr(self, name, per_member(value, count, name, "ReduceLROnPlateau"))
        check("ReduceLROnPlateau: ", ("factor", self.factor, lambda v: v < 1, "< 1 for every member"),
              ("patience", patience, lambda v: is_count(v, 0), "an int >= 0 (epochs)"),
              ("cooldown", cooldown, lambda v: is_count(v, 0), "an int >= 0 (epochs)"))
        self.best = torch.full((count,), math.inf if mode == "min" else -math.inf, dtype=torch.float64)
        self.num_bad_epochs = torch.zeros(count, dtype=torch.int64)
        self.cooldown_counter = torch.zeros(count, dtype=torch.int64)

    def _is_better(self, current: Tensor) -> Tensor:
        if self.threshold_mode == "rel":
            bound = self.best * (1.0 - self.threshold if self.mode == "min" else self.threshold + 1.0)
        else:
            bound = self.best - self.threshold if self.mode == "min" else self.best + self.threshold
        return current < bound if self.mode == "min" else current > bound

    def step(self, metrics) -> None:
        """One epoch's metric of every member ``[F]`` (any device; read once)."""
        current = torch.as_tensor(metrics, dtype=torch.float64).detach().cpu().reshape(-1)
        self.last_epoch += 1
        better = self._is_better(current)
        self.best = torch.where(better, current, self.best)
        bad = torch.where(better, 0, self.num_bad_epochs + 1)
        cooling = self.cooldown_counter > 0
        self.cooldown_counter = torch.where(cooling, self.cooldown_counter - 1, self.cooldown_counter)
        bad = torch.where(cooling, 0, bad)
        reduce = bad > self.patience
        for group in self.optimizer.param_groups:
            old = group["lr"]
            new = torch.maximum(old * self.factor, self.min_lr)
            group["lr"] = torch.where(reduce & (old - new > self.eps), new, old)
        self.cooldown_counter = torch.where(reduce, self.cooldown, self.cooldown_counter)
        self.num_bad_epochs = torch.where(reduce, 0, bad)

    def get_last_lr(self) -> list[Tensor]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def keep_members(self, index: Tensor) -> None:
        index = index.cpu()
        for name in (*self.per_member, "best", "num_bad_epochs", "cooldown_counter"):
            setattr(self, name, getattr(self, name).index_select(0, index))

    def state_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


class OneCycleLR(TrialLRScheduler):
    """``torch.optim.lr_scheduler.OneCycleLR``'s learning rates (not its momentum cycle): from
    ``max_lr / div_factor`` up to ``max_lr`` over ``pct_start`` of ``total_steps``, then down to
    ``max_lr / div_factor / final_div_factor`` (``three_phase``: back to the start first). ``max_lr`` per member
    (or, per parameter group, a list of per-member values); the base lr of the optimizer is not used."""

    def __init__(self, optimizer, max_lr, total_steps: int, pct_start: float = 0.3, anneal_strategy: str = "cos",
                 div_factor: float = 25.0, final_div_factor: float = 1e4, three_phase: bool = False,
                 last_epoch: int = -1) -> None:
        groups = len(optimizer.param_groups)
        per_group = max_lr if isinstance(max_lr, (list, tuple)) and len(max_lr) == groups and \
            all(isinstance(v, (list, tuple, Tensor)) for v in max_lr) else [max_lr] * groups
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        check("OneCycleLR: ", ("total_steps", total_steps, is_count, "an int >= 1 (steps)"),
              ("pct_start", pct_start, lambda v: 0 <= v <= 1, "in [0, 1]"))
        ends = [float(pct_start * total_steps) - 1, *([float(2 * pct_start * total_steps) - 2] if three_phase else []),
                total_steps - 1]
        super().__init__(optimizer, last_epoch, total_steps=total_steps, anneal_strategy=anneal_strategy,
                         div_factor=div_factor, final_div_factor=final_div_factor, three_phase=three_phase,
                         phase_ends=ends, max_lrs=[per_member(v, optimizer.num_members, "max_lr", "OneCycleLR")
                                                   for v in per_group])

    def params_shared(self) -> bool:
        return all(bool((v == v[0]).all()) for v in self.max_lrs)

    def keep_params(self, index: Tensor) -> None:
        self.max_lrs = [v.index_select(0, index) for v in self.max_lrs]

    def lr_at(self, base_lr, epoch, group=0):
        if epoch > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {epoch} times, more than total_steps={self.total_steps}")
        high = self.max_lrs[group]
        low = high / self.div_factor
        phases = [(low, high), *([(high, low)] if self.three_phase else []), (low if self.three_phase else high,
                                                                              low / self.final_div_factor)]
        start = 0.0
        for i, ((first, last), end) in enumerate(zip(phases, self.phase_ends)):
            if epoch <= end or i == len(phases) - 1:
                pct = (epoch - start) / (end - start)
                if self.anneal_strategy == "linear":
                    return (last - first) * pct + first
                return last + (first - last) / 2.0 * (math.cos(math.pi * pct) + 1)
            start = end
        raise AssertionError("unreachable: the last phase always applies")
