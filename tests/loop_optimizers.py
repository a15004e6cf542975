"""The fused optimizers as they stepped before the multi-tensor ones: a Python loop over parameters, per-member
values resolved on the host each time their hyperparameters change (a read per value), Adam's step sizes on the
host and copied per parameter per step. The reference the multi-tensor step is checked against (tests) and timed
against (``benchmarks/optimizer_step.py``)."""
from __future__ import annotations

import torch
from torch import Tensor

from hydro.nn.base import member_view
from hydro.optim import SGD, Adam, AdamW


class _Loop:
    """Host-side resolution of per-member values: a float when all members share it, else ``[F]``."""

    def _loop_resolved(self, group: dict, like: Tensor) -> dict:
        key = (*(id(group[n]) for n in self.per_member), group["lr_mult"], group["wd_mult"], like.dtype, like.device)
        cache = self.__dict__.setdefault("_loop_cache", {})
        cached = cache.get(id(group))
        if cached is None or cached[0] != key:
            cached = cache[id(group)] = (key, self._resolve_group(group, like))
        return cached[1]

    @staticmethod
    def resolve(values: Tensor, like: Tensor) -> float | Tensor:
        if bool((values == values[0]).all()):
            return float(values[0])
        return values.to(device=like.device, dtype=like.dtype)

    @staticmethod
    def view(value, param: Tensor):
        return value if isinstance(value, float) else member_view(value, param.dim() - 1)

    @staticmethod
    def scaled(x: Tensor, y: Tensor, scale, *, inplace: bool = False) -> Tensor:
        if isinstance(scale, float):
            return x.add_(y, alpha=scale) if inplace else x.add(y, alpha=scale)
        scale = member_view(scale, y.dim() - 1)
        return x.addcmul_(y, scale) if inplace else torch.addcmul(x, y, scale)


class LoopSGD(_Loop, SGD):
    def _resolve_group(self, group: dict, like: Tensor) -> dict:
        return {"neg_lr": self.resolve(-group["lr"] * group["lr_mult"], like),
                "decay": self.resolve(group["weight_decay"] * group["wd_mult"], like),
                "momentum": self.resolve(group["momentum"], like),
                "damping": self.resolve(1 - group["dampening"], like),
                "some_momentum": bool(group["momentum"].any()), "all_momentum": bool(group["momentum"].all()),
                "has_momentum": (group["momentum"] != 0).to(like.device)}

    def _update(self, group: dict, params: list[Tensor]) -> None:
        view, h = self.view, self._loop_resolved(group, params[0])
        neg_lr, decay, momentum, damping = h["neg_lr"], h["decay"], h["momentum"], h["damping"]
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            if isinstance(decay, Tensor) or decay != 0.0:
                grad = self.scaled(grad, p, decay)
            if h["some_momentum"]:
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = grad.clone()
                else:
                    self.scaled(buf.mul_(view(momentum, p)), grad, damping, inplace=True)
                direction = self.scaled(grad, buf, momentum) if group["nesterov"] else buf
                if not h["all_momentum"]:
                    direction = torch.where(h["has_momentum"].view(-1, *([1] * (p.dim() - 1))), direction, grad)
            else:
                direction = grad
            self.scaled(p, direction, neg_lr, inplace=True)


class _LoopAdam(_Loop):
    def _resolve_group(self, group: dict, like: Tensor) -> dict:
        lr_all = group["lr"] * group["lr_mult"]
        decay_all = group["weight_decay"] * group["wd_mult"]
        return {"lr_all": lr_all, "decay": self.resolve(decay_all, like),
                "shrink": self.resolve(1 - lr_all * decay_all, like),
                "blend1": self.resolve(1 - group["beta1"], like), "beta2": self.resolve(group["beta2"], like),
                "blend2": self.resolve(1 - group["beta2"], like), "eps": self.resolve(group["eps"], like)}

    def _update(self, group: dict, params: list[Tensor]) -> None:
        view, h = self.view, self._loop_resolved(group, params[0])
        for p in params:
            grad = -p.grad if group["maximize"] else p.grad
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros(self.num_members, dtype=torch.int64)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            step = state["step"]
            if isinstance(h["decay"], Tensor) or h["decay"] != 0.0:
                if group["decoupled_weight_decay"]:
                    p.mul_(view(h["shrink"], p))
                else:
                    grad = self.scaled(grad, p, h["decay"])
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, view(h["blend1"], p))
            exp_avg_sq.mul_(view(h["beta2"], p))
            if isinstance(h["blend2"], float):
                exp_avg_sq.addcmul_(grad, grad, value=h["blend2"])
            else:
                exp_avg_sq.addcmul_(grad, grad * view(h["blend2"], p))
            step_size = self.resolve(h["lr_all"] / (1 - group["beta1"] ** step), p)
            bias_correction2_sqrt = self.resolve((1 - group["beta2"] ** step).sqrt(), p)
            if group["amsgrad"]:
                torch.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                exp_avg_sq = state["max_exp_avg_sq"]
            denom = (exp_avg_sq.sqrt() / view(bias_correction2_sqrt, p)).add_(view(h["eps"], p))
            if isinstance(step_size, float):
                p.addcdiv_(exp_avg, denom, value=-step_size)
            else:
                p.addcdiv_(exp_avg, denom.div_(view(step_size, p)), value=-1)


class LoopAdam(_LoopAdam, Adam):
    pass


class LoopAdamW(_LoopAdam, AdamW):
    pass


LOOP = {SGD: LoopSGD, Adam: LoopAdam, AdamW: LoopAdamW}
