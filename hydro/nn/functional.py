"""Per-member semantics for the functions and tensor methods a traced forward calls on fused tensors.

A fused tensor is ``[F, *member_shape]``. Element-wise ops broadcast members against members (shapes
are aligned behind ``F``); shape queries answer with the member's shape; basic indexing skips ``F``;
everything else runs under ``torch.vmap`` over the trial dimension, so user code written for one model
(``x.view(x.size(0), -1)``, ``x.mean(dim=1)``, ``torch.cat([a, b], 1)``) is correct unchanged.
"""
from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import member_view, shift_dim

_ELEMENTWISE_NAMES = (
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "pow", "remainder", "maximum", "minimum",
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "clamp", "square",
    "reciprocal", "sign", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "where",
)
ELEMENTWISE_FUNCTIONS: frozenset[Callable] = frozenset(
    [getattr(torch, name) for name in _ELEMENTWISE_NAMES]
    + [getattr(operator, name) for name in ("add", "sub", "mul", "truediv", "floordiv", "pow", "mod", "neg",
                                            "pos", "abs", "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_",
                                            "xor", "invert", "iadd", "isub", "imul", "itruediv")]
    + [getattr(F, name) for name in ("relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu", "leaky_relu",
                                     "hardtanh", "hardswish", "hardsigmoid", "softplus", "logsigmoid", "sigmoid",
                                     "tanh", "dropout", "alpha_dropout")]
)
ELEMENTWISE_METHODS: frozenset[str] = frozenset(
    list(_ELEMENTWISE_NAMES) + [n + "_" for n in _ELEMENTWISE_NAMES if n not in ("where", "maximum", "minimum")]
    + ["float", "double", "half", "bfloat16", "contiguous", "detach", "clone"]
)


def member_size(x: Tensor, dim: int | None = None):
    """``x.size()`` of one member."""
    return x.shape[1:] if dim is None else x.size(shift_dim(dim))


def member_dim(x: Tensor) -> int:
    return x.dim() - 1


def member_numel(x: Tensor) -> int:
    return x.numel() // x.shape[0]


def member_getattr(x: Tensor, name: str):
    """A non-tensor attribute of one member (``shape``/``ndim`` answer for the member)."""
    if name == "shape":
        return x.shape[1:]
    if name == "ndim":
        return x.ndim - 1
    return getattr(x, name)


META_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "requires_grad", "is_cuda", "layout"})
META_METHODS: dict[str, Callable] = {"size": member_size, "dim": member_dim, "ndimension": member_dim,
                                     "numel": member_numel, "nelement": member_numel}
META_FUNCTIONS: dict[Callable, Callable] = {torch.numel: member_numel}


def trialwise(fn: Callable, arg_dims: tuple, kwarg_dims: dict) -> Callable:
    """``fn`` applied member by member. ``arg_dims``/``kwarg_dims`` mirror the arguments: 0 where an argument
    (or pytree leaf) is fused ``[F, ...]``, ``None`` where it is shared by all members or not a tensor."""

    def apply_elementwise(*args, **kwargs):
        fused = [v for v, d in zip((*args, *kwargs.values()), (*arg_dims, *kwarg_dims.values()))
                 if d == 0 and isinstance(v, Tensor)]
        shared = [v for v, d in zip((*args, *kwargs.values()), (*arg_dims, *kwarg_dims.values()))
                  if d is None and isinstance(v, Tensor)]
        ndim = max([t.dim() - 1 for t in fused] + [t.dim() for t in shared])
        align = lambda v, d: member_view(v, ndim) if d == 0 and isinstance(v, Tensor) else v  # noqa: E731
        return fn(*(align(v, d) for v, d in zip(args, arg_dims)),
                  **{k: align(v, kwarg_dims[k]) for k, v in kwargs.items()})

    def apply_vmapped(*args, **kwargs):
        return torch.vmap(lambda a, k: fn(*a, **k), in_dims=(arg_dims, kwarg_dims), randomness="different")(
            args, kwargs)

    def apply_getitem(value, index):
        if not isinstance(value, Tensor):  # a tuple of fused outputs
            return value[index]
        parts = index if isinstance(index, tuple) else (index,)
        if all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts):
            return value[(slice(None), *parts)]
        return apply_vmapped(value, index)

    if fn is operator.getitem:
        run = apply_getitem
    elif fn in ELEMENTWISE_FUNCTIONS or getattr(fn, "method_name", None) in ELEMENTWISE_METHODS:
        run = apply_elementwise
    else:
        run = apply_vmapped
    run.__name__ = f"trialwise_{getattr(fn, '__name__', 'op')}"
    return run


def method_caller(name: str) -> Callable:
    """``lambda self, *a, **k: self.name(*a, **k)`` as a function named ``name``."""

    def call(self, *args, **kwargs):
        return getattr(self, name)(*args, **kwargs)

    call.__name__ = call.method_name = name
    return call
