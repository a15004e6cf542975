"""Per-member gradient-norm clipping for fused parameters."""
from __future__ import annotations

from collections.abc import Iterable
from numbers import Real

import torch
from torch import Tensor

from hydro.checks import check
from hydro.nn.base import member_view
from .base import member_count, on_device, per_member

OWNER = "hydro.optim.clip_grad_norm_"


@torch.no_grad()
def clip_grad_norm_(parameters: Iterable[Tensor], max_norm, norm_type: float = 2.0) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for each member separately.

    ``parameters`` are fused ``[F, ...]``; ``max_norm`` is a scalar or ``F`` values. Each member's
    gradients are scaled by ``min(1, max_norm / (norm + 1e-6))`` of its own total norm. Returns the
    members' total norms ``[F]`` (before clipping). Parameters of a plain model (their leading sizes differ,
    as for the optimizers) are one member: clipped exactly like ``torch.nn.utils.clip_grad_norm_``, norm ``[1]``.
    Reads no tensor on the host when ``max_norm`` is a number or a list of numbers (a tensor is checked by
    reading it).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    members = member_count(grads)
    limit = per_member(max_norm, members, "max_norm", OWNER)
    numbers = [max_norm] if isinstance(max_norm, Real) else max_norm if isinstance(max_norm, (list, tuple)) else None
    if numbers is None or not all(isinstance(v, Real) and v >= 0 for v in numbers):  # NaN too; < 0 flips gradients
        check(f"{OWNER}: ", ("max_norm", limit, lambda v: v >= 0, ">= 0 for every member"))
    per_param = torch.stack([torch.linalg.vector_norm(g.reshape(members, -1), norm_type, dim=1)
                             for g in grads])  # [P, F]; a plain model: one member
    total = torch.linalg.vector_norm(per_param, norm_type, dim=0)  # [F]
    scale = torch.clamp(on_device(limit, total.device, total.dtype) / (total + 1e-6), max=1.0)
    views: dict[tuple, Tensor] = {}  # one per dtype and number of dimensions
    for g in grads:
        if (g.dtype, g.dim()) not in views:
            cast = scale.to(g.dtype)
            views[g.dtype, g.dim()] = member_view(cast, g.dim() - 1) if g.dim() else cast.reshape(())
    torch._foreach_mul_(grads, [views[g.dtype, g.dim()] for g in grads])
    return total
