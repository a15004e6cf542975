"""The members of one trial as one trainable unit: fused (one model, one ``hydro.optim`` optimizer) or looped
(independent plain-torch models and optimizers, the unfused baseline and fallback).

Both take the shared batch ``[N, ...]`` and return the members' outputs ``[F, N, ...]``; ``keep`` slices
members out with their weights and optimizer state.
"""
from __future__ import annotations

import copy
import zlib
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

import hydro
from hydro.binder import FuseError
from hydro.nn.base import member_view
from hydro.trial.backend import compiled
from hydro.trial.optimizer import UnsupportedOptimizer, fused_optimizer
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member, fused_surrogates


class Members:
    """Common interface: ``member_ids`` (in output order), ``__call__(x) -> [F, N, ...]``, optimizer step,
    ``keep(positions)``, ``state_dict``/``load_state_dict``."""

    fused: bool
    member_ids: list[str]

    def __call__(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def modules(self) -> list[torch.nn.Module]:
        raise NotImplementedError

    def optimizers(self) -> list[torch.optim.Optimizer]:
        raise NotImplementedError

    def keep(self, positions: Sequence[int]) -> None:
        raise NotImplementedError

    def copy(self) -> Members:
        """An independent copy: weights, buffers and optimizer state."""
        raise NotImplementedError

    def split(self, sizes: Sequence[int]) -> list[Members]:
        """These members as consecutive units of ``sizes`` members, each with its weights and optimizer state
        (copies: autograd may still hold this unit's parameters at their old shape, e.g. in the graph of a
        step that failed)."""
        if sum(sizes) != len(self.member_ids) or min(sizes) < 1:
            raise ValueError(f"Members.split: sizes {list(sizes)} must be >= 1 and add up to the "
                             f"{len(self.member_ids)} members")
        parts = [self.copy() for _ in sizes]
        start = 0
        for part, size in zip(parts, sizes):
            part.keep(range(start, start + size))
            start += size
        return parts

    def train(self, mode: bool = True) -> None:
        for module in self.modules():
            module.train(mode)

    def zero_grad(self) -> None:
        for optimizer in self.optimizers():
            optimizer.zero_grad()

    def step(self, skip: Tensor | None = None) -> None:
        """One optimizer step of every member, except those flagged in ``skip`` (``[F]`` bool), which keep
        their weights and optimizer state."""
        raise NotImplementedError

    def unscale_(self, scale: Tensor) -> Tensor:
        """Divide each member's gradients by its loss scale ``scale[i]``; which members' gradients are not
        finite (``[F]`` bool)."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"modules": [m.state_dict() for m in self.modules()],
                "optimizers": [o.state_dict() for o in self.optimizers()]}

    def load_state_dict(self, state: dict) -> None:
        for module, saved in zip(self.modules(), state["modules"], strict=True):
            module.load_state_dict(saved)
        for optimizer, saved in zip(self.optimizers(), state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)


class FusedMembers(Members):
    """All members in one ``hydro.fuse`` model trained by one fused optimizer."""

    fused = True

    def __init__(self, spec: TuneSpec, configs: Sequence[Mapping], member_ids: Sequence[str], scale: int,
                 mup: bool = False, device: torch.device | str = "cpu") -> None:
        self.member_ids = list(member_ids)
        model = None
        if scale > 1:  # µP surrogates: from one shrunk template where it builds them bit for bit
            model = fused_surrogates(spec.model, configs, [member_seed(spec, m) for m in member_ids], scale,
                                     spec.shrink_options(), spec.group_key(configs[0]), tuple(spec.leaf_modules))
        if model is None:
            model = hydro.fuse(_build(spec, configs, member_ids, scale, mup), leaf_modules=tuple(spec.leaf_modules))
        self.model = model.to(device)
        self.optimizer = fused_optimizer(spec.optimizer, configs, self.model.parameters())
        self._compile = (spec.compile, spec.cuda_graphs)
        self.forward = compiled(self.model, *self._compile)

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def copy(self) -> FusedMembers:
        memo: dict = {}  # shared: the copied optimizer holds the copied model's parameters
        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model, memo)
        twin.optimizer = _copy_optimizer(self.optimizer, memo)
        twin.forward = compiled(twin.model, *self._compile)
        return twin

    def keep(self, positions: Sequence[int]) -> None:
        hydro.keep_members(self.model, positions, optimizer=self.optimizer)
        self.member_ids = [self.member_ids[i] for i in positions]

    def step(self, skip: Tensor | None = None) -> None:
        if skip is None:
            self.optimizer.step()
            return
        # Without reading ``skip`` on the host: every member steps, and the skipped ones get their weights and
        # optimizer state back (copies of all, as the step changes them in place).
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        held = [*params, *self._member_state()]
        saved = [t.detach().clone() for t in held]
        masks: dict[torch.device, Tensor] = {skip.device: skip}  # one copy per device (step counts: the CPU)

        def mask(t: Tensor) -> Tensor:
            if t.device not in masks:
                masks[t.device] = skip.to(t.device)
            return member_view(masks[t.device], t.dim() - 1)

        for p in params:
            if p.grad is not None:
                p.grad.masked_fill_(mask(p.grad), 0)
        self.optimizer.step()
        with torch.no_grad():
            for t, kept in zip(held, saved):
                t.copy_(torch.where(mask(t), kept, t))
            existing = {id(t) for t in held}
            for t in self._member_state():  # created by this step (the first): as if never stepped (zero state,
                if id(t) not in existing:   # step count 0), as torch's GradScaler skips the whole first step
                    t.masked_fill_(mask(t), 0)

    def _member_state(self) -> list[Tensor]:
        """The optimizer's per-member state tensors (first dimension: the members)."""
        count = len(self.member_ids)
        return [t for s in self.optimizer.state.values() for t in s.values()
                if isinstance(t, Tensor) and t.dim() and t.shape[0] == count]

    def unscale_(self, scale: Tensor) -> Tensor:
        inverse = scale.double().reciprocal().float()
        overflowed = torch.zeros(len(self.member_ids), dtype=torch.bool, device=scale.device)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(member_view(inverse.to(p.grad.dtype), p.grad.dim() - 1))
                overflowed |= ~torch.isfinite(p.grad).flatten(1).all(dim=1)
        return overflowed


class LoopedMembers(Members):
    """Independent plain models, each with the optimizer the user's factory builds (no fusion)."""

    fused = False

    def __init__(self, spec: TuneSpec, configs: Sequence[Mapping], member_ids: Sequence[str], scale: int,
                 device: torch.device | str = "cpu") -> None:
        if scale != 1:
            raise ValueError(f"unfused members train full-size models only (scale=1), got scale={scale}: µP "
                             "surrogates need the fused hydro.optim optimizers")
        self.member_ids = list(member_ids)
        self.models = [model.to(device) for model in _build(spec, configs, member_ids, scale, mup=False)]
        self.opts = [spec.optimizer(m.parameters(), c) for m, c in zip(self.models, configs)]

    def __call__(self, x: Tensor) -> Tensor:
        return torch.stack([model(x) for model in self.models])

    def modules(self) -> list[torch.nn.Module]:
        return self.models

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.opts

    def step(self, skip: Tensor | None = None) -> None:
        for i, optimizer in enumerate(self.opts):
            if skip is None or not skip[i]:
                optimizer.step()

    def unscale_(self, scale: Tensor) -> Tensor:
        overflowed = []
        for model, member_scale in zip(self.models, scale.double().reciprocal().float()):
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            torch._foreach_mul_(grads, member_scale)
            overflowed.append(~torch.stack([torch.isfinite(g).all() for g in grads]).all())
        return torch.stack(overflowed)

    def copy(self) -> LoopedMembers:
        memo: dict = {}
        twin = copy.copy(self)
        twin.models = copy.deepcopy(self.models, memo)
        twin.opts = [_copy_optimizer(o, memo) for o in self.opts]
        return twin

    def keep(self, positions: Sequence[int]) -> None:
        self.models = [self.models[i] for i in positions]
        self.opts = [self.opts[i] for i in positions]
        self.member_ids = [self.member_ids[i] for i in positions]


def build_members(spec: TuneSpec, configs: Sequence[Mapping], member_ids: Sequence[str], scale: int, *,
                  fuse: bool, mup: bool = False, device: torch.device | str = "cpu") -> tuple[Members, str | None]:
    """The members as one unit on ``device`` (initialised on the CPU, so alike on every device), and the reason
    when fusion was asked for but fell back to unfused training (only with ``spec.fallback_unfused``;
    otherwise the fusion error is raised). µP members (``mup``, or ``scale > 1``) are always fused:
    ``hydro.optim`` applies their µP learning-rate multipliers."""
    if not fuse and not mup:
        return LoopedMembers(spec, configs, member_ids, scale, device), None
    try:
        return FusedMembers(spec, configs, member_ids, scale, mup, device), None
    except (FuseError, UnsupportedOptimizer) as error:
        if not spec.fallback_unfused or mup or scale > 1:
            raise type(error)(f"{error}. Or set TuneSpec(fallback_unfused=True) to train these members unfused "
                              f"(full size only)") from error
        return LoopedMembers(spec, configs, member_ids, scale, device), f"{type(error).__name__}: {error}"


def _copy_optimizer(optimizer: torch.optim.Optimizer, memo: dict) -> torch.optim.Optimizer:
    """A deep copy of ``optimizer`` over the parameters ``memo`` maps to (torch's Optimizer pickles only its
    defaults, state and groups: other attributes, e.g. a fused optimizer's member count, are copied too)."""
    twin = copy.deepcopy(optimizer, memo)
    for name, value in vars(optimizer).items():
        if name not in vars(twin):
            setattr(twin, name, copy.deepcopy(value, memo))
    return twin


def _build(spec: TuneSpec, configs: Sequence[Mapping], member_ids: Sequence[str], scale: int, mup: bool) -> list:
    models = []
    for config, member_id in zip(configs, member_ids, strict=True):
        torch.manual_seed(member_seed(spec, member_id))  # same init wherever it runs
        models.append(build_member(spec.model, config, scale, mup=mup or scale > 1,
                                   shrink_options=spec.shrink_options()))
    return models


def member_seed(spec: TuneSpec, member_id: str) -> int:
    """The seed of a member's initialisation: a function of the spec's seed and the member id alone."""
    return spec.seed * 1_000_003 + zlib.crc32(member_id.encode())
