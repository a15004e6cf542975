"""Fused versions of parameter-free ``torch.nn`` layers: dropout, pooling, flatten, softmax.

Pooling and channel dropout act per channel, so members' channels are laid side by side
(``[N, F*C, *S]``) and the original layer runs once. Layers whose inputs are all shared stay unfused
(the binder calls the original layer), except dropout, whose masks must differ between members.
"""
from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, Unfusable, expand_members, merge_channels, shift_dim, split_channels
from .functional import tensor_dims, vmap_members


class _Wrapped(FusedModule):
    """A parameter-free layer applied to fused inputs; ``op`` is the original (stateless) module, which the
    binder calls directly where all inputs are shared."""

    data_args = None

    def __init__(self, op: nn.Module, num_members: int) -> None:
        super().__init__(num_members)
        self.op = op

    @classmethod
    def from_module(cls, template: nn.Module, num_members: int) -> "_Wrapped":
        return cls(copy.deepcopy(template), num_members)  # a copy: train()/eval() must not reach the member

    def member_module(self) -> nn.Module:
        return self.op


class Dropout(_Wrapped):
    """Element-wise dropout (``nn.Dropout``, ``nn.AlphaDropout``) with independent masks per member.
    Accepts fused ``[F, N, ...]`` or shared ``[N, ...]`` input (expanded, so masks still differ)."""

    supports_shared_input = True

    def forward(self, x: Tensor) -> Tensor:
        return self.op(expand_members(x, self.num_members) if self.shared_input else x)


class ChannelDropout(_Wrapped):
    """``nn.Dropout1d``/``nn.Dropout2d``: whole channels dropped, independently per member."""

    def forward(self, x: Tensor) -> Tensor:
        return split_channels(self.op(merge_channels(x)), self.num_members)


class Channelwise(_Wrapped):
    """Pooling layers (max, average, adaptive average; 1d/2d) on ``[F, N, C, *S]``."""

    def forward(self, x: Tensor):
        batched_ndim = 2 + _spatial_dims(self.op)
        if x.dim() == batched_ndim:  # unbatched members [C, *S]: the trial dimension acts as the batch
            return self.op(x)
        out = self.op(merge_channels(x))
        if isinstance(out, tuple):  # MaxPool with return_indices
            return tuple(split_channels(t, self.num_members) for t in out)
        return split_channels(out, self.num_members)


class Flatten(_Wrapped):
    """``nn.Flatten`` with its dimensions shifted past the trial dimension."""

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(shift_dim(self.op.start_dim), shift_dim(self.op.end_dim))


class Softmax(_Wrapped):
    """``nn.Softmax``/``LogSoftmax``/``Softmin`` along the member dimension ``dim`` (must be given)."""

    _functions = {nn.Softmax: F.softmax, nn.LogSoftmax: F.log_softmax, nn.Softmin: F.softmin}

    @classmethod
    def from_module(cls, template: nn.Module, num_members: int) -> "Softmax":
        if template.dim is None:
            raise Unfusable(f"{type(template).__name__} without an explicit dim")
        return cls(copy.deepcopy(template), num_members)

    def forward(self, x: Tensor) -> Tensor:
        return self._functions[type(self.op)](x, shift_dim(self.op.dim))


class Vmapped(_Wrapped):
    """Any other parameter-free layer, applied per member under ``torch.vmap`` (inputs all fused)."""

    def forward(self, *args, **kwargs):
        return vmap_members(lambda a, k: self.op(*a, **k), (tensor_dims(args), tensor_dims(kwargs)), (args, kwargs))


def _spatial_dims(op: nn.Module) -> int:
    return 2 if type(op).__name__.endswith("2d") else 1
