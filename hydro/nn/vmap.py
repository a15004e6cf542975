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
from .functional import loop_members, tensor_dims, vmap_members


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


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
            else:  # containers keep their type, so indexing (model.net[0]) works on the copy too
                container_type = type(child) if type(child) in _CONTAINERS else nn.Module
                dst.add_module(name, container_type())
                fill(dst._modules[name], child, f"{prefix}{name}.")

    fill(root, template, "")
    return root


class VmapModule(FusedModule):
    """``F`` members of any module: the member's forward under ``torch.vmap`` over stacked state, or — for a
    forward vmap cannot run (data-dependent control flow) — one call per member on its slice of the state.

    Every tensor argument is fused ``[F, ...]`` (the binder expands shared inputs); every tensor output is
    ``[F, ...]``. Random operations draw independently per member. ``mode`` says which path runs: ``"vmap"``
    (tried first; on failure the buffers are restored and the call repeats member by member) or
    ``"loop"`` (member by member from the start: exact for forwards that update their state in place).
    """

    data_args = None

    def __init__(self, template: nn.Module, num_members: int, mode: str = "vmap") -> None:
        super().__init__(num_members)
        if mode not in ("vmap", "loop"):
            raise ValueError(f"VmapModule: mode must be 'vmap' or 'loop', got {mode!r}")
        mirror(template, lambda _, t: t.detach().unsqueeze(0).repeat(num_members, *([1] * t.dim())), self)
        # The member module runs only through functional_call, which supplies every tensor of its state.
        self._member = (copy.deepcopy(template).to("meta"),)
        self.mode = mode

    @classmethod
    def from_module(cls, template: nn.Module, num_members: int) -> "VmapModule":
        return cls(template, num_members)

    def forward(self, *args, **kwargs):
        member = self._member[0]
        member.train(self.training)
        state = {**dict(self.named_parameters()), **dict(self.named_buffers())}

        def call(state_, args_, kwargs_):
            return functional_call(member, state_, args_, kwargs_)

        inputs = (state, args, kwargs)
        in_dims = (0, tensor_dims(args), tensor_dims(kwargs))
        if self.mode == "vmap":
            buffers = {name: buf.clone() for name, buf in self.named_buffers()}
            params = {name: p._version for name, p in self.named_parameters()}
            try:
                return vmap_members(call, in_dims, inputs)
            except RuntimeError as vmap_error:  # e.g. data-dependent control flow: run member by member
                self._undo(buffers, params, vmap_error)
                self.mode = "loop"
                self.vmap_error = str(vmap_error).splitlines()[0]
        return loop_members(call, in_dims, inputs, self.num_members)

    @torch.no_grad()
    def _undo(self, buffers: dict, versions: dict, error: RuntimeError) -> None:
        """Restore the buffers a failed vmap attempt may have updated; parameters updated in place cannot be."""
        for name, saved in buffers.items():
            self.get_buffer(name).copy_(saved)
        changed = [name for name, p in self.named_parameters() if p._version != versions[name]]
        if changed:
            raise RuntimeError(f"hydro.nn.VmapModule: {type(self._member[0]).__name__}.forward updated parameters "
                               f"{changed} in place before torch.vmap failed ({error}). Fix: fuse it with "
                               f"VmapModule(..., mode='loop')") from error

    def extra_repr(self) -> str:
        return f"{type(self._member[0]).__name__}, mode={self.mode}, " + super().extra_repr()
