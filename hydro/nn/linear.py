"""Fused ``Linear``: one batched matmul ``[F, N, in] x [F, in, out]``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, factory_of, stacked_parameter


class Linear(FusedModule):
    """``F`` members of ``nn.Linear``. Input ``[F, *, in]`` (or shared ``[*, in]``), output ``[F, *, out]``.

    Parameters: ``weight [F, out, in]``, ``bias [F, out]``.
    """

    supports_shared_input = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, num_members: int,
                 device=None, dtype=None) -> None:
        super().__init__(num_members)
        factory = {"device": device, "dtype": dtype}
        self.in_features, self.out_features = in_features, out_features
        self.weight = stacked_parameter((out_features, in_features), num_members, factory)
        self.register_parameter("bias", stacked_parameter((out_features,), num_members, factory) if bias else None)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.Linear, num_members: int) -> "Linear":
        return cls(template.in_features, template.out_features, template.bias is not None,
                   num_members=num_members, **factory_of(template))

    def member_module(self) -> nn.Linear:
        return nn.Linear(self.in_features, self.out_features, self.bias is not None, **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        return fused_linear(x, self.weight, self.bias, shared=self.shared_input)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, " + super().extra_repr())


# Weight elements per activation element from which fused_linear computes weight-major. Measured (2-core
# CPU, batch 64, train step): 64-1024-1024-10 (ratio 8) F=1/2/4: 30-33% faster weight-major; 784-256-256-10
# (ratio 2) F=1/4/16/64: 7-10% slower.
WEIGHT_MAJOR_RATIO = 4


def fused_linear(x: Tensor, weight: Tensor, bias: Tensor | None, *, shared: bool = False) -> Tensor:
    """``y[f] = x[f] @ weight[f].T + bias[f]``.

    ``x``: ``[F, *, in]``, or ``[*, in]`` shared by all members (then one GEMM against all ``F*out``
    output columns, with no copy of ``x``). ``weight``: ``[F, out, in]``; ``bias``: ``[F, out]``.
    Returns ``[F, *, out]``.
    """
    members, out_features, in_features = weight.shape
    if shared:
        y = F.linear(x, weight.reshape(members * out_features, in_features),
                     None if bias is None else bias.reshape(-1))
        return y.unflatten(-1, (members, out_features)).movedim(-2, 0)
    flat = x.reshape(members, -1, in_features)
    if in_features * out_features >= WEIGHT_MAJOR_RATIO * flat.shape[1] * (in_features + out_features):
        # Weights much larger than the member's batch of activations: compute y^T = weight @ x^T, whose
        # weight gradient autograd returns in the weight's own [F, out, in] layout (x @ weight^T returns it
        # transposed, and accumulating it costs a cache-unfriendly strided copy of every weight per step).
        # The output is then a transposed (feature-major) view.
        if bias is None:
            y = torch.bmm(weight, flat.transpose(1, 2))
        else:
            y = torch.baddbmm(bias.unsqueeze(2), weight, flat.transpose(1, 2))
        return y.transpose(1, 2).view(members, *x.shape[1:-1], out_features)
    if flat.device.type == "cpu" and torch.is_grad_enabled() and weight.requires_grad \
            and not torch.is_autocast_enabled("cpu"):
        y = _RowMajorLinear.apply(flat, weight, bias)
    else:
        y = _row_major(flat, weight, bias)
    return y.view(members, *x.shape[1:-1], out_features)


def _row_major(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x @ weight^T + bias`` for ``x [F, N, in]``, ``weight [F, out, in]``, ``bias [F, out]`` or ``None``."""
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


class _RowMajorLinear(torch.autograd.Function):
    """``y = x @ weight^T + bias`` (``x [F, N, in]``, ``weight [F, out, in]``, ``bias [F, out]`` or ``None``) whose
    backward computes the weight gradient as ``grad_y^T @ x``, in the weight's own ``[F, out, in]`` layout:
    autograd's ``x^T @ grad_y`` is its transpose, which accumulating into ``weight.grad`` copies element by element
    (a strided copy of every weight per step). On CPU both give the same bits (the same products, summed in the
    same order); the other gradients are autograd's."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        # forward(ctx, ...) rather than setup_context: apply then binds no signature (inspect) per call
        ctx.save_for_backward(x, weight)
        return _row_major(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.bmm(grad.transpose(1, 2), x) if ctx.needs_input_grad[1] else None
        grad_bias = grad.sum(1) if ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias
