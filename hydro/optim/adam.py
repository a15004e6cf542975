"""Fused Adam and AdamW, each hyperparameter (``lr``, ``betas``, ``eps``, ``weight_decay``) per member."""
from __future__ import annotations

import torch

from .base import FusedOptimizer


class Adam(FusedOptimizer):
    """``torch.optim.Adam`` for ``F`` members at once. ``betas = (beta1, beta2)``, each a scalar or ``F``
    values. ``decoupled_weight_decay=True`` gives AdamW."""

    per_member = ("lr", "beta1", "beta2", "eps", "weight_decay")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

    def _normalize(self, group: dict) -> None:
        if "betas" in group:
            betas = group.pop("betas")
            if len(betas) != 2:
                raise ValueError("Adam: betas must be a pair (beta1, beta2), each a scalar or one value per member")
            group["beta1"], group["beta2"] = betas
        super()._normalize(group)

    def _validate(self, group: dict) -> None:
        super()._validate(group)
        for name in ("beta1", "beta2"):
            if ((group[name] < 0) | (group[name] >= 1)).any():
                raise ValueError(f"Adam: {name} must be in [0, 1) for every member, got {group[name].tolist()}")
        if (group["eps"] < 0).any() or (group["weight_decay"] < 0).any():
            raise ValueError("Adam: eps and weight_decay must be >= 0 for every member")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr = group["lr"] * group["lr_mult"]
            decay = group["weight_decay"] * group["wd_mult"]
            beta1, beta2 = group["beta1"], group["beta2"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if group["amsgrad"]:
                        state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = state["step"]
                if decay.any():
                    if group["decoupled_weight_decay"]:
                        p.mul_(self._on(1 - lr * decay, p))
                    else:
                        grad = grad.add(p * self._on(decay, p))
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, self._on(1 - beta1, p))
                exp_avg_sq.mul_(self._on(beta2, p)).addcmul_(grad, grad * self._on(1 - beta2, p))
                step_size = lr / (1 - beta1 ** step)
                bias_correction2_sqrt = (1 - beta2 ** step).sqrt()
                if group["amsgrad"]:
                    torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                    exp_avg_sq = state["max_exp_avg_sq"]
                denom = (exp_avg_sq.sqrt() / self._on(bias_correction2_sqrt, p)).add_(self._on(group["eps"], p))
                p.sub_(exp_avg / denom * self._on(step_size, p))
        return loss


class AdamW(Adam):
    """``torch.optim.AdamW`` for ``F`` members at once (decoupled weight decay, default 1e-2)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)

