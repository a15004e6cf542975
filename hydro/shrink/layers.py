"""µP layers that behave differently from their torch counterparts, and their fused twins.

``Readout``: the output layer, input multiplied by ``output_mult`` (= 1/width_mult, like ``mup.MuReadout``),
optionally zero-initialised. ``MuMultiheadAttention``: attention logits scaled by µP's
``sqrt(base_head_dim)/head_dim`` (mup's ``attn_mult/d`` with ``attn_mult = sqrt(base_head_dim)``): torch's
1/sqrt(head_dim) where the head dimension is the full model's, 1/head_dim scaling as heads narrow.
``MuTransformerEncoderLayer``: a TransformerEncoderLayer whose self-attention is a ``MuMultiheadAttention``. All keep the torch layer's ``state_dict`` keys; ``hydro.fuse``
fuses them with fast twins (registered here).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import hydro.nn
from hydro.nn.base import factory_of
from hydro.nn.linear import fused_linear


class Readout(nn.Linear):
    """µP output layer ``[*, in] -> [*, out]``: ``Linear(x * output_mult)``, ``output_mult = 1/width_mult``
    (``width_mult`` = shrunk/target fan-in). ``zero_init`` initialises weight and bias to 0."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, output_mult: float = 1.0,
                 zero_init: bool = False, device=None, dtype=None) -> None:
        self.output_mult = output_mult
        self.zero_init = zero_init
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        if not self.zero_init:
            super().reset_parameters()
            return
        with torch.no_grad():
            self.weight.zero_()
            if self.bias is not None:
                self.bias.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x * self.output_mult)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", output_mult={self.output_mult}, zero_init={self.zero_init}"


class FusedReadout(hydro.nn.Linear):
    """``F`` members of :class:`Readout`: input ``[F, *, in]`` (or shared ``[*, in]``), output ``[F, *, out]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, output_mult: float = 1.0,
                 num_members: int, device=None, dtype=None) -> None:
        self.output_mult = output_mult
        super().__init__(in_features, out_features, bias, num_members=num_members, device=device, dtype=dtype)

    @classmethod
    def from_module(cls, template: Readout, num_members: int) -> "FusedReadout":
        return cls(template.in_features, template.out_features, template.bias is not None,
                   output_mult=template.output_mult, num_members=num_members, **factory_of(template))

    def member_module(self) -> Readout:
        return Readout(self.in_features, self.out_features, self.bias is not None, output_mult=self.output_mult,
                       **factory_of(self))

    def forward(self, x: Tensor) -> Tensor:
        return fused_linear(x * self.output_mult, self.weight, self.bias, shared=self.shared_input)


class MuMultiheadAttention(nn.MultiheadAttention):
    """``nn.MultiheadAttention`` (same arguments, forward and ``state_dict``) whose attention logits are
    ``scale * q·k`` with ``scale = sqrt(base_head_dim) / head_dim`` (µP; ``base_head_dim``: the full-size
    model's head dimension), which is torch's ``1/sqrt(head_dim)`` when the head dimension is the full model's.
    Only ``kdim = vdim = embed_dim``, no ``add_bias_kv``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, *, base_head_dim: int, device=None, dtype=None) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, batch_first=batch_first, device=device, dtype=dtype)
        self.base_head_dim = base_head_dim

    @property
    def scale(self) -> float:
        """The attention logits' multiplier (read by the fused twin, ``hydro.nn.MultiheadAttention``)."""
        return math.sqrt(self.base_head_dim) / self.head_dim

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        if self.head_dim == self.base_head_dim:  # torch's scale: torch's forward, fast paths included
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        if self.batch_first and query.dim() == 3:
            # one transpose per distinct tensor: self-attention's `query is key is value` still holds, so q, k, v
            # are projected by one packed matmul as in nn.MultiheadAttention
            transposed: dict[int, Tensor] = {}
            query, key, value = (transposed.setdefault(id(t), t.transpose(0, 1)) for t in (query, key, value))
        # torch scales q by 1/sqrt(head_dim); scaling the query projection by scale*sqrt(head_dim) =
        # sqrt(base_head_dim/head_dim) gives logits scale*q·k, the same function of the parameters (so the same
        # gradients).
        factor = math.sqrt(self.base_head_dim / self.head_dim)
        e = self.embed_dim
        weight = torch.cat([self.in_proj_weight[:e] * factor, self.in_proj_weight[e:]])
        bias = self.in_proj_bias
        if bias is not None:
            bias = torch.cat([bias[:e] * factor, bias[e:]])
        out, weights = F.multi_head_attention_forward(
            query, key, value, e, self.num_heads, weight, bias, self.bias_k, self.bias_v, self.add_zero_attn,
            self.dropout, self.out_proj.weight, self.out_proj.bias, training=self.training,
            key_padding_mask=key_padding_mask, need_weights=need_weights, attn_mask=attn_mask,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        return (out.transpose(0, 1) if self.batch_first and query.dim() == 3 else out), weights

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, base_head_dim={self.base_head_dim}"


class MuTransformerEncoderLayer(nn.TransformerEncoderLayer):
    """``nn.TransformerEncoderLayer`` whose self-attention is a :class:`MuMultiheadAttention` of base head
    dimension ``base_head_dim``."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, *, base_head_dim: int, device=None,
                 dtype=None) -> None:
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
                         norm_first, bias, device=device, dtype=dtype)
        self.self_attn = MuMultiheadAttention(d_model, nhead, dropout, bias, batch_first,
                                              base_head_dim=base_head_dim, device=device, dtype=dtype)
        if self.self_attn.head_dim != base_head_dim:
            # torch's eval fast path (one fused kernel) reads self_attn's weights directly and scales logits by
            # 1/sqrt(head_dim), bypassing MuMultiheadAttention.forward; this flag is one of its preconditions
            # and is used for nothing else. Where the head dimension is kept, the fast path is the same function.
            self.activation_relu_or_gelu = 0


hydro.nn.register_twin(Readout, FusedReadout)
hydro.nn.register_twin(MuMultiheadAttention, hydro.nn.MultiheadAttention)
hydro.nn.register_twin(MuTransformerEncoderLayer, hydro.nn.TransformerEncoderLayer)
