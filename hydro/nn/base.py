"""Common base and layout helpers of the fused layers.

Layout everywhere: trial (member) dimension first. A fused activation is ``[F, N, ...]``; a fused
parameter or buffer is the member's tensor stacked along a new leading dimension ``F``, under the same
name as in the ``torch.nn`` module it replaces, so ``state_dict()[k][i]`` is member ``i``'s tensor.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor, nn


_UNINITIALISED = contextvars.ContextVar("hydro_nn_uninitialised", default=False)


@contextlib.contextmanager
def uninitialised() -> Iterator[None]:
    """Fused twins built inside are left uninitialised (``reset_parameters`` does nothing): for twins whose
    tensors are overwritten at once (e.g. by ``load_stacked``), which saves one ``torch.nn`` module per member."""
    token = _UNINITIALISED.set(True)
    try:
        yield
    finally:
        _UNINITIALISED.reset(token)


class Unfusable(ValueError):
    """A module (or one of its settings) has no fused twin; the binder falls back to :class:`VmapModule`."""


class FusedModule(nn.Module):
    """Base of the fused twins of ``torch.nn`` layers.

    Subclasses implement ``from_module(template, num_members)`` (same configuration, fresh tensors). A twin
    with ``supports_shared_input`` also accepts member-shaped inputs ``[N, ...]`` that all members share
    (the binder sets ``shared_input``), which saves F copies of the batch in the first layers.
    """

    supports_shared_input = False
    # How many leading forward arguments carry member data (``[F, N, ...]``): the binder expands shared
    # values passed there; later tensor arguments (masks) stay shared. ``None``: every argument.
    data_args: int | None = 1

    def __init__(self, num_members: int) -> None:
        super().__init__()
        if num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {num_members}")
        self.num_members = num_members
        self.shared_input = False

    @classmethod
    def from_module(cls, template: nn.Module, num_members: int) -> "FusedModule":
        """A twin with ``template``'s configuration; its tensors are freshly initialised."""
        raise NotImplementedError

    def member_module(self) -> nn.Module:
        """A fresh, independently initialised ``torch.nn`` module of one member's configuration."""
        raise NotImplementedError

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every member exactly as ``torch.nn`` initialises an independent module (nothing inside
        :func:`uninitialised`)."""
        if _UNINITIALISED.get():
            return
        own = self.state_dict(keep_vars=True)
        for i in range(self.num_members):
            for name, tensor in self.member_module().state_dict().items():
                own[name][i].copy_(tensor)

    def extra_repr(self) -> str:
        return f"num_members={self.num_members}" + (", shared_input=True" if self.shared_input else "")


def shift_dim(dim: int) -> int:
    """A member-tensor dimension index as an index into the fused tensor ``[F, ...]``."""
    return dim + 1 if dim >= 0 else dim


def merge_channels(x: Tensor) -> Tensor:
    """``[F, N, C, *S] -> [N, F*C, *S]``; free when ``x`` is stored as ``[N, F, C, *S]``."""
    return x.transpose(0, 1).reshape(x.shape[1], x.shape[0] * x.shape[2], *x.shape[3:])


def split_channels(y: Tensor, num_members: int) -> Tensor:
    """``[N, F*C, *S] -> [F, N, C, *S]`` as a strided view (memory stays ``[N, F, C, *S]``)."""
    return y.view(y.shape[0], num_members, y.shape[1] // num_members, *y.shape[2:]).transpose(0, 1)


def expand_members(value, num_members: int):
    """A shared member-shaped tensor ``[N, ...]`` as a fused ``[F, N, ...]`` view; other values unchanged."""
    if isinstance(value, Tensor):
        return value.unsqueeze(0).expand(num_members, *value.shape)
    return value


def member_view(t: Tensor, member_ndim: int) -> Tensor:
    """A per-member vector ``[F, *rest]`` viewed as ``[F, 1, ..., 1, *rest]`` with ``member_ndim`` member dims,
    so it broadcasts against ``[F, *member_shape]`` with member broadcasting rules."""
    return t.view(t.shape[0], *([1] * (member_ndim - (t.dim() - 1))), *t.shape[1:])


def factory_of(module: nn.Module) -> dict:
    """``device``/``dtype`` keyword arguments matching ``module``'s own floating-point tensors."""
    for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
        if tensor is not None and tensor.is_floating_point():
            return {"device": tensor.device, "dtype": tensor.dtype}
    return {"device": None, "dtype": None}


def stacked_parameter(shape: tuple[int, ...], num_members: int, factory_kwargs: dict) -> nn.Parameter:
    return nn.Parameter(torch.empty((num_members, *shape), **factory_kwargs))
