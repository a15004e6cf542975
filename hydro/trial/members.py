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
from hydro.optim.lr_scheduler import ReduceLROnPlateau
from hydro.trial.backend import compiled
from hydro.trial.optimizer import UnsupportedOptimizer, build_optimizer, translate
from hydro.trial.schedule import ScheduleInterval, UnsupportedSchedule, fused_schedule
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member, fused_surrogates


PLATEAU = (ReduceLROnPlateau, torch.optim.lr_scheduler.ReduceLROnPlateau)


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

    def schedulers(self) -> list:
        """The LR schedulers of :meth:`optimizers` (``TuneSpec.lr_scheduler``; none without)."""
        raise NotImplementedError

    def lr_step(self, metric: Tensor | None = None) -> None:
        """Step the LR schedule; ``metric``: the members' values of ``TuneSpec.metric`` ``[F]`` (what
        ``ReduceLROnPlateau`` follows; only for it)."""
        raise NotImplementedError

    @property
    def follows_metric(self) -> bool:
        """Whether the LR schedule steps on the members' metric (``ReduceLROnPlateau``)."""
        return any(isinstance(s, PLATEAU) for s in self.schedulers())

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
                "optimizers": [o.state_dict() for o in self.optimizers()],
                "schedulers": [s.state_dict() for s in self.schedulers()]}

    def load_state_dict(self, state: dict) -> None:
        for module, saved in zip(self.modules(), state["modules"], strict=True):
            module.load_state_dict(saved)
        for optimizer, saved in zip(self.optimizers(), state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        for scheduler, saved in zip(self.schedulers(), state.get("schedulers", []), strict=True):
            scheduler.load_state_dict(saved)


class FusedMembers(Members):
    """All members in one ``hydro.fuse`` model trained by one fused optimizer."""

    fused = True

    def __init__(self, spec: TuneSpec, configs: Sequence[Mapping], member_ids: Sequence[str], scale: int,
                 mup: bool = False, device: torch.device | str = "cpu") -> None:
        self.member_ids = list(member_ids)
        built = None
        if scale > 1:  # µP surrogates: from one shrunk template where it builds them bit for bit
            built = fused_surrogates(spec.model, configs, [member_seed(spec, m) for m in member_ids], scale,
                                     spec.shrink_options(), spec.group_key(configs[0]), tuple(spec.leaf_modules))
        if built is None:
            models = _build(spec, configs, member_ids, scale, mup)
            model = hydro.fuse(models, leaf_modules=tuple(spec.leaf_modules))
        else:  # one architecture: the template's surrogate stands for every member in the optimizer factory
            model, surrogate = built
            models = [surrogate] * len(configs)
        self.model = model.to(device)
        self.optimizer, probes = translate(spec.optimizer, configs, self.model, models)
        self.scheduler = None if spec.lr_scheduler is None else \
            _checked_schedule(fused_schedule(spec.lr_scheduler, configs, probes, self.optimizer), spec)
        self._compile = (spec.compile, spec.cuda_graphs)
        self.forward = compiled(self.model, *self._compile)

    def __call__(self, x: Tensor) -> Tensor:
        return self.forward(x)

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.optimizer]

    def schedulers(self) -> list:
        return [] if self.scheduler is None else [self.scheduler]

    def lr_step(self, metric: Tensor | None = None) -> None:
        if isinstance(self.scheduler, ReduceLROnPlateau):
            self.scheduler.step(metric)
        elif self.scheduler is not None:
            self.scheduler.step()

    def copy(self) -> FusedMembers:
        memo: dict = {}  # shared: the copied optimizer holds the copied model's parameters
        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model, memo)
        twin.optimizer = _copy_optimizer(self.optimizer, memo)
        twin.scheduler = copy.deepcopy(self.scheduler, memo)  # of the copied optimizer
        twin.forward = compiled(twin.model, *self._compile)
        return twin

    def keep(self, positions: Sequence[int]) -> None:
        hydro.keep_members(self.model, positions, optimizer=self.optimizer, schedulers=self.schedulers())
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
        self.opts = [build_optimizer(spec.optimizer, m.parameters(), c) for m, c in zip(self.models, configs)]
        self.scheds = [] if spec.lr_scheduler is None else [spec.lr_scheduler(o, c) for o, c in zip(self.opts, configs)]
        for scheduler in self.scheds[:1]:
            _checked_schedule(scheduler, spec)

    def __call__(self, x: Tensor) -> Tensor:
        return torch.stack([model(x) for model in self.models])

    def modules(self) -> list[torch.nn.Module]:
        return self.models

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.opts

    def schedulers(self) -> list:
        return self.scheds

    def lr_step(self, metric: Tensor | None = None) -> None:
        for i, scheduler in enumerate(self.scheds):
            if isinstance(scheduler, PLATEAU):
                scheduler.step(float(metric[i]))
            else:
                scheduler.step()

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
        twin.scheds = copy.deepcopy(self.scheds, memo)
        return twin

    def keep(self, positions: Sequence[int]) -> None:
        self.models = [self.models[i] for i in positions]
        self.opts = [self.opts[i] for i in positions]
        self.scheds = [self.scheds[i] for i in positions] if self.scheds else []
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
    except (FuseError, UnsupportedOptimizer, UnsupportedSchedule) as error:
        if not spec.fallback_unfused or mup or scale > 1:
            raise type(error)(f"{error}. Or set TuneSpec(fallback_unfused=True) to train these members unfused "
                              f"(full size only)") from error
        return LoopedMembers(spec, configs, member_ids, scale, device), f"{type(error).__name__}: {error}"


def _checked_schedule(scheduler, spec: TuneSpec):
    """``scheduler``, refused when it cannot follow ``spec.lr_scheduler_interval``."""
    if spec.lr_scheduler_interval is ScheduleInterval.BATCH and isinstance(scheduler, PLATEAU):
        raise UnsupportedSchedule("ReduceLROnPlateau follows an epoch's validation metric; set "
                                  "TuneSpec.lr_scheduler_interval='epoch'")
    return scheduler


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
