"""Fused SGD (momentum, dampening, Nesterov, weight decay), each hyperparameter per member."""
from __future__ import annotations

import torch
from torch import Tensor

from hydro.checks import check
from .base import Derived, FusedOptimizer


class SGD(FusedOptimizer):
    """``torch.optim.SGD`` for ``F`` members at once; ``lr``, ``momentum``, ``dampening`` and ``weight_decay``
    are scalars or ``F`` values. Member ``i`` follows exactly the update torch's SGD would give it alone.

    Members without momentum (``momentum = 0`` beside members with) keep a buffer equal to their gradient
    (``0 * buffer + gradient``), so every member steps along its buffer: exact while gradients are finite."""

    per_member = ("lr", "momentum", "dampening", "weight_decay")
    derived = {
        "neg_lr": Derived(("lr",), lambda g: -g["lr"] * g["lr_mult"]),
        "decay": Derived(("weight_decay",), lambda g: g["weight_decay"] * g["wd_mult"]),
        "momentum": Derived(("momentum",), lambda g: g["momentum"]),
        "damping": Derived(("momentum", "dampening"),  # 1 for members without momentum: buffer = gradient
                           lambda g: torch.where(g["momentum"] != 0, 1 - g["dampening"], 1.0)),
    }

    def __init__(self, params, lr: float = 1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov: bool = False, *, maximize: bool = False) -> None:
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize))

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        check("SGD: ", *((name, group[name], lambda v: ~(v < 0), ">= 0 for every member")  # torch's rule: NaN passes
                       for name in ("momentum", "weight_decay")))
        if group["nesterov"] and ((group["momentum"] <= 0).any() or (group["dampening"] != 0).any()):
            raise ValueError("SGD: Nesterov momentum requires momentum > 0 and dampening = 0 for every member")

    def _update(self, group: dict, params: list[Tensor]) -> None:
        grads = [p.grad for p in params]
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        decay = self.per_param(group, "decay", params)
        if not isinstance(decay, float) or decay != 0.0:
            grads = self.add_scaled(grads, params, decay)
        direction = grads
        if self.flag(group, "momentum", lambda m: bool(m.any())):
            momentum = self.per_param(group, "momentum", params)
            bufs = [self.state[p].get("momentum_buffer") for p in params]
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
