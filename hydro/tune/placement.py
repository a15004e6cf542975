"""Heterogeneity-aware, elastic placement of fused trials on a Ray cluster.

Nodes declare their GPUs by type as custom resources ``hydro_gpu:<type>`` (e.g. ``ray start --resources
'{"hydro_gpu:H100": 8}'``; a test declares fake types the same way). :class:`ElasticPlacement` predicts each
fused trial's step work with a step-time model, lets a :mod:`schedulers.placement.policies` policy choose GPU
types among the free ones, and runs each trial in a :class:`TrialActor` holding one GPU of its type. When
members stop, :meth:`ElasticPlacement.merge` continues the survivors of several trials as one trial
(:func:`hydro.trial.merge.merge_states`) and kills the old actors, which returns their resources to Ray.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import ray
import torch

from hydro.profiling import step_features
from hydro.trial.merge import merge_states
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member
from hydro.trial.unit import FusedTrial
from schedulers.placement.cluster import GpuType
from schedulers.placement.policies import PendingTrial, PlacementPolicy
from schedulers.prediction.step_time import StepTimeModel

logger = logging.getLogger(__name__)

RESOURCE_PREFIX = "hydro_gpu:"


def gpu_resource(gpu_type: str) -> str:
    """The custom resource of one GPU of ``gpu_type``."""
    return RESOURCE_PREFIX + gpu_type


def free_gpus(types: Mapping[str, GpuType]) -> dict[str, int]:
    """Free GPUs of each of ``types`` in the Ray cluster now."""
    available = ray.available_resources()
    return {name: int(available.get(gpu_resource(name), 0)) for name in types}


@ray.remote
class TrialActor:
    """One fused trial on one GPU: trains epochs, keeps survivors, hands its state over."""

    def __init__(self, spec: TuneSpec, plan: TrialPlan, member_ids: list[str] | None = None,
                 state: dict | None = None) -> None:
        torch.set_num_threads(1)
        self.trial = FusedTrial(spec, plan, spec.load_data(), member_ids=member_ids)
        if state is not None:
            self.trial.load_state_dict(state)

    def run_epoch(self) -> dict[str, list[float]]:
        return {name: values.tolist() for name, values in self.trial.run_epoch().items()}

    def keep(self, member_ids: list[str]) -> None:
        self.trial.keep([self.trial.member_ids.index(m) for m in member_ids])

    def member_ids(self) -> list[str]:
        return self.trial.member_ids

    def state_dict(self) -> dict:
        return self.trial.state_dict()

    def assigned_gpus(self) -> list[str]:
        """The GPU resources Ray gave this actor."""
        resources = ray.get_runtime_context().get_assigned_resources()
        return sorted(k for k in resources if k.startswith(RESOURCE_PREFIX))


@dataclass
class RunningTrial:
    plan: TrialPlan
    gpu_type: str
    actor: ray.actor.ActorHandle


def predicted_work(spec: TuneSpec, model: StepTimeModel) -> Callable[[TrialPlan], float]:
    """A trial's step work (seconds on ``model``'s device without per-call overheads) predicted from one
    member's layer features on a batch of the spec's batch size, times its members."""
    train, _ = spec.load_data()

    def work(plan: TrialPlan) -> float:
        config = plan.members[0][1]
        member = build_member(spec.model, config, plan.scale, mup=plan.mup or plan.scale > 1,
                              shrink_options=spec.shrink_options())
        x, _ = train.sample(spec.batch_size_of(config))
        return model.work_seconds(step_features(member, x), len(plan.members))

    return work


class ElasticPlacement:
    """Places fused trials of ``spec`` on the cluster's GPU ``types`` with ``policy`` and merges survivors."""

    def __init__(self, spec: TuneSpec, types: Mapping[str, GpuType], policy: PlacementPolicy,
                 work: Callable[[TrialPlan], float]) -> None:
        declared = ray.cluster_resources()
        missing = [t for t in types if gpu_resource(t) not in declared]
        if missing:
            raise ValueError(f"hydro.tune.placement: no node declares GPU type(s) {missing}; start nodes with "
                             f"resources {{'{gpu_resource(missing[0])}': <count>}}")
        self.spec, self.types, self.policy, self.work = spec, dict(types), policy, work

    def launch(self, plans: Sequence[TrialPlan]) -> tuple[list[RunningTrial], list[TrialPlan]]:
        """Start the trials the policy places on free GPUs now; returns them (in the order of ``plans``) and the
        plans left waiting."""
        chosen = sorted(self._choose(plans))
        placed = {i for i, _ in chosen}
        return [self._start(plans[i], gpu) for i, gpu in chosen], [p for i, p in enumerate(plans) if i not in placed]

    def merge(self, trials: Sequence[RunningTrial], survivors: Mapping[int, Sequence[str]],
              release_timeout_s: float = 60.0) -> RunningTrial | None:
        """Continue the ``survivors`` (trial index -> member ids) of ``trials`` (all at one epoch boundary) as one
        trial placed by the policy; every trial in ``trials`` is ended and its GPU returned to Ray first.
        ``None`` when no member survives."""
        keep = {i: list(ids) for i, ids in survivors.items() if ids}
        ray.get([trials[i].actor.keep.remote(ids) for i, ids in keep.items()])
        states = ray.get([trials[i].actor.state_dict.remote() for i in sorted(keep)])
        before = free_gpus(self.types)
        for trial in trials:
            ray.kill(trial.actor)
        self._await_release(before, [t.gpu_type for t in trials], release_timeout_s)
        if not states:
            return None
        merged = merge_states(states)
        kept = set(merged["member_ids"])
        members = [(m, c) for t in trials for m, c in t.plan.members if m in kept]
        plan = TrialPlan(TrialKind.SURROGATE, members, scale=trials[0].plan.scale, mup=trials[0].plan.mup)
        chosen = self._choose([plan])
        if not chosen:
            raise RuntimeError("hydro.tune.placement: the merged trial found no GPU it may use although its trials' "
                               "were just returned (another job took them, or the policy waits for a better type)")
        gpu = chosen[0][1]
        logger.info("merged %d trials into one of %d members on %s", len(trials), len(members), gpu)
        return RunningTrial(plan, gpu, self._actor(plan, gpu, merged["member_ids"], merged))

    def _choose(self, plans: Sequence[TrialPlan]) -> list[tuple[int, str]]:
        pending = [PendingTrial(str(i), self.work(plan)) for i, plan in enumerate(plans)]
        return self.policy.place(pending, free_gpus(self.types), self.types)

    def _await_release(self, before: Mapping[str, int], released: Sequence[str], timeout_s: float) -> None:
        """Wait until Ray counts the killed actors' GPUs as free again."""
        expected = {t: before[t] + released.count(t) for t in self.types}
        deadline = time.monotonic() + timeout_s
        while any(free < expected[t] for t, free in free_gpus(self.types).items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"hydro.tune.placement: Ray did not free the merged trials' GPUs within "
                                   f"{timeout_s:.0f} s (free now {free_gpus(self.types)}, expected {expected})")
            time.sleep(0.05)

    def _start(self, plan: TrialPlan, gpu_type: str) -> RunningTrial:
        return RunningTrial(plan, gpu_type, self._actor(plan, gpu_type))

    def _actor(self, plan: TrialPlan, gpu_type: str, member_ids: list[str] | None = None, state: dict | None = None):
        options = {"num_cpus": 1, "resources": {gpu_resource(gpu_type): 1}}
        return TrialActor.options(**options).remote(self.spec, plan, member_ids, state)
