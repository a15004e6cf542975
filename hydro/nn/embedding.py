"""Fused ``Embedding``: one lookup into the members' tables laid end to end."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import FusedModule, Unfusable, factory_of, stacked_parameter


class Embedding(FusedModule):
    """``F`` members of ``nn.Embedding``: indices ``[F, *]`` (or shared ``[*]``) -> ``[F, *, D]``.

    Parameter ``weight [F, num_embeddings, D]``. ``padding_idx`` rows get no gradient, as in torch.
    """

    supports_shared_input = True

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, *,
                 num_members: int, device=None, dtype=None) -> None:
        super().__init__(num_members)
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.weight = stacked_parameter((num_embeddings, embedding_dim), num_members,
                                        {"device": device, "dtype": dtype})
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.Embedding, num_members: int) -> "Embedding":
        unsupported = {"max_norm": template.max_norm is not None, "scale_grad_by_freq": template.scale_grad_by_freq,
                       "sparse": template.sparse}
        if any(unsupported.values()):
            raise Unfusable(f"Embedding with {[k for k, v in unsupported.items() if v]}")
        return cls(template.num_embeddings, template.embedding_dim, template.padding_idx, num_members=num_members,
                   **factory_of(template))

    def member_module(self) -> nn.Embedding:
        return nn.Embedding(self.num_embeddings, self.embedding_dim, self.padding_idx, **factory_of(self))

    def forward(self, indices: Tensor) -> Tensor:
        members = self.num_members
        if self.shared_input:
            indices = indices.unsqueeze(0)
        offsets = torch.arange(members, device=indices.device).mul_(self.num_embeddings)
        flat_weight = self.weight.reshape(members * self.num_embeddings, self.embedding_dim)
        out = F.embedding(indices + offsets.view(members, *([1] * (indices.dim() - 1))), flat_weight)
        if self.padding_idx is not None:
            # torch gives the padding row no gradient; its value is still looked up.
            out = torch.where((indices == self.padding_idx).unsqueeze(-1), out.detach(), out)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, padding_idx={self.padding_idx}, " + super().extra_repr()
