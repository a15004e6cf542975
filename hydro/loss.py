"""Per-member losses of a fused model.

Train on ``trial_losses(...).sum()``: the sum's gradient with respect to member ``i``'s parameters is
exactly the gradient of member ``i``'s own loss (a mean would divide every member's gradient by ``F``).
"""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.loss import _Loss


def trial_losses(loss_fn: Callable[..., Tensor], output: Tensor, target: Tensor, *,
                 target_fused: bool = False) -> Tensor:
    """``loss_fn(output[i], target)`` for every member ``i``, as ``[F]``.

    ``output``: ``[F, N, ...]``; ``target``: the shared ``[N, ...]`` (or ``[F, N, ...]`` with
    ``target_fused=True``). ``loss_fn`` is any torch loss of one model (module or function) that reduces
    to a scalar, e.g. ``nn.CrossEntropyLoss()``.
    """
    _check_arguments(loss_fn, output, target, target_fused)
    if isinstance(loss_fn, nn.CrossEntropyLoss) and loss_fn.reduction == "mean" and not target_fused \
            and target.dtype == torch.long:
        return _cross_entropy(loss_fn, output, target)
    losses = torch.vmap(loss_fn, in_dims=(0, 0 if target_fused else None), randomness="different")(output, target)
    if losses.dim() != 1:
        raise LossError(f"loss_fn must reduce each member's loss to a scalar (reduction='mean' or 'sum'); it "
                         f"returned shape {tuple(losses.shape[1:])} per member")
    return losses


class LossError(ValueError):
    """The loss cannot give one loss per member for these arguments (whichever member computes it)."""


# Torch losses that pair output and target element by element and broadcast (with only a warning) when their shapes
# differ, e.g. MSELoss on [N, 1] against [N]: the mean over [N, N] pairs.
ELEMENTWISE = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.HuberLoss)


def _check_arguments(loss_fn, output, target, target_fused: bool) -> None:
    """A loss module's class instead of an instance, or shapes that do not pair member outputs with the targets
    of a torch loss module (which needs the batch dimensions to agree)."""
    if isinstance(loss_fn, type):
        raise TypeError(f"hydro.trial_losses: loss_fn is the class {loss_fn.__name__}; pass an instance, "
                        f"e.g. {loss_fn.__name__}()")
    if not callable(loss_fn):
        raise TypeError(f"hydro.trial_losses: loss_fn must be a loss function or module, got {type(loss_fn).__name__}")
    if not (isinstance(loss_fn, _Loss) and isinstance(output, Tensor) and isinstance(target, Tensor)) \
            or target.dim() == 0:
        return  # a function of the user's may reshape; a tuple of outputs: vmap maps over each
    if target_fused:
        paired = output.dim() >= 1 and target.shape[0] == output.shape[0]
        expected = "a target [F, N, ...] with the output's F (target_fused=True)"
    else:
        paired = output.dim() >= 2 and output.shape[1] == target.shape[0]
        expected = "the fused model's output [F, N, ...] and the members' shared target [N, ...]"
    if not paired:
        raise LossError(f"hydro.trial_losses: output {tuple(output.shape)} and target {tuple(target.shape)} do not "
                         f"pair up; expected {expected}")
    member = output.shape[1:] if not target_fused else output.shape
    if isinstance(loss_fn, ELEMENTWISE) and member != target.shape:
        raise LossError(f"hydro.trial_losses: {type(loss_fn).__name__} pairs each member's output "
                         f"{tuple(member)} with the target {tuple(target.shape)} element by element; torch would "
                         f"broadcast them to {tuple(torch.broadcast_shapes(member, target.shape))} and average the "
                         f"wrong pairs. Give them one shape (e.g. the model's output .squeeze(-1), or targets "
                         f"[N, 1] in TuneSpec.data())")


def _cross_entropy(loss_fn: nn.CrossEntropyLoss, output: Tensor, target: Tensor) -> Tensor:
    """``nn.CrossEntropyLoss`` per member in one call: output ``[F, N, C, *d]``, class targets ``[N, *d]``.
    Each member's loss is its weighted mean over the non-ignored targets, exactly torch's 'mean' reduction."""
    members = output.shape[0]
    per_sample = F.cross_entropy(output.flatten(0, 1), target.repeat(members, *([1] * (target.dim() - 1))),
                                 weight=loss_fn.weight, ignore_index=loss_fn.ignore_index, reduction="none",
                                 label_smoothing=loss_fn.label_smoothing)
    valid = target != loss_fn.ignore_index
    weights = valid.to(output.dtype) if loss_fn.weight is None else \
        torch.where(valid, loss_fn.weight[target.clamp_min(0)], 0).to(output.dtype)
    return per_sample.view(members, -1).sum(dim=1) / weights.sum()


def loss_on(loss_fn: Callable[..., Tensor], device: torch.device | str) -> Callable[..., Tensor]:
    """``loss_fn`` with the tensors it holds on ``device``: a loss module holding tensors elsewhere (e.g.
    ``CrossEntropyLoss(weight=...)``, ``BCEWithLogitsLoss(pos_weight=...)``) as a moved copy (the user's module
    is left as it is), anything else as it is."""
    if not isinstance(loss_fn, nn.Module):
        return loss_fn
    device = torch.device(device)
    held = [*loss_fn.parameters(), *loss_fn.buffers()]
    if all(t.device == device for t in held):
        return loss_fn
    return copy.deepcopy(loss_fn).to(device)
