"""Fused ``TransformerEncoderLayer`` and ``TransformerEncoder`` built from the fused layers."""
from __future__ import annotations

import copy

import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiheadAttention
from .base import FusedModule, factory_of
from .linear import Linear
from .normalization import LayerNorm
from .stateless import Dropout

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerEncoderLayer(FusedModule):
    """``F`` members of ``nn.TransformerEncoderLayer``; same arguments and forward, trial dimension first.
    ``attn_scale`` overrides the attention logit scale (µP: ``sqrt(base head_dim)/head_dim``). Element-wise
    activation only."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation="relu", layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, *, attn_scale: float | None = None,
                 num_members: int, device=None, dtype=None) -> None:
        super().__init__(num_members)
        factory = {"device": device, "dtype": dtype, "num_members": num_members}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first, scale=attn_scale, **factory)
        self.linear1 = Linear(d_model, dim_feedforward, bias, **factory)
        self.dropout = Dropout(nn.Dropout(dropout), num_members)
        self.linear2 = Linear(dim_feedforward, d_model, bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(nn.Dropout(dropout), num_members)
        self.dropout2 = Dropout(nn.Dropout(dropout), num_members)
        self.activation = _ACTIVATIONS[activation] if isinstance(activation, str) else activation

    @classmethod
    def from_module(cls, template: nn.TransformerEncoderLayer, num_members: int) -> "TransformerEncoderLayer":
        attn = template.self_attn
        fused = cls(attn.embed_dim, attn.num_heads, template.linear1.out_features, template.dropout.p,
                    template.activation, template.norm1.eps, attn.batch_first, template.norm_first,
                    template.linear1.bias is not None, num_members=num_members, **factory_of(template.linear1))
        fused.self_attn = MultiheadAttention.from_module(attn, num_members)  # keeps a µP attention scale
        return fused

    def member_module(self) -> nn.TransformerEncoderLayer:
        attn = self.self_attn
        return nn.TransformerEncoderLayer(attn.embed_dim, attn.num_heads, self.linear1.out_features, attn.dropout,
                                          self.activation, self.norm1.eps, attn.batch_first, self.norm_first,
                                          self.linear1.bias is not None, **factory_of(self.linear1))

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False,
                           is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(FusedModule):
    """``F`` members of ``nn.TransformerEncoder``: a stack of fused encoder layers and an optional norm."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: LayerNorm | None = None) -> None:
        super().__init__(encoder_layer.num_members)
        self.layers = nn.ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    @classmethod
    def from_module(cls, template: nn.TransformerEncoder, num_members: int) -> "TransformerEncoder":
        fused = cls(TransformerEncoderLayer.from_module(template.layers[0], num_members), 0,
                    None if template.norm is None else LayerNorm.from_module(template.norm, num_members))
        fused.layers = nn.ModuleList([TransformerEncoderLayer.from_module(layer, num_members)
                                      for layer in template.layers])
        fused.num_layers = len(fused.layers)
        return fused

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)
