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
import torch.utils._pytree as pytree
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
        return vmap_members(lambda a, k: fn(*a, **k), (arg_dims, kwarg_dims), (args, kwargs))

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


def tensor_dims(tree):
    """vmap ``in_dims`` for a pytree of arguments: 0 for every tensor, ``None`` for anything else."""
    return pytree.tree_map(lambda leaf: 0 if isinstance(leaf, Tensor) else None, tree)


def vmap_members(fn: Callable, in_dims: tuple, inputs: tuple):
    """``torch.vmap(fn, in_dims)(*inputs)`` over the member dimension, with independent randomness per member;
    non-tensor outputs (``None`` attention weights, sizes) are passed through as computed."""
    passthrough: dict = {}

    def tensors_only(*args):
        leaves, spec = pytree.tree_flatten(fn(*args))
        passthrough["spec"], passthrough["leaves"] = spec, leaves
        return tuple(leaf for leaf in leaves if isinstance(leaf, Tensor))

    tensors = iter(torch.vmap(tensors_only, in_dims=in_dims, randomness="different")(*inputs))
    leaves = [next(tensors) if isinstance(leaf, Tensor) else leaf for leaf in passthrough["leaves"]]
    return pytree.tree_unflatten(leaves, passthrough["spec"])


def loop_members(fn: Callable, in_dims: tuple, inputs: tuple, count: int):
    """``fn`` called once per member on its slices of the fused inputs; tensor outputs stacked ``[F, ...]``."""
    flat, spec = pytree.tree_flatten(inputs)
    dims = pytree.tree_flatten(_broadcast_dims(in_dims, inputs))[0]
    outputs = []
    for i in range(count):
        member = [leaf[i] if d == 0 and isinstance(leaf, Tensor) else leaf for leaf, d in zip(flat, dims)]
        outputs.append(pytree.tree_flatten(fn(*pytree.tree_unflatten(member, spec))))
    leaves, out_spec = outputs[0]
    stacked = [torch.stack([out[0][j] for out in outputs]) if isinstance(leaf, Tensor) else leaf
               for j, leaf in enumerate(leaves)]
    return pytree.tree_unflatten(stacked, out_spec)


def _broadcast_dims(dims, tree):
    """``dims`` expanded to one entry per leaf of ``tree`` (an int or ``None`` covers a whole subtree)."""
    if dims is None or isinstance(dims, int):
        return pytree.tree_map(lambda _: dims, tree)
    if isinstance(tree, dict):
        return {k: _broadcast_dims(dims[k], v) for k, v in tree.items()}
    return type(tree)(_broadcast_dims(d, t) for d, t in zip(dims, tree))
