"""Fused SGD (momentum, dampening, Nesterov, weight decay), each hyperparameter per member."""
from __future__ import annotations

import torch

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
        if (group["momentum"] < 0).any() or (group["weight_decay"] < 0).any():
            raise ValueError("SGD: momentum and weight_decay must be >= 0 for every member")
        if group["nesterov"] and ((group["momentum"] <= 0).any() or (group["dampening"] != 0).any()):
            raise ValueError("SGD: Nesterov momentum requires momentum > 0 and dampening = 0 for every member")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"] * group["lr_mult"]
            decay = group["weight_decay"] * group["wd_mult"]
            momentum, dampening = group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                if decay.any():
                    grad = grad.add(p * self._on(decay, p))
                if momentum.any():
                    state = self.state[p]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = state["momentum_buffer"] = grad.clone()
                    else:
                        buf.mul_(self._on(momentum, p)).add_(grad * self._on(1 - dampening, p))
                    direction = grad + buf * self._on(momentum, p) if group["nesterov"] else buf
                    grad = torch.where(self._on(momentum, p) != 0, direction, grad)
                p.sub_(grad * self._on(lr, p))
        return loss
