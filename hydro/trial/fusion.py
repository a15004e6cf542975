"""Fusion planners: how many members one fused trial of a group trains (the pool asks once per group key)."""
from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping

from hydro.planning import plan_fusion
from hydro.profiling import fit_step_time_model, step_features, torch_threads
from hydro.trial.spec import Batch, TuneSpec
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
    """F measured with :func:`hydro.planning.plan_fusion` on this process's device: fused training steps of
    the group's (shrunk) model on one batch of ``data``'s training split, with ``threads`` torch threads."""

    def __init__(self, spec: TuneSpec, scale: int, data: tuple[Batch, Batch], max_members: int, threads: int) -> None:
        self.spec, self.scale, self.data, self.max_members, self.threads = spec, scale, data, max_members, threads

    def fusion_for(self, key: Hashable, config: Mapping) -> int:
        (x, y), _ = self.data
        size = self.spec.batch_size_of(config)
        template = build_member(self.spec.model, config, self.scale)  # one shrink; plan_fusion only times steps,
        plan = plan_fusion(lambda: copy.deepcopy(template), (x[:size], y[:size]), self.spec.loss,  # initial values
                           max_members=self.max_members, steps=PLAN_STEPS, threads=self.threads)  # do not matter
        logger.info("plan_fusion for group %s: F=%d (%s)", key, plan.num_members, plan.reason)
        return plan.num_members


class PredictedFusion(MeasuredFusion):
    """F measured like :class:`MeasuredFusion`, but only at the two or three counts a step-time model
    predicts best (:func:`schedulers.prediction.step_time.candidate_counts`) instead of the ladder 1, 2, 4, ...

    ``model``: a :class:`~schedulers.prediction.step_time.StepTimeModel` fitted for this device (e.g. by
    ``benchmarks/step_time_prediction.py``); ``None``: fitted on the group's own layers, timed at F = 1, 4, 16.
    """

    def __init__(self, spec: TuneSpec, scale: int, data: tuple[Batch, Batch], max_members: int, threads: int,
                 model: StepTimeModel | None = None) -> None:
        super().__init__(spec, scale, data, max_members, threads)
        self.model = model

    def fusion_for(self, key: Hashable, config: Mapping) -> int:
        (x, y), _ = self.data
        size = self.spec.batch_size_of(config)
        template = build_member(self.spec.model, config, self.scale)
        with torch_threads(self.threads):
            model = self.model or fit_step_time_model(template, x[:size])
            candidates = candidate_counts(model, step_features(template, x[:size]), size, self.max_members)
        plan = plan_fusion(lambda: copy.deepcopy(template), (x[:size], y[:size]), self.spec.loss,
                           max_members=self.max_members, steps=PLAN_STEPS, threads=self.threads, candidates=candidates)
        logger.info("plan_fusion for group %s: F=%d of predicted candidates %s (%s)", key, plan.num_members,
                    candidates, plan.reason)
        return plan.num_members
