"""Fused ``MultiheadAttention``: packed projections as batched matmuls, attention over ``[F, N, H, L, d]``."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, Unfusable, factory_of, stacked_parameter
from .linear import Linear, fused_linear


class MultiheadAttention(FusedModule):
    """``F`` members of ``nn.MultiheadAttention`` (same call signature, trial dimension first).

    Query/key/value ``[F, N, L, E]`` (``batch_first``), ``[F, L, N, E]`` (not), or unbatched ``[F, L, E]``.
    Masks are shared by all members: ``attn_mask`` ``[L, S]`` or ``[N*H, L, S]``, ``key_padding_mask``
    ``[N, S]`` (bool: True = masked out, as in torch). ``scale`` multiplies the attention logits
    (default ``1/sqrt(head_dim)``; µP: ``sqrt(base head_dim)/head_dim``). Returns ``(out, weights)``, weights
    ``[F, N, L, S]`` (averaged over heads) or ``[F, N, H, L, S]``, or ``None``.
    Parameters: ``in_proj_weight [F, 3E, E]``, ``in_proj_bias [F, 3E]``, ``out_proj.weight [F, E, E]``.
    """

    data_args = 3

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, *, scale: float | None = None, num_members: int, device=None,
                 dtype=None) -> None:
        super().__init__(num_members)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.scale = scale
        self.in_proj_weight = stacked_parameter((3 * embed_dim, embed_dim), num_members, factory)
        self.register_parameter("in_proj_bias",
                                stacked_parameter((3 * embed_dim,), num_members, factory) if bias else None)
        self.out_proj = Linear(embed_dim, embed_dim, bias, num_members=num_members, **factory)
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.MultiheadAttention, num_members: int) -> "MultiheadAttention":
        if not template._qkv_same_embed_dim or template.bias_k is not None or template.add_zero_attn:
            raise Unfusable("MultiheadAttention with kdim/vdim != embed_dim, add_bias_kv or add_zero_attn")
        return cls(template.embed_dim, template.num_heads, template.dropout, template.in_proj_bias is not None,
                   template.batch_first, scale=getattr(template, "scale", None), num_members=num_members,
                   **factory_of(template))

    def member_module(self) -> nn.MultiheadAttention:
        return nn.MultiheadAttention(self.embed_dim, self.num_heads, self.dropout, self.in_proj_bias is not None,
                                     batch_first=self.batch_first, **factory_of(self))

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        members, embed, heads, head_dim = self.num_members, self.embed_dim, self.num_heads, self.head_dim
        self_attention = query is key and key is value
        unbatched = query.dim() == 3
        if unbatched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        batch, tgt_len, src_len = query.shape[1], query.shape[2], key.shape[2]

        if self_attention:
            q, k, v = fused_linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        else:
            weights = self.in_proj_weight.chunk(3, dim=1)
            biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3, dim=1)
            q, k, v = (fused_linear(t, w, b) for t, w, b in zip((query, key, value), weights, biases))
        # [F, N, L, E] -> [F, N, H, L, d]
        q, k, v = (t.unflatten(-1, (heads, head_dim)).transpose(2, 3) for t in (q, k, v))
        mask = _additive_mask(attn_mask, key_padding_mask, batch, heads, q.dtype)
        if is_causal and mask is None and not need_weights:
            mask_causal = True
        else:
            mask_causal = False
            if is_causal and mask is None:
                mask = _additive_mask(torch.ones(tgt_len, src_len, dtype=torch.bool, device=q.device).triu(1),
                                      None, batch, heads, q.dtype)
        dropout = self.dropout if self.training else 0.0
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(head_dim)
        attn_weights = None
        if need_weights:
            logits = torch.matmul(q * scale, k.transpose(-2, -1))
            if mask is not None:
                logits = logits + mask
            attn_weights = torch.softmax(logits, dim=-1)
            if dropout > 0.0:
                attn_weights = F.dropout(attn_weights, p=dropout)
            out = torch.matmul(attn_weights, v)
            if average_attn_weights:
                attn_weights = attn_weights.mean(dim=2)
            if unbatched:
                attn_weights = attn_weights.squeeze(1)
        else:
            # The members' batches as one batch [F*N, H, L, d]: SDPA's fused kernels (flash, memory-efficient, and
            # CPU flash) take 4-D inputs only, and 5-D ones take the math path, slower and not what a member alone
            # computes (the 4-D result equals the members' alone bitwise).
            out = _attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), _per_member_batch(mask, members),
                             dropout_p=dropout, is_causal=mask_causal, scale=scale).unflatten(0, (members, batch))
        out = self.out_proj(out.transpose(2, 3).reshape(members, batch, tgt_len, embed))
        if unbatched:
            out = out.squeeze(1)
        elif not self.batch_first:
            out = out.transpose(1, 2)
        return out, attn_weights

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, scale={self.scale}, " + super().extra_repr()


def _additive_mask(attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int, heads: int,
                   dtype: torch.dtype) -> Tensor | None:
    """torch's mask conventions as one float mask broadcastable to ``[F, N, H, L, S]`` (or ``None``)."""
    parts = []
    if attn_mask is not None:
        m = _as_additive(attn_mask, dtype)
        parts.append(m.view(batch, heads, *m.shape[-2:]) if m.dim() == 3 else m)
    if key_padding_mask is not None:
        parts.append(_as_additive(key_padding_mask, dtype).view(batch, 1, 1, key_padding_mask.shape[-1]))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


SDPA_MAX_BATCH = 65_535
"""Rows of the batch per scaled-dot-product-attention call. cuDNN's attention, which torch picks for bf16 on
Hopper, fails from a batch of 65,536 ('mha_graph.execute ... is_good()', pytorch/pytorch#181085): 256 members
of batch 256 did on an H200 (torch 2.11)."""


def _attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, **options) -> Tensor:
    """``F.scaled_dot_product_attention`` over ``[B, H, L, d]`` in calls of at most :data:`SDPA_MAX_BATCH` rows
    of ``B`` (each row attends on its own, so the rows' results do not depend on the split)."""
    if q.shape[0] <= SDPA_MAX_BATCH:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **options)
    batched_mask = mask is not None and mask.dim() == 4
    return torch.cat([F.scaled_dot_product_attention(q[rows], k[rows], v[rows],
                                                     attn_mask=mask[rows] if batched_mask else mask, **options)
                      for rows in (slice(start, start + SDPA_MAX_BATCH)
                                   for start in range(0, q.shape[0], SDPA_MAX_BATCH))])


def _per_member_batch(mask: Tensor | None, members: int) -> Tensor | None:
    """A mask of :func:`_additive_mask` for the 4-D ``[F*N, H, L, S]`` attention: one with a batch dimension
    (4-D, ``[N, H or 1, L or 1, S]``) repeated for each member; ``[L, S]`` broadcasts as it is."""
    if mask is None or mask.dim() < 4:
        return mask
    return mask.expand(members, *mask.shape).flatten(0, 1)


def _as_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool mask (True = masked out) as ``-inf``/0; a float mask as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)
