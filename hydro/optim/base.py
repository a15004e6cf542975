"""Base of the fused optimizers: parameters ``[F, ...]``, hyperparameters per member.

Every hyperparameter listed in ``per_member`` is a scalar (all members) or ``F`` values, stored in the
parameter group as a float64 tensor ``[F]`` (so LR schedulers and slicing act on it per member). Groups
may carry ``lr_mult``/``wd_mult`` (default 1): per-parameter multipliers applied on top, e.g. µP's: a
group holding parameters of a ``hydro.shrink`` model is split by their µP multipliers (``mup_rule``).

A step is a few multi-tensor (``torch._foreach_*``) operations over all of a group's parameters; per-member
values enter as ``[F, 1, ..., 1]`` tensors on the parameters' device (computed there, so a step reads no
tensor on the host), values every member shares as Python floats (torch's own scalar kernels). On the CPU an
optimizer may instead step each member with torch's fused kernel on its slices (:meth:`FusedOptimizer.host_kernel`,
:meth:`FusedOptimizer.member_views`): one pass over each tensor, faster there than the multi-tensor operations.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from dataclasses import dataclass

from torch.utils.weak import WeakIdKeyDictionary

from hydro.checks import check
from hydro.nn.base import member_view
from hydro.optim.dynamo_guard import unguarded
from hydro.shrink.mup import group_by_multipliers


def per_member(value, count: int, name: str, owner: str) -> Tensor:
    """``value`` (a scalar or ``count`` values) as a float64 CPU tensor ``[count]``; errors name ``owner``."""
    try:
        tensor = torch.as_tensor(value.detach().cpu() if isinstance(value, Tensor) else value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{owner}: hyperparameter '{name}' must be a number or one number per member, "
                        f"got {value!r}") from error
    tensor = tensor.flatten()
    if tensor.numel() == 1:
        return tensor.expand(count).clone()
    if tensor.numel() != count:
        raise ValueError(f"{owner}: hyperparameter '{name}' needs a scalar or {count} values (one per member), "
                         f"got {tensor.numel()}")
    return tensor.clone()


def on_device(values: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """CPU ``values`` on ``device`` as ``dtype`` without blocking the host (a pinned copy to a GPU)."""
    if device.type == "cuda":
        values = values.pin_memory().to(device, non_blocking=True)
    return values.to(device=device, dtype=dtype)


@dataclass(frozen=True)
class Derived:
    """A per-member value an update uses: ``fn(group)`` ``[F]`` (float64, CPU) of the hyperparameters ``deps``.
    ``scalar``: a Python float when every member shares it (torch's scalar kernels, e.g. ``alpha=``);
    ``dtype``: the dtype it is used in (default: the parameters')."""

    deps: tuple[str, ...]
    fn: Callable[[dict], Tensor]
    scalar: bool = True
    dtype: torch.dtype | None = None


def _host_kernel_fits(*tensors: list[Tensor]) -> bool:
    """Whether torch's fused CPU kernels can step these lists of tensors: all contiguous floats on the CPU, of one
    dtype."""
    flat = [t for ts in tensors for t in ts]
    dtype = flat[0].dtype
    return dtype in (torch.float32, torch.float64) and all(t.is_cpu and t.is_contiguous() and t.dtype is dtype
                                                           for t in flat)


def member_count(params: list[Tensor]) -> int:
    """``F``: the leading size shared by every parameter; 1 (one unfused model) when they do not share one."""
    leading = {p.shape[0] if p.dim() else None for p in params}
    return leading.pop() if len(leading) == 1 and None not in leading else 1


class FusedOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` for fused parameters whose leading dimension is the member (trial).

    Parameters of a plain (unfused) model — their leading sizes differ — are one member (``F = 1``):
    the optimizer then steps exactly like its ``torch.optim`` namesake. (Parameters that happen to share a
    leading size are read as fused; with one value per hyperparameter the update is the same either way,
    as every update is element-wise.)
    """

    per_member: tuple[str, ...] = ("lr",)
    derived: dict[str, Derived] = {}  # what _update uses, by name (see values/per_param)
    mup_rule = "sgd"  # which µP multipliers apply: "sgd" (MuSGD) or "adam" (MuAdam, entrywise-normalised)
    state_keys: tuple[str, ...] = ()  # the per-parameter state entries (see :meth:`absent_state`)

    def __init__(self, params: Iterable, defaults: dict) -> None:
        self.num_members: int | None = None
        self._cache: dict[int, dict] = {}  # per group: derived values, flags and scratch buffers
        self._uniform = WeakIdKeyDictionary()  # hyperparameter tensor -> (one value for all members, marked)
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__}: got no parameters (an empty list, or a generator already used "
                             f"up); pass fused.parameters() of the model to train")
        super().__init__(params, {"lr_mult": 1.0, "wd_mult": 1.0, **defaults})

    def __getstate__(self) -> dict:
        # torch's Optimizer pickles only defaults, state and param_groups; copies must keep the member count
        return {**super().__getstate__(), "num_members": self.num_members}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._cache, self._uniform = {}, WeakIdKeyDictionary()

    def add_param_group(self, param_group: dict) -> None:
        """Add ``param_group``, split by the µP multipliers of its parameters (see ``hydro.shrink``)."""
        params = param_group["params"]
        parts = group_by_multipliers([params] if isinstance(params, Tensor) else list(params), self.mup_rule)
        for (lr_mult, wd_mult), part in parts.items():
            self._add_group({**param_group, "params": part,
                             "lr_mult": param_group.get("lr_mult", self.defaults["lr_mult"]) * lr_mult,
                             "wd_mult": param_group.get("wd_mult", self.defaults["wd_mult"]) * wd_mult})

    def _add_group(self, param_group: dict) -> None:
        unguarded("add_param_group")(self, param_group)
        group = self.param_groups[-1]
        count = member_count([p for g in self.param_groups for p in g["params"]])
        if self.num_members is not None and count != self.num_members:  # plain parameters joined fused-looking ones
            for earlier in self.param_groups[:-1]:
                self._as_plain(earlier)
        self.num_members = count
        self._normalize(group)
        self._validate(group)

    @classmethod
    def absent_state(cls, key: str, group: Mapping, like: Tensor) -> Tensor:
        """The state entry ``key`` (one of :attr:`state_keys`) of a parameter for members that have none yet,
        beside members that have one (e.g. when the states of two optimizers are joined): the value with which
        they step exactly as they would without it.

        Args:
            group: the members' saved parameter group (per-member hyperparameters ``[F]``).
            like: ``[F, ...]``: the entry's shape, dtype and device for those members.
        Raises:
            ValueError: no value makes them step as without it (the reason, without a prefix).
        """
        raise ValueError(f"{cls.__name__} keeps no per-parameter state {key!r}")

    # torch.optim's methods, without importing torch._dynamo before anything compiles (see hydro.optim.dynamo_guard)
    def zero_grad(self, set_to_none: bool = True) -> None:
        unguarded("zero_grad")(self, set_to_none)

    def state_dict(self) -> dict:
        return unguarded("state_dict")(self)

    def load_state_dict(self, state_dict: dict) -> None:
        unguarded("load_state_dict")(self, state_dict)

    def _as_plain(self, group: dict) -> None:
        """An earlier group, normalised for ``F`` members, as the one member of unfused parameters."""
        for name in self.per_member:
            values = group[name]
            if not bool((values == values[0]).all()):
                raise ValueError(f"{type(self).__name__}: hyperparameter '{name}' has one value per member "
                                 f"({values.tolist()}) but the parameters are not fused (their leading sizes "
                                 f"differ). Fix: pass the parameters of a hydro.fuse model, or one value for a "
                                 f"plain model")
            group[name] = values[:1].clone()

    def _normalize(self, group: dict) -> None:
        for name in self.per_member:
            try:
                group[name] = per_member(group[name], self.num_members, name, type(self).__name__)
            except ValueError as error:
                if self.num_members != 1:
                    raise
                raise ValueError(f"{error} (the parameters are not fused: their leading sizes differ, so they are "
                                 f"one member)") from error

    def _validate(self, group: dict) -> None:
        """Refuse what the ``torch.optim`` namesake refuses, for every member."""
        check(f"{type(self).__name__}: ", ("lr", group["lr"], lambda v: ~(v < 0), ">= 0 for every member"))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list[Tensor]) -> None:
        """Apply one step to ``params`` (those of ``group`` that have gradients)."""
        raise NotImplementedError

    def values(self, group: dict, name: str, like: Tensor) -> float | Tensor:
        """The derived per-member value ``name`` (see :attr:`derived`) of ``group`` for parameters like ``like``:
        a Python float when it may be a scalar and every member shares it, else ``[F]`` on ``like``'s device.
        Cached until the group's hyperparameter tensors it depends on (or the multipliers) are replaced, e.g.
        by an LR scheduler; a recomputation reads no tensor when those hyperparameters are marked
        (:meth:`mark_uniform`)."""
        spec = self.derived[name]
        key, hit = self._cached(group, name, name, like.dtype, like.device)
        if hit is not None:
            return hit[1]
        computed = spec.fn(group)
        if spec.scalar and self._shared(computed, [group[d] for d in spec.deps]):
            value: float | Tensor = float(computed[0])
        else:
            value = on_device(computed, like.device, spec.dtype or like.dtype)
        self._cache[id(group)][name] = (key, value, {})
        return value

    def host_values(self, group: dict, name: str) -> list[float]:
        """The derived per-member value ``name`` of ``group`` as ``F`` Python floats (for torch's fused CPU kernels,
        member by member), cached like :meth:`values`: read again only when its hyperparameters are replaced."""
        key, hit = self._cached(group, name, ("host", name))
        if hit is None:
            hit = self._cache[id(group)][("host", name)] = (key, self.derived[name].fn(group).tolist())
        return hit[1]

    def _cached(self, group: dict, name: str, slot, *extra) -> tuple[tuple, tuple | None]:
        """The cache key of the derived value ``name`` of ``group`` (its hyperparameter tensors by identity, the
        multipliers and ``extra``) and the entry cached in ``slot`` when it was computed for that key, else None."""
        spec = self.derived[name]
        key = (*(group[d] for d in spec.deps), group["lr_mult"], group["wd_mult"], *extra)
        hit = self._cache.setdefault(id(group), {}).get(slot)
        if hit is not None and len(hit[0]) == len(key) and all(a is b or (not isinstance(a, Tensor) and a == b)
                                                                 for a, b in zip(hit[0], key)):
            return key, hit
        return key, None

    def per_param(self, group: dict, name: str, params: list[Tensor]) -> float | list[Tensor]:
        """:meth:`values` shaped to broadcast against each of ``params`` ``[F, ...]`` (one view per number of
        dimensions, cached with the value), or the shared float."""
        value = self.values(group, name, params[0])
        if isinstance(value, float):
            return value
        views = self._cache[id(group)][name][2]
        for p in params:
            if p.dim() not in views:
                views[p.dim()] = member_view(value, p.dim() - 1)
        return [views[p.dim()] for p in params]

    def mark_uniform(self, values: Tensor, uniform: bool) -> None:
        """Record whether the hyperparameter tensor ``values`` holds one value for every member (schedulers
        call this for each learning rate they set, so that using it reads no tensor)."""
        self._uniform[values] = (uniform, True)

    def _shared(self, computed: Tensor, deps: list[Tensor]) -> bool:
        """Whether every member has the same ``computed`` value (an element-wise function of ``deps``): shared
        when every dependency is (each read once, unless marked); not when a marked one is not (a schedule that
        differs per member); else read from ``computed``."""
        for d in deps:
            if d not in self._uniform:
                self._uniform[d] = (bool((d == d[0]).all()), False)
        marks = [self._uniform[d] for d in deps]
        if all(uniform for uniform, _ in marks):
            return True
        if any(marked and not uniform for uniform, marked in marks):
            return False
        return bool((computed == computed[0]).all())

    def flag(self, group: dict, name: str, fn) -> object:
        """``fn(group[name])`` (a Python value read from the hyperparameter), cached while ``group[name]`` is the
        same tensor."""
        cache = self._cache.setdefault(id(group), {})
        hit = cache.get(("flag", name))
        if hit is None or hit[0] is not group[name]:
            hit = cache[("flag", name)] = (group[name], fn(group[name]))
        return hit[1]

    def scratch(self, group: dict, params: list[Tensor], count: int) -> list[Tensor]:
        """``count`` float buffers ``[F, 1, ..., 1]`` per parameter of ``params`` (in that order, blocks of
        ``len(params)``), reused across steps: the targets of per-member values cast to the parameters' dtype."""
        cache = self._cache.setdefault(id(group), {})
        shapes = [(p.shape[0], *([1] * (p.dim() - 1))) for p in params] * count
        likes = [p for p in params] * count
        held = cache.get("scratch")
        if held is None or len(held) != len(shapes) or any(
                b.shape != s or b.dtype != p.dtype or b.device != p.device for b, s, p in zip(held, shapes, likes)):
            held = cache["scratch"] = [torch.empty(s, dtype=p.dtype, device=p.device) for s, p in zip(shapes, likes)]
        return held

    def member_views(self, tensors: list[Tensor], group: dict | None = None, slot: str | None = None
                     ) -> list[list[Tensor]]:
        """Per member ``m``, the slices ``t[m]`` of ``tensors`` ``[F, ...]`` (for one member, ``tensors`` itself: a
        plain model's parameters have no member dimension). With ``group`` and ``slot``, for tensors that keep
        their memory from step to step (parameters, optimizer state): made once and cached in ``slot`` of
        ``group`` while ``tensors`` are the same tensors over the same memory."""
        if self.num_members == 1:
            return [tensors]
        if slot is None:
            return [[t[m] for t in tensors] for m in range(self.num_members)]
        key = [(t, t.data_ptr()) for t in tensors]
        cache = self._cache.setdefault(id(group), {}).setdefault("views", {})
        hit = cache.get(slot)
        if hit is None or len(hit[0]) != len(key) or len(hit[1]) != self.num_members or any(
                a is not t or pa != pt for (a, pa), (t, pt) in zip(hit[0], key)):
            hit = cache[slot] = (key, [[t[m] for t in tensors] for m in range(self.num_members)])
        return hit[1]

    def host_kernel(self, group: dict, *tensors: list[Tensor]) -> bool:
        """Whether to step ``group`` with torch's fused CPU kernel member by member: its ``cpu_kernel`` (default
        True) is set and ``tensors`` (lists: parameters, gradients, state) are all contiguous floats on the CPU,
        of one dtype (on a GPU the multi-tensor ops launch a few kernels for all members, which a per-member loop
        would not). When not, the group's cached :meth:`member_views` are dropped, keeping no memory alive (e.g.
        the CPU memory of parameters moved to a GPU)."""
        if group.get("cpu_kernel", True) and _host_kernel_fits(*tensors):
            return True
        self._cache.get(id(group), {}).pop("views", None)
        return False

    @staticmethod
    def add_scaled(x: list[Tensor], y: list[Tensor], scale: float | list[Tensor], *,
                   inplace: bool = False) -> list[Tensor]:
        """``x + scale * y`` for lists of tensors with a :meth:`per_param` ``scale`` (a float: torch's ``alpha``);
        ``inplace``: into ``x`` (returned)."""
        if not inplace:
            return torch._foreach_add(x, y, alpha=scale) if isinstance(scale, float) else \
                torch._foreach_addcmul(x, y, scale)
        if isinstance(scale, float):
            torch._foreach_add_(x, y, alpha=scale)
        else:
            torch._foreach_addcmul_(x, y, scale)
        return x

    @torch.no_grad()
    def keep_members(self, index: Tensor) -> None:
        """Keep only the members at ``index`` (hyperparameters and state); see ``hydro.keep_members``."""
        old, self.num_members = self.num_members, len(index)
        for group in self.param_groups:
            for name in self.per_member:
                group[name] = group[name].index_select(0, index.cpu())
        for state in self.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and value.dim() and value.shape[0] == old:
                    state[key] = value.index_select(0, index.to(value.device))
