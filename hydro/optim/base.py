"""Base of the fused optimizers: parameters ``[F, ...]``, hyperparameters per member.

Every hyperparameter listed in ``per_member`` is a scalar (all members) or ``F`` values, stored in the
parameter group as a float64 tensor ``[F]`` (so LR schedulers and slicing act on it per member). Groups
may carry ``lr_mult``/``wd_mult`` (default 1): per-parameter multipliers applied on top, e.g. µP's: a
group holding parameters of a ``hydro.shrink`` model is split by their µP multipliers (``mup_rule``).
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from hydro.checks import check
from hydro.nn.base import member_view
from hydro.optim.dynamo_guard import unguarded
from hydro.shrink.mup import group_by_multipliers


def per_member(value, count: int, name: str, owner: str) -> Tensor:
    """``value`` (a scalar or ``count`` values) as a float64 CPU tensor ``[count]``; errors name ``owner``."""
    try:
        tensor = torch.as_tensor(value.detach().cpu() if isinstance(value, Tensor) else value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{owner}: hyperparameter '{name}' must be a number or one number per member, "
                        f"got {value!r}") from error
    tensor = tensor.flatten()
    if tensor.numel() == 1:
        return tensor.expand(count).clone()
    if tensor.numel() != count:
        raise ValueError(f"{owner}: hyperparameter '{name}' needs a scalar or {count} values (one per member), "
                         f"got {tensor.numel()}")
    return tensor.clone()


def member_count(params: list[Tensor]) -> int:
    """``F``: the leading size shared by every parameter; 1 (one unfused model) when they do not share one."""
    leading = {p.shape[0] if p.dim() else None for p in params}
    return leading.pop() if len(leading) == 1 and None not in leading else 1


class FusedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` for fused parameters whose leading dimension is the member (trial).

    Parameters of a plain (unfused) model — their leading sizes differ — are one member (``F = 1``):
    the optimizer then steps exactly like its ``torch.optim`` namesake. (Parameters that happen to share a
    leading size are read as fused; with one value per hyperparameter the update is the same either way,
    as every update is element-wise.)
    """

    per_member: tuple[str, ...] = ("lr",)
    mup_rule = "sgd"  # which µP multipliers apply: "sgd" (MuSGD) or "adam" (MuAdam, entrywise-normalised)

    def __init__(self, params: Iterable, defaults: dict) -> None:
        self.num_members: int | None = None
        self._resolved: dict[int, tuple] = {}
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got no parameters (an empty list, or a generator already used "
                             f"up); pass fused.parameters() of the model to train")
        super().__init__(params, {"lr_mult": 1.0, "wd_mult": 1.0, **defaults})

    def __getstate__(self) -> dict:
        # torch's Optimizer pickles only defaults, state and param_groups; copies must keep the member count
        return {**super().__getstate__(), "num_members": self.num_members}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._resolved = {}

    def add_param_group(self, param_group: dict) -> None:
        """Add ``param_group``, split by the µP multipliers of its parameters (see ``hydro.shrink``)."""
        params = param_group["params"]
        parts = group_by_multipliers([params] if isinstance(params, Tensor) else list(params), self.mup_rule)
        for (lr_mult, wd_mult), part in parts.items():
            self._add_group({**param_group, "params": part,
                             "lr_mult": param_group.get("lr_mult", self.defaults["lr_mult"]) * lr_mult,
                             "wd_mult": param_group.get("wd_mult", self.defaults["wd_mult"]) * wd_mult})

    def _add_group(self, param_group: dict) -> None:
        unguarded("add_param_group")(self, param_group)
        group = self.param_groups[-1]
        count = member_count([p for g in self.param_groups for p in g["params"]])
        if self.num_members is not None and count != self.num_members:  # plain parameters joined fused-looking ones
            for earlier in self.param_groups[:-1]:
                self._as_plain(earlier)
        self.num_members = count
        self._normalize(group)
        self._validate(group)

    # torch.optim's methods, without importing torch._dynamo before anything compiles (see hydro.optim.dynamo_guard)
    def zero_grad(self, set_to_none: bool = True) -> None:
        unguarded("zero_grad")(self, set_to_none)

    def state_dict(self) -> dict:
        return unguarded("state_dict")(self)

    def load_state_dict(self, state_dict: dict) -> None:
        unguarded("load_state_dict")(self, state_dict)

    def _as_plain(self, group: dict) -> None:
        """An earlier group, normalised for ``F`` members, as the one member of unfused parameters."""
        for name in self.per_member:
            values = group[name]
            if not bool((values == values[0]).all()):
                raise ValueError(f"{type(self).__name__}: hyperparameter '{name}' has one value per member "
                                 f"({values.tolist()}) but the parameters are not fused (their leading sizes "
                                 f"differ). Fix: pass the parameters of a hydro.fuse model, or one value for a "
                                 f"plain model")
            group[name] = values[:1].clone()

    def _normalize(self, group: dict) -> None:
        for name in self.per_member:
            try:
                group[name] = per_member(group[name], self.num_members, name, type(self).__name__)
            except ValueError as error:
                if self.num_members != 1:
                    raise
                raise ValueError(f"{error} (the parameters are not fused: their leading sizes differ, so they are "
                                 f"one member)") from error

    def _validate(self, group: dict) -> None:
        """Refuse what the ``torch.optim`` namesake refuses, for every member."""
        check(f"{type(self).__name__}: ", ("lr", group["lr"], lambda v: ~(v < 0), ">= 0 for every member"))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list[Tensor]) -> None:
        """Apply one step to ``params`` (those of ``group`` that have gradients)."""
        raise NotImplementedError

    def resolved(self, group: dict, like: Tensor) -> dict[str, float | Tensor]:
        """The group's per-member values (see :meth:`resolve`) for ``like``'s dtype and device, cached until
        the group's hyperparameter tensors or multipliers are replaced (LR schedulers, slicing)."""
        key = (*(id(group[n]) for n in self.per_member), group["lr_mult"], group["wd_mult"], like.dtype, like.device)
        cached = self._resolved.get(id(group))
        if cached is None or cached[0] != key:
            cached = self._resolved[id(group)] = (key, self._resolve_group(group, like))
        return cached[1]

    def _resolve_group(self, group: dict, like: Tensor) -> dict[str, float | Tensor]:
        """The values ``_update`` needs, each resolved with :meth:`resolve`."""
        raise NotImplementedError

    @staticmethod
    def resolve(values: Tensor, like: Tensor) -> float | Tensor:
        """Per-member values ``[F]`` for arithmetic with parameters like ``like``: a Python float when all
        members share it (torch's own scalar arithmetic, no broadcast), else ``[F]`` in ``like``'s dtype."""
        if bool((values == values[0]).all()):
            return float(values[0])
        return values.to(device=like.device, dtype=like.dtype)

    @staticmethod
    def per_param(value: float | Tensor, param: Tensor) -> float | Tensor:
        """A resolved value shaped to broadcast against ``param`` ``[F, ...]``."""
        return value if isinstance(value, float) else member_view(value, param.dim() - 1)

    @staticmethod
    def add_scaled(x: Tensor, y: Tensor, scale: float | Tensor, *, inplace: bool = False) -> Tensor:
        """``x + scale * y`` with a resolved ``scale`` (float, or ``[F]`` broadcast over ``y``'s member dims)."""
        if isinstance(scale, float):
            return x.add_(y, alpha=scale) if inplace else x.add(y, alpha=scale)
        scale = member_view(scale, y.dim() - 1)
        return x.addcmul_(y, scale) if inplace else torch.addcmul(x, y, scale)

    @torch.no_grad()
    def keep_members(self, index: Tensor) -> None:
        """Keep only the members at ``index`` (hyperparameters and state); see ``hydro.keep_members``."""
        old, self.num_members = self.num_members, len(index)
        for group in self.param_groups:
            for name in self.per_member:
                group[name] = group[name].index_select(0, index.cpu())
        for state in self.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and value.dim() and value.shape[0] == old:
                    state[key] = value.index_select(0, index.to(value.device))
