"""Fused SGD (momentum, dampening, Nesterov, weight decay), each hyperparameter per member."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from hydro.checks import check
from .base import Derived, FusedOptimizer


class SGD(FusedOptimizer):
    """``torch.optim.SGD`` for ``F`` members at once; ``lr``, ``momentum``, ``dampening`` and ``weight_decay``
    are scalars or ``F`` values. Member ``i`` follows exactly the update torch's SGD would give it alone.
    ``cpu_kernel``: on the CPU, step each member with torch's fused SGD kernel, bit for bit as
    ``torch.optim.SGD(..., fused=True)`` steps it alone (one pass over each tensor: faster than the multi-tensor
    operations, which step on GPUs and for ``cpu_kernel=False``, but on the smallest models, where the calls per
    member cost more than the passes they save).

    Members without momentum (``momentum = 0`` beside members with) keep a buffer equal to their gradient
    (after ``maximize`` and weight decay; ``0 * buffer + gradient`` in the multi-tensor operations), so every
    member steps along its buffer: exact while gradients are finite. Either path leaves the same
    ``momentum_buffer`` state (equal up to rounding), so a state saved, sliced (``keep_members``) or moved to
    another device by one path resumes in the other."""

    per_member = ("lr", "momentum", "dampening", "weight_decay")
    state_keys = ("momentum_buffer",)
    derived = {
        "neg_lr": Derived(("lr",), lambda g: -g["lr"] * g["lr_mult"]),
        "decay": Derived(("weight_decay",), lambda g: g["weight_decay"] * g["wd_mult"]),
        "momentum": Derived(("momentum",), lambda g: g["momentum"]),
        "damping": Derived(("momentum", "dampening"),  # 1 for members without momentum: buffer = gradient
                           lambda g: torch.where(g["momentum"] != 0, 1 - g["dampening"], 1.0)),
        "lr": Derived(("lr",), lambda g: g["lr"] * g["lr_mult"]),  # for the CPU kernel
        "dampening": Derived(("dampening",), lambda g: g["dampening"]),
    }

    def __init__(self, params, lr: float = 1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov: bool = False, *, maximize: bool = False, cpu_kernel: bool = True) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, cpu_kernel=cpu_kernel))

    @classmethod
    def absent_state(cls, key: str, group: Mapping, like: Tensor) -> Tensor:
        """A zero buffer for members without one: a member without momentum overwrites its buffer with its gradient
        (both paths); a member with finite momentum and no dampening takes ``momentum * 0 + gradient``, its
        first momentum step. Refused for a member with dampening (or infinite/NaN momentum), whose first step
        the buffers of the others would make an ordinary one."""
        if key not in cls.state_keys:
            return super().absent_state(key, group, like)
        momentum, dampening = group["momentum"], group["dampening"]
        first = (momentum != 0) & ~((dampening == 0) & momentum.isfinite())
        if first.any():
            raise ValueError(f"members with momentum {momentum[first].tolist()} and dampening "
                             f"{dampening[first].tolist()} have no momentum buffer yet (their next step is their "
                             f"first momentum step) beside members that have one, which would make it an ordinary "
                             f"step")
        return torch.zeros_like(like)

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        check("SGD: ", *((name, group[name], lambda v: ~(v < 0), ">= 0 for every member")  # torch's rule: NaN passes
                       for name in ("momentum", "weight_decay")))
        if group["nesterov"] and ((group["momentum"] <= 0).any() or (group["dampening"] != 0).any()):
            raise ValueError("SGD: Nesterov momentum requires momentum > 0 and dampening = 0 for every member")

    def _update(self, group: dict, params: list[Tensor]) -> None:
        grads = [p.grad for p in params]
        # a buffer per parameter (None before its first step) while any member has momentum
        bufs = [self.state[p].get("momentum_buffer") for p in params] \
            if self.flag(group, "momentum", lambda m: bool(m.any())) else []
        if self.host_kernel(group, params, grads, [b for b in bufs if b is not None]):
            self._host_update(group, params, grads, bufs)
            return
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        decay = self.per_param(group, "decay", params)
        if not isinstance(decay, float) or decay != 0.0:
            grads = self.add_scaled(grads, params, decay)
        direction = grads
        if bufs:
            momentum = self.per_param(group, "momentum", params)
            old = [i for i, b in enumerate(bufs) if b is not None]
            for i, p in enumerate(params):
                if bufs[i] is None:  # the first step: the buffer is the gradient
                    bufs[i] = self.state[p]["momentum_buffer"] = grads[i].clone()
            if old:
                pick = (lambda xs: xs) if len(old) == len(params) else (lambda xs: [xs[i] for i in old])
                torch._foreach_mul_(pick(bufs), momentum if isinstance(momentum, float) else pick(momentum))
                damping = self.per_param(group, "damping", params)
                self.add_scaled(pick(bufs), pick(grads), damping if isinstance(damping, float) else pick(damping),
                                inplace=True)
            direction = self.add_scaled(grads, bufs, momentum) if group["nesterov"] else bufs
        self.add_scaled(params, direction, self.per_param(group, "neg_lr", params), inplace=True)

    def _host_update(self, group: dict, params: list[Tensor], grads: list[Tensor], bufs: list[Tensor | None]
                     ) -> None:
        """The step on the CPU: torch's fused SGD kernel member by member, with that member's hyperparameters, on
        its slices of ``params``, ``grads`` and the momentum buffers ``bufs`` (``None`` before a parameter's first
        step; none at all while no member has momentum), called as ``torch.optim.SGD(..., fused=True)`` calls it.
        A member without momentum beside members with steps as torch's first momentum step (without Nesterov):
        that moves it by its gradient exactly as a step without momentum does, and sets its buffer to that
        gradient, as the multi-tensor operations do."""
        fresh = [i for i, b in enumerate(bufs) if b is None]
        old = [i for i, b in enumerate(bufs) if b is not None]
        # the parameters whose buffers start now (the first step: buffer = gradient) and the others, apart
        parts = [(first, part) for first, part in ((True, fresh), (False, old)) if part]
        for i in fresh:  # the kernel writes the whole buffer on its first step
            bufs[i] = self.state[params[i]]["momentum_buffer"] = torch.empty_like(grads[i])
        lr, decay, momentum, dampening = (self.host_values(group, name)
                                          for name in ("lr", "decay", "momentum", "dampening"))
        views = [self.member_views(ts, group, slot)
                 for ts, slot in ((params, "params"), (grads, None), (bufs, "momentum_buffer"))]
        for m in range(self.num_members):
            member_params, member_grads, member_bufs = (v[m] for v in views)
            same = dict(lr=lr[m], weight_decay=decay[m], maximize=group["maximize"])
            if not bufs:
                torch._fused_sgd_(member_params, member_grads, [], momentum=0.0, dampening=dampening[m],
                                  nesterov=group["nesterov"], is_first_step=False, **same)
            elif momentum[m] == 0:
                torch._fused_sgd_(member_params, member_grads, member_bufs, momentum=1.0, dampening=0.0,
                                  nesterov=False, is_first_step=True, **same)
            else:
                for first, part in parts:
                    whole = len(part) == len(params)
                    torch._fused_sgd_(*(ts if whole else [ts[i] for i in part]
                                        for ts in (member_params, member_grads, member_bufs)),
                                      momentum=momentum[m], dampening=dampening[m], nesterov=group["nesterov"],
                                      is_first_step=first, **same)
