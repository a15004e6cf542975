"""Fused Adam and AdamW, each hyperparameter (``lr``, ``betas``, ``eps``, ``weight_decay``) per member."""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from hydro.checks import check
from .base import Derived, FusedOptimizer


class Adam(FusedOptimizer):
    """``torch.optim.Adam`` for ``F`` members at once. ``betas = (beta1, beta2)``, each a scalar or ``F``
    values. ``decoupled_weight_decay=True`` gives AdamW. ``cpu_kernel``: on the CPU, step each member with torch's
    fused Adam(W) kernel (as ``torch.optim.Adam(W)(..., fused=True)`` steps it: one pass over each tensor, about
    4x faster than the multi-tensor operations, which step on GPUs and for ``cpu_kernel=False``)."""

    per_member = ("lr", "beta1", "beta2", "eps", "weight_decay")
    state_keys = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    mup_rule = "adam"
    derived = {
        "lr_all": Derived(("lr",), lambda g: g["lr"] * g["lr_mult"], scalar=False, dtype=torch.float64),
        "decay": Derived(("weight_decay",), lambda g: g["weight_decay"] * g["wd_mult"]),
        "shrink": Derived(("lr", "weight_decay"),  # decoupled decay factor
                          lambda g: 1 - (g["lr"] * g["lr_mult"]) * (g["weight_decay"] * g["wd_mult"])),
        "blend1": Derived(("beta1",), lambda g: 1 - g["beta1"]),
        "beta2": Derived(("beta2",), lambda g: g["beta2"]),
        "blend2": Derived(("beta2",), lambda g: 1 - g["beta2"]),
        "eps": Derived(("eps",), lambda g: g["eps"]),
        "beta1_f64": Derived(("beta1",), lambda g: g["beta1"], scalar=False, dtype=torch.float64),
        "beta2_f64": Derived(("beta2",), lambda g: g["beta2"], scalar=False, dtype=torch.float64),
    }

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad: bool = False, *,
                 maximize: bool = False, decoupled_weight_decay: bool = False, cpu_kernel: bool = True) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, decoupled_weight_decay=decoupled_weight_decay,
                                      cpu_kernel=cpu_kernel))

    @classmethod
    def absent_state(cls, key: str, group: Mapping, like: Tensor) -> Tensor:
        """Zeros (moments and step counts), as a parameter's first step creates them."""
        if key not in cls.state_keys:
            return super().absent_state(key, group, like)
        return torch.zeros_like(like)

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

    def _update(self, group: dict, params: list[Tensor]) -> None:
        grads = [p.grad for p in params]
        steps, exp_avgs, exp_avg_sqs = [], [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] = self._member_steps(state.get("step"), p)
            steps.append(state["step"])
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        torch._foreach_add_(steps, 1)
        if self.host_kernel(group, params, grads, exp_avgs, exp_avg_sqs):
            self._host_update(group, params, grads, steps, exp_avgs, exp_avg_sqs)
            return
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        decay = self.per_param(group, "decay", params)
        if not isinstance(decay, float) or decay != 0.0:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(params, self.per_param(group, "shrink", params))
            else:
                grads = self.add_scaled(grads, params, decay)
        torch._foreach_lerp_(exp_avgs, grads, self.per_param(group, "blend1", params))
        torch._foreach_mul_(exp_avg_sqs, self.per_param(group, "beta2", params))
        blend2 = self.per_param(group, "blend2", params)
        if isinstance(blend2, float):
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=blend2)
        else:
            torch._foreach_addcmul_(exp_avg_sqs, grads, torch._foreach_mul(grads, blend2))
        step_size, bias_correction2_sqrt = self._step_sizes(group, params, steps)
        if group["amsgrad"]:
            exp_avg_sqs = [self.state[p]["max_exp_avg_sq"] for p in params]
            torch._foreach_maximum_(exp_avg_sqs, [self.state[p]["exp_avg_sq"] for p in params])
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.per_param(group, "eps", params))
        torch._foreach_div_(denom, step_size)  # p -= m / (denom / step_size): as torch's capturable Adam
        torch._foreach_addcdiv_(params, exp_avgs, denom, value=-1)

    def _host_update(self, group: dict, params: list[Tensor], grads: list[Tensor], steps: list[Tensor],
                     exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor]) -> None:
        """The step on the CPU: torch's fused Adam(W) kernel (one pass over each tensor, about 4x faster than the
        multi-tensor ops) member by member, with that member's hyperparameters, on its slices of ``params`` and
        their state (``steps`` already counted): each member steps exactly as ``torch.optim.Adam(W)(...,
        fused=True)`` with its hyperparameters would."""
        kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
        maxes = [self.state[p]["max_exp_avg_sq"] for p in params] if group["amsgrad"] else []
        counts = [step.to(torch.float32) for step in steps]
        lr, decay, beta1, beta2, eps = (self.host_values(group, name)
                                        for name in ("lr_all", "decay", "beta1_f64", "beta2", "eps"))
        views = [self.member_views(ts, group, slot) for ts, slot in (
            (params, "params"), (grads, None), (exp_avgs, "exp_avg"), (exp_avg_sqs, "exp_avg_sq"),
            (maxes, "max_exp_avg_sq"), (counts, None))]
        for m in range(self.num_members):
            kernel(*(v[m] for v in views), lr=lr[m], beta1=beta1[m], beta2=beta2[m], weight_decay=decay[m],
                   eps=eps[m], amsgrad=group["amsgrad"], maximize=group["maximize"])

    def _member_steps(self, step: Tensor | int | float | None, p: Tensor) -> Tensor:
        """The step counts of ``p``'s members as ``[F, 1, ..., 1]`` int64 on ``p``'s device (a skipped step
        counts for none); a count saved as ``[F]`` or one number (torch's) is converted."""
        shape = (self.num_members, *([1] * (p.dim() - 1)))
        if step is None:
            return torch.zeros(shape, dtype=torch.int64, device=p.device)
        if isinstance(step, Tensor) and step.shape == shape and step.device == p.device:
            return step
        counts = torch.as_tensor(step).to(device=p.device, dtype=torch.int64).reshape(-1)
        return counts.expand(self.num_members).reshape(shape).clone()

    def _step_sizes(self, group: dict, params: list[Tensor], steps: list[Tensor]) -> tuple[list, list]:
        """Per parameter, ``lr / (1 - beta1 ** step)`` and ``sqrt(1 - beta2 ** step)``, each ``[F, 1, ..., 1]`` in
        the parameter's dtype: computed on the device in float64 (as torch's Adam computes them on the host)."""
        bias_correction1 = torch._foreach_pow(self.per_param(group, "beta1_f64", params), steps)
        bias_correction2 = torch._foreach_pow(self.per_param(group, "beta2_f64", params), steps)
        both = bias_correction1 + bias_correction2
        torch._foreach_neg_(both)
        torch._foreach_add_(both, 1)  # 1 - beta ** step
        step_size = torch._foreach_div(self.per_param(group, "lr_all", params), bias_correction1)
        torch._foreach_sqrt_(bias_correction2)
        cast = self.scratch(group, params, 2)
        torch._foreach_copy_(cast, step_size + bias_correction2)
        return cast[:len(params)], cast[len(params):]


class AdamW(Adam):
    """``torch.optim.AdamW`` for ``F`` members at once (decoupled weight decay, default 1e-2)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, cpu_kernel: bool = True) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize,
                         decoupled_weight_decay=True, cpu_kernel=cpu_kernel)

