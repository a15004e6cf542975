"""Generic fallback: any module fused with ``torch.func.functional_call`` under ``torch.vmap``.

Slower than a dedicated twin (vmap batching rules, possibly per-member loops), but exact for every module
whose forward vmap can trace; the binder uses it for layers that have no twin.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.func import functional_call

from .base import FusedModule


def mirror(template: nn.Module, make_tensor, container: nn.Module | None = None, make_module=None) -> nn.Module:
    """A module tree with ``template``'s submodule names whose parameters and buffers are
    ``make_tensor(qualified_name, tensor)`` (``None`` stays ``None``), so state_dict keys match ``template``'s.
    ``make_module(qualified_name, submodule)`` may return a module to use as is instead of descending."""
    root = container if container is not None else nn.Module()

    def fill(dst: nn.Module, src: nn.Module, prefix: str) -> None:
        for name, param in src._parameters.items():
            if param is None:
                dst.register_parameter(name, None)
                continue
            new = nn.Parameter(make_tensor(prefix + name, param), param.requires_grad)
            new.__dict__.update(param.__dict__)  # e.g. µP shape information
            dst.register_parameter(name, new)
        for name, buf in src._buffers.items():
            dst.register_buffer(name, None if buf is None else make_tensor(prefix + name, buf),
                                persistent=name not in src._non_persistent_buffers_set)
        for name, child in src._modules.items():
            if child is None:
                continue
            replacement = make_module(prefix + name, child) if make_module is not None else None
            if replacement is not None:
                dst.add_module(name, replacement)
            else:
                dst.add_module(name, nn.Module())
                fill(dst._modules[name], child, f"{prefix}{name}.")

    fill(root, template, "")
    return root


class VmapModule(FusedModule):
    """``F`` members of any module: ``forward`` is the member's forward vmapped over stacked state.

    Every tensor argument is fused ``[F, ...]`` (the binder expands shared inputs); every tensor output is
    ``[F, ...]``. Random operations draw independently per member.
    """

    data_args = None

    def __init__(self, template: nn.Module, num_members: int) -> None:
        super().__init__(num_members)
        mirror(template, lambda _, t: t.detach().unsqueeze(0).repeat(num_members, *([1] * t.dim())), self)
        # The member module runs only through functional_call, which supplies every tensor of its state.
        self._member = (copy.deepcopy(template).to("meta"),)

    @classmethod
    def from_module(cls, template: nn.Module, num_members: int) -> "VmapModule":
        return cls(template, num_members)

    def forward(self, *args, **kwargs):
        member = self._member[0]
        member.train(self.training)
        state = {**dict(self.named_parameters()), **dict(self.named_buffers())}

        def call(state_, args_, kwargs_):
            return functional_call(member, state_, args_, kwargs_)

        in_dims = (0, tensor_dims(args), tensor_dims(kwargs))
        return torch.vmap(call, in_dims=in_dims, randomness="different")(state, args, kwargs)

    def extra_repr(self) -> str:
        return f"{type(self._member[0]).__name__}, " + super().extra_repr()


def tensor_dims(tree):
    """vmap ``in_dims`` for a pytree of arguments: 0 for every tensor, ``None`` for anything else."""
    return torch.utils._pytree.tree_map(lambda leaf: 0 if isinstance(leaf, torch.Tensor) else None, tree)
