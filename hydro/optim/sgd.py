"""Fused SGD (momentum, dampening, Nesterov, weight decay), each hyperparameter per member."""
from __future__ import annotations

import torch
from torch import Tensor

from hydro.checks import check
from .base import FusedOptimizer


class SGD(FusedOptimizer):
    """``torch.optim.SGD`` for ``F`` members at once; ``lr``, ``momentum``, ``dampening`` and ``weight_decay``
    are scalars or ``F`` values. Member ``i`` follows exactly the update torch's SGD would give it alone."""

    per_member = ("lr", "momentum", "dampening", "weight_decay")

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

    def _resolve_group(self, group: dict, like: Tensor) -> dict:
        return {"neg_lr": self.resolve(-group["lr"] * group["lr_mult"], like),
                "decay": self.resolve(group["weight_decay"] * group["wd_mult"], like),
                "momentum": self.resolve(group["momentum"], like),
                "damping": self.resolve(1 - group["dampening"], like),
                "some_momentum": bool(group["momentum"].any()), "all_momentum": bool(group["momentum"].all()),
                "has_momentum": (group["momentum"] != 0).to(like.device)}

    def _update(self, group: dict, params: list[Tensor]) -> None:
        view, h = self.per_param, self.resolved(group, params[0])
        neg_lr, decay, momentum, damping = h["neg_lr"], h["decay"], h["momentum"], h["damping"]
        some_momentum, all_momentum = h["some_momentum"], h["all_momentum"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            if isinstance(decay, Tensor) or decay != 0.0:
                grad = self.add_scaled(grad, p, decay)
            if some_momentum:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.clone()
                else:
                    self.add_scaled(buf.mul_(view(momentum, p)), grad, damping, inplace=True)
                direction = self.add_scaled(grad, buf, momentum) if group["nesterov"] else buf
                if not all_momentum:  # members without momentum step along the plain gradient
                    direction = torch.where(h["has_momentum"].view(-1, *([1] * (p.dim() - 1))), direction, grad)
            else:
                direction = grad
            self.add_scaled(p, direction, neg_lr, inplace=True)
