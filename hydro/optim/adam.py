"""Fused Adam and AdamW, each hyperparameter (``lr``, ``betas``, ``eps``, ``weight_decay``) per member."""
from __future__ import annotations

import torch
from torch import Tensor

from hydro.checks import check
from .base import FusedOptimizer


class Adam(FusedOptimizer):
    """``torch.optim.Adam`` for ``F`` members at once. ``betas = (beta1, beta2)``, each a scalar or ``F``
    values. ``decoupled_weight_decay=True`` gives AdamW."""

    per_member = ("lr", "beta1", "beta2", "eps", "weight_decay")
    mup_rule = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay))

    def _normalize(self, group: dict) -> None:
        if "betas" in group:
            betas = group.pop("betas")
            if not isinstance(betas, (tuple, list)) or len(betas) != 2:
                raise ValueError(f"{type(self).__name__}: betas must be a pair (beta1, beta2), each a scalar or one "
                                 f"value per member, got {betas!r}")
            group["beta1"], group["beta2"] = betas
        super()._normalize(group)

    def _validate(self, group: dict) -> None:
        check(f"{type(self).__name__}: ",  # torch's rule for Adam: NaN is refused too
              *((name, group[name], lambda v: v >= 0, ">= 0 for every member")
                for name in ("lr", "eps", "weight_decay")),
              *((name, group[name], lambda v: (v >= 0) & (v < 1), "in [0, 1) for every member")
                for name in ("beta1", "beta2")))

    def _resolve_group(self, group: dict, like: Tensor) -> dict:
        lr_all = group["lr"] * group["lr_mult"]
        decay_all = group["weight_decay"] * group["wd_mult"]
        return {"lr_all": lr_all, "decay": self.resolve(decay_all, like),
                "shrink": self.resolve(1 - lr_all * decay_all, like),  # decoupled decay factor
                "blend1": self.resolve(1 - group["beta1"], like), "beta2": self.resolve(group["beta2"], like),
                "blend2": self.resolve(1 - group["beta2"], like), "eps": self.resolve(group["eps"], like)}

    def _update(self, group: dict, params: list[Tensor]) -> None:
        view, h = self.per_param, self.resolved(group, params[0])
        lr_all, decay, shrink, blend1 = h["lr_all"], h["decay"], h["shrink"], h["blend1"]
        beta2, blend2, eps = h["beta2"], h["blend2"], h["eps"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros(self.num_members, dtype=torch.int64)  # per member: a skipped step
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # (fp16 overflow)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)  # counts for none
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif not isinstance(state["step"], Tensor) or state["step"].shape != (self.num_members,):
                state["step"] = torch.full((self.num_members,), int(state["step"]), dtype=torch.int64)  # torch's
            state["step"] += 1
            step = state["step"]  # [F] on the CPU, like the hyperparameters
            if isinstance(decay, Tensor) or decay != 0.0:
                if group["decoupled_weight_decay"]:
                    p.mul_(view(shrink, p))
                else:
                    grad = self.add_scaled(grad, p, decay)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, view(blend1, p))
            exp_avg_sq.mul_(view(beta2, p))
            if isinstance(blend2, float):
                exp_avg_sq.addcmul_(grad, grad, value=blend2)
            else:
                exp_avg_sq.addcmul_(grad, grad * view(blend2, p))
            step_size = self.resolve(lr_all / (1 - group["beta1"] ** step), p)
            bias_correction2_sqrt = self.resolve((1 - group["beta2"] ** step).sqrt(), p)
            if group["amsgrad"]:
                torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                exp_avg_sq = state["max_exp_avg_sq"]
            denom = (exp_avg_sq.sqrt() / view(bias_correction2_sqrt, p)).add_(view(eps, p))
            if isinstance(step_size, float):
                p.addcdiv_(exp_avg, denom, value=-step_size)
            else:  # p -= m / (denom / step_size): one pass less than (m / denom) * step_size
                p.addcdiv_(exp_avg, denom.div_(view(step_size, p)), value=-1)


class AdamW(Adam):
    """``torch.optim.AdamW`` for ``F`` members at once (decoupled weight decay, default 1e-2)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad: bool = False, *,
                 maximize: bool = False) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True)

