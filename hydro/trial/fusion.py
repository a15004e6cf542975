"""Fusion planners: how many members one fused trial of a group trains (the pool asks once per group key)."""
from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence

import torch
from torch import Tensor, nn

from hydro.fusion_measure import extrapolated_plan, plan_fusion
from hydro.profiling import fit_step_time_model, step_features, torch_threads
from hydro.trial.data import DataSource
from hydro.trial.precision import autocast
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member
from schedulers.prediction.step_time import StepTimeModel, candidate_counts

logger = logging.getLogger(__name__)

PLAN_STEPS = 10  # timed steps per fusion count: fewer make small surrogates' millisecond steps too noisy


class FusionPlanner(ABC):
    """Chooses the fusion count F of a group of members (same group key) from one of its configurations."""

    @abstractmethod
    def fusion_for(self, key: Hashable, config: Mapping) -> int:
        """Members per fused trial of group ``key`` (``config``: one of its members)."""


class FixedFusion(FusionPlanner):
    """The same F for every group."""

    def __init__(self, count: int) -> None:
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"fusion must be 'auto' or an int >= 1, got {count!r}")
        self.count = count

    def fusion_for(self, key: Hashable, config: Mapping) -> int:
        return self.count


class MeasuredFusion(FusionPlanner):
    """F measured with :func:`hydro.fusion_measure.plan_fusion` on ``device`` (default: this process's GPU, else
    CPU): fused training steps of the group's (shrunk) model on one batch of ``data``'s training split, in
    ``spec.precision``, with ``threads`` torch threads, within ``memory_budget_bytes`` (default: the device's),
    at the fusion ``counts`` (default: plan_fusion's ladder 1, 2, 4, ...; e.g. those that fill a run's trial slots
    in whole rounds, :func:`schedulers.trial_slots.whole_round_counts`); ``extrapolate``: counts 1 and 2 measured,
    F extrapolated from them (:func:`hydro.fusion_measure.extrapolated_plan`). ``data`` is not pickled: a copy loads
    ``spec.load_data()`` when it next plans."""

    def __init__(self, spec: TuneSpec, scale: int, data: tuple[DataSource, DataSource], max_members: int,
                 threads: int, device: torch.device | None = None, memory_budget_bytes: int | None = None,
                 counts: Sequence[int] | None = None, extrapolate: bool = False) -> None:
        self.spec, self.scale, self.data, self.max_members, self.threads = spec, scale, data, max_members, threads
        self.extrapolate = extrapolate
        self.device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.memory_budget_bytes = memory_budget_bytes
        self.counts = None if counts is None else [c for c in counts if c <= max_members] or [max_members]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "data": None}  # a copy (e.g. a restored searcher's) loads the data again

    def fusion_for(self, key: Hashable, config: Mapping) -> int:
        if self.data is None:
            self.data = self.spec.load_data()
        size = self.spec.batch_size_of(config)
        x, y = self.data[0].sample(size)
        template = build_member(self.spec.model, config, self.scale,  # one shrink; plan_fusion only times steps,
                                shrink_options=self.spec.shrink_options())
        candidates = self.candidates(template, x)
        with autocast(self.device, self.spec.precision):               # initial values do not matter
            plan = plan_fusion(lambda: copy.deepcopy(template), (x, y), self.spec.loss, max_members=self.max_members,
                               memory_budget_bytes=self.memory_budget_bytes, device=self.device, steps=PLAN_STEPS,
                               threads=self.threads, candidates=candidates)
        if self.extrapolate:
            plan = extrapolated_plan(plan, self.max_members)
        logger.info("plan_fusion for group %s on %s (%s): F=%d of %s (%s)", key, self.device, self.spec.precision,
                    plan.num_members, candidates or "the ladder 1, 2, 4, ...", plan.reason)
        return plan.num_members

    def candidates(self, template: nn.Module, x: Tensor) -> list[int] | None:
        """The fusion counts to measure (``None``: plan_fusion's ladder)."""
        return self.counts


class PredictedFusion(MeasuredFusion):
    """F measured like :class:`MeasuredFusion`, but only at the two or three counts a step-time model
    predicts best (:func:`schedulers.prediction.step_time.candidate_counts`) instead of the ladder 1, 2, 4, ...

    ``model``: a :class:`~schedulers.prediction.step_time.StepTimeModel` fitted for this device (e.g. by
    ``benchmarks/step_time_prediction.py``); ``None``: fitted on the group's own layers, timed at F = 1, 4, 16.
    """

    def __init__(self, spec: TuneSpec, scale: int, data: tuple[DataSource, DataSource], max_members: int,
                 threads: int, model: StepTimeModel | None = None, device: torch.device | None = None,
                 memory_budget_bytes: int | None = None) -> None:
        super().__init__(spec, scale, data, max_members, threads, device, memory_budget_bytes)
        self.model = model

    def candidates(self, template: nn.Module, x: Tensor) -> list[int]:
        with torch_threads(self.threads):
            model = self.model or fit_step_time_model(template, x)
            return candidate_counts(model, step_features(template, x), len(x), self.max_members)


_PLANNED_IN_PROCESS: dict[tuple, tuple[int, int]] = {}  # see fusion_in_trial: key -> (F, the most it could be)


def plans_in_process() -> int:
    """How many fusion plans :func:`fusion_in_trial` holds in this process (a reused worker's are kept)."""
    return len(_PLANNED_IN_PROCESS)


def fusion_in_trial(spec: TuneSpec, config: Mapping, scale: int, data: tuple[DataSource, DataSource],
                    max_members: int, device: torch.device, memory_budget_bytes: int | None = None) -> int:
    """F for a trial's members, measured in the trial's own process: on its device, in its precision, within
    its memory budget. Planned once per (model, group key, scale, device, precision, budget) in this process
    (again for a trial of more members where the plan took all it could); a group already planned at another
    scale (the next stage of a width ladder in a reused worker) measures F = 1 and 2 only and extrapolates
    (:func:`hydro.fusion_measure.extrapolated_plan`)."""
    group, place = (spec.model, spec.group_key(config)), (str(device), spec.precision, memory_budget_bytes)
    key = (*group, scale, *place)
    planned = _PLANNED_IN_PROCESS.get(key)
    if planned is None or planned[0] == planned[1] < max_members:
        known = any(k[:2] == group and k[3:] == place for k in _PLANNED_IN_PROCESS if k != key)
        planner = MeasuredFusion(spec, scale, data, max_members, torch.get_num_threads(), device, memory_budget_bytes,
                                 counts=[1, 2] if known and max_members > 2 else None, extrapolate=known)
        _PLANNED_IN_PROCESS[key] = planned = (planner.fusion_for(key, config), max_members)
    return min(planned[0], max_members)
