"""Per-member losses of a fused model.

Train on ``trial_losses(...).sum()``: the sum's gradient with respect to member ``i``'s parameters is
exactly the gradient of member ``i``'s own loss (a mean would divide every member's gradient by ``F``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def trial_losses(loss_fn: Callable[..., Tensor], output: Tensor, target: Tensor, *,
                 target_fused: bool = False) -> Tensor:
    """``loss_fn(output[i], target)`` for every member ``i``, as ``[F]``.

    ``output``: ``[F, N, ...]``; ``target``: the shared ``[N, ...]`` (or ``[F, N, ...]`` with
    ``target_fused=True``). ``loss_fn`` is any torch loss of one model (module or function) that reduces
    to a scalar, e.g. ``nn.CrossEntropyLoss()``.
    """
    losses = torch.vmap(loss_fn, in_dims=(0, 0 if target_fused else None), randomness="different")(output, target)
    if losses.dim() != 1:
        raise ValueError(f"loss_fn must reduce each member's loss to a scalar (reduction='mean' or 'sum'); it "
                         f"returned shape {tuple(losses.shape[1:])} per member")
    return losses
