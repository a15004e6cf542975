"""Fused ``Conv1d``/``Conv2d``: one grouped convolution with ``F * groups`` groups."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, factory_of, merge_channels, split_channels, stacked_parameter


class _ConvNd(FusedModule):
    """``F`` members of ``nn.ConvNd``. Input ``[F, N, C_in, *S]`` (or shared ``[N, C_in, *S]``), output
    ``[F, N, C_out, *S']``. Parameters: ``weight [F, C_out, C_in/groups, *k]``, ``bias [F, C_out]``."""

    supports_shared_input = True
    _torch_type: type[nn.modules.conv._ConvNd]
    _conv = None

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros", *, num_members: int,
                 device=None, dtype=None) -> None:
        super().__init__(num_members)
        # A meta-device member validates the arguments and normalises them exactly as torch does.
        spec = self._torch_type(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                                padding_mode, device="meta")
        for name in ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups",
                     "padding_mode", "_reversed_padding_repeated_twice"):
            setattr(self, name, getattr(spec, name))
        factory = {"device": device, "dtype": dtype}
        self.weight = stacked_parameter(tuple(spec.weight.shape), num_members, factory)
        self.register_parameter("bias", stacked_parameter((out_channels,), num_members, factory) if bias else None)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.modules.conv._ConvNd, num_members: int) -> "_ConvNd":
        return cls(template.in_channels, template.out_channels, template.kernel_size, template.stride,
                   template.padding, template.dilation, template.groups, template.bias is not None,
                   template.padding_mode, num_members=num_members, **factory_of(template))

    def member_module(self) -> nn.Module:
        return self._torch_type(self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding,
                                self.dilation, self.groups, self.bias is not None, self.padding_mode,
                                **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        members = self.num_members
        weight = self.weight.reshape(members * self.out_channels, *self.weight.shape[2:])
        bias = None if self.bias is None else self.bias.reshape(-1)
        if self.shared_input and self.groups == 1:
            return split_channels(self._apply_conv(x, weight, bias, 1), members)
        if self.shared_input:
            x = x.unsqueeze(0).expand(members, *x.shape)
        return split_channels(self._apply_conv(merge_channels(x), weight, bias, members * self.groups), members)

    def _apply_conv(self, x: Tensor, weight: Tensor, bias: Tensor | None, groups: int) -> Tensor:
        padding = self.padding
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        return type(self)._conv(x, weight, bias, self.stride, padding, self.dilation, groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, groups={self.groups}, " + super().extra_repr())


class Conv1d(_ConvNd):
    _torch_type = nn.Conv1d
    _conv = staticmethod(F.conv1d)


class Conv2d(_ConvNd):
    _torch_type = nn.Conv2d
    _conv = staticmethod(F.conv2d)
