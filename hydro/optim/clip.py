"""Per-member gradient-norm clipping for fused parameters."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from hydro.checks import check
from hydro.nn.base import member_view
from .base import member_count, per_member

OWNER = "hydro.optim.clip_grad_norm_"


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[Tensor], max_norm, norm_type: float = 2.0) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each member separately.

    ``parameters`` are fused ``[F, ...]``; ``max_norm`` is a scalar or ``F`` values. Each member's
    gradients are scaled by ``min(1, max_norm / (norm + 1e-6))`` of its own total norm. Returns the
    members' total norms ``[F]`` (before clipping). Parameters of a plain model (their leading sizes differ,
    as for the optimizers) are one member: clipped exactly like ``torch.nn.utils.clip_grad_norm_``, norm ``[1]``.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    members = member_count(grads)
    limit = per_member(max_norm, members, "max_norm", OWNER)
    check(f"{OWNER}: ", ("max_norm", limit, lambda v: v >= 0, ">= 0 for every member"))  # < 0 would flip gradients
    per_param = torch.stack([torch.linalg.vector_norm(g.reshape(members, -1), norm_type, dim=1)
                             for g in grads])  # [P, F]; a plain model: one member
    total = torch.linalg.vector_norm(per_param, norm_type, dim=0)  # [F]
    limit = limit.to(total)
    scale = torch.clamp(limit / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(member_view(scale.to(g.dtype), g.dim() - 1) if members > 1 else scale[0].to(g.dtype))
    return total
