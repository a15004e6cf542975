"""Fused normalisation layers with per-member affine parameters and running statistics."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, factory_of, member_view, merge_channels, split_channels, stacked_parameter


class _BatchNorm(FusedModule):
    """``F`` members of ``nn.BatchNormNd``: input ``[F, N, C, *S]``; statistics are per member.

    Parameters ``weight, bias [F, C]``; buffers ``running_mean, running_var [F, C]``,
    ``num_batches_tracked [F]``.
    """

    _torch_type: type[nn.modules.batchnorm._BatchNorm]

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, *, num_members: int, device=None, dtype=None) -> None:
        super().__init__(num_members)
        factory = {"device": device, "dtype": dtype}
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.register_parameter("weight", stacked_parameter((num_features,), num_members, factory) if affine else None)
        self.register_parameter("bias", stacked_parameter((num_features,), num_members, factory) if affine else None)
        if track_running_stats:
            self.register_buffer("running_mean", torch.zeros(num_members, num_features, **factory))
            self.register_buffer("running_var", torch.ones(num_members, num_features, **factory))
            self.register_buffer("num_batches_tracked",
                                 torch.zeros(num_members, dtype=torch.long, device=device))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.modules.batchnorm._BatchNorm, num_members: int) -> "_BatchNorm":
        return cls(template.num_features, template.eps, template.momentum, template.affine,
                   template.track_running_stats, num_members=num_members, **factory_of(template))

    def member_module(self) -> nn.Module:
        return self._torch_type(self.num_features, self.eps, self.momentum, self.affine, self.track_running_stats,
                                **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        # Mirrors torch.nn.modules.batchnorm._BatchNorm.forward, with channels of all members side by side.
        factor = 0.0 if self.momentum is None else self.momentum
        cumulative = self.training and self.track_running_stats and self.momentum is None
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
        use_batch_stats = self.training or self.running_mean is None
        track = (not self.training or self.track_running_stats) and not cumulative
        flat = lambda t: None if t is None else t.view(-1)  # noqa: E731
        merged = merge_channels(x)
        y = F.batch_norm(merged, flat(self.running_mean) if track else None,
                         flat(self.running_var) if track else None, flat(self.weight), flat(self.bias),
                         use_batch_stats, factor, self.eps)
        if cumulative:
            self._cumulative_update(merged)
        return split_channels(y, self.num_members)

    @torch.no_grad()
    def _cumulative_update(self, merged: Tensor) -> None:
        """``momentum=None``: running statistics as the cumulative average over the batches tracked, with each
        member's count read on the device (torch reads it to the host every step)."""
        dims = [d for d in range(merged.dim()) if d != 1]
        var, mean = torch.var_mean(merged.float(), dim=dims, correction=1)  # [F*C], torch's unbiased running var
        factor = self.num_batches_tracked.to(torch.float64).reciprocal().unsqueeze(1)  # [F, 1]
        for running, batch in ((self.running_mean, mean), (self.running_var, var)):
            running.copy_(((1 - factor) * running + factor * batch.view_as(running)).to(running.dtype))

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, " + super().extra_repr()


class BatchNorm1d(_BatchNorm):
    _torch_type = nn.BatchNorm1d


class BatchNorm2d(_BatchNorm):
    _torch_type = nn.BatchNorm2d


class LayerNorm(FusedModule):
    """``F`` members of ``nn.LayerNorm``: input ``[F, *, *normalized_shape]`` (or shared
    ``[*, *normalized_shape]``); parameters ``weight, bias [F, *normalized_shape]``."""

    supports_shared_input = True

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True, *,
                 num_members: int, device=None, dtype=None) -> None:
        super().__init__(num_members)
        factory = {"device": device, "dtype": dtype}
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.register_parameter("weight", stacked_parameter(shape, num_members, factory) if elementwise_affine else None)
        self.register_parameter("bias", stacked_parameter(shape, num_members, factory)
                                if elementwise_affine and bias else None)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.LayerNorm, num_members: int) -> "LayerNorm":
        return cls(template.normalized_shape, template.eps, template.elementwise_affine, template.bias is not None,
                   num_members=num_members, **factory_of(template))

    def member_module(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.normalized_shape, self.eps, self.elementwise_affine, self.bias is not None,
                            **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps)
        member_ndim = x.dim() if self.shared_input else x.dim() - 1
        if self.weight is None:
            return y.unsqueeze(0).expand(self.num_members, *y.shape) if self.shared_input else y
        weight = member_view(self.weight, member_ndim)
        if self.bias is None:
            return y * weight
        return torch.addcmul(member_view(self.bias, member_ndim), y, weight)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, " + super().extra_repr()


class GroupNorm(FusedModule):
    """``F`` members of ``nn.GroupNorm``: input ``[F, N, C, *S]``; one group norm with ``F*G`` groups."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *,
                 num_members: int, device=None, dtype=None) -> None:
        super().__init__(num_members)
        factory = {"device": device, "dtype": dtype}
        nn.GroupNorm(num_groups, num_channels, eps, affine, device="meta")  # validates like torch
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.register_parameter("weight", stacked_parameter((num_channels,), num_members, factory) if affine else None)
        self.register_parameter("bias", stacked_parameter((num_channels,), num_members, factory) if affine else None)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.GroupNorm, num_members: int) -> "GroupNorm":
        return cls(template.num_groups, template.num_channels, template.eps, template.affine,
                   num_members=num_members, **factory_of(template))

    def member_module(self) -> nn.GroupNorm:
        return nn.GroupNorm(self.num_groups, self.num_channels, self.eps, self.affine, **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        flat = lambda t: None if t is None else t.reshape(-1)  # noqa: E731
        y = F.group_norm(merge_channels(x), self.num_members * self.num_groups, flat(self.weight), flat(self.bias),
                         self.eps)
        return split_channels(y, self.num_members)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, " + super().extra_repr()
