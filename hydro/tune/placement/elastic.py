"""Heterogeneity-aware, elastic placement of fused trials on a Ray cluster.

Nodes declare their GPUs by type as custom resources ``hydro_gpu:<type>`` (e.g. ``ray start --resources
'{"hydro_gpu:H100": 8}'``; a test declares fake types the same way). :class:`ElasticPlacement` predicts each
fused trial's step work with a step-time model and its steps (``TuneSpec.epochs`` x the training batches per
epoch at its batch size, less those done), lets a :mod:`schedulers.placement.policies` policy choose GPU types
(default :class:`~schedulers.placement.policies.ElasticEarliestFinish`: each queued trial goes where it is
predicted to finish first, counting when each busy GPU is given back), and runs each trial in a
:class:`TrialActor` holding one GPU of its type. A running trial's predicted release is its steps left (read
from the actor while it trains) at its current members' step time on its GPU type. When members stop,
:meth:`ElasticPlacement.merge` continues the survivors of several trials as one trial
(:func:`hydro.trial.merge.merge_states`) and kills the old actors, which returns their resources to Ray.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import ray
import torch

from hydro.profiling import step_features
from hydro.trial.merge import merge_states
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member
from hydro.trial.unit import FusedTrial, Observer
from schedulers.placement.cluster import GpuType
from schedulers.placement.policies import (BusyGpu, EarliestFinish, ElasticEarliestFinish, PendingTrial,
                                           PlacementPolicy, busy_seconds)
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


@dataclass(frozen=True)
class TrialPosition:
    """How far a running trial is: its members now, completed epochs and batches done of the epoch in progress."""

    member_ids: tuple[str, ...]
    epoch: int
    step: int


class _PositionRecorder(Observer):
    """Keeps the trial's :class:`TrialPosition` after each step and epoch in one attribute, so another thread
    reads a consistent one while the trial trains."""

    def __init__(self) -> None:
        self.position: TrialPosition | None = None

    def record(self, trial: FusedTrial) -> None:
        self.position = TrialPosition(tuple(trial.member_ids), trial.epoch, trial.step)

    def on_step_end(self, trial: FusedTrial, losses: torch.Tensor) -> None:
        self.record(trial)

    def on_epoch_end(self, trial: FusedTrial, metrics: Mapping[str, torch.Tensor]) -> None:
        self.record(trial)


@ray.remote(concurrency_groups={"progress": 1})
class TrialActor:
    """One fused trial on one GPU: trains epochs, keeps survivors, hands its state over; answers
    :meth:`progress` on a thread of its own, also while it trains."""

    def __init__(self, spec: TuneSpec, plan: TrialPlan, member_ids: list[str] | None = None,
                 state: dict | None = None) -> None:
        torch.set_num_threads(1)
        self.recorder = _PositionRecorder()
        self.trial = FusedTrial(spec, plan, spec.load_data(), member_ids=member_ids, observers=[self.recorder])
        if state is not None:
            self.trial.load_state_dict(state)
        self.recorder.record(self.trial)

    def run_epoch(self) -> dict[str, list[float]]:
        return {name: values.tolist() for name, values in self.trial.run_epoch().items()}

    def keep(self, member_ids: list[str]) -> None:
        self.trial.keep([self.trial.member_ids.index(m) for m in member_ids])
        self.recorder.record(self.trial)

    def member_ids(self) -> list[str]:
        return self.trial.member_ids

    def state_dict(self) -> dict:
        return self.trial.state_dict()

    @ray.method(concurrency_group="progress")
    def progress(self) -> TrialPosition:
        """The trial's position after its last step or epoch."""
        return self.recorder.position

    def assigned_gpus(self) -> list[str]:
        """The GPU resources Ray gave this actor."""
        resources = ray.get_runtime_context().get_assigned_resources()
        return sorted(k for k in resources if k.startswith(RESOURCE_PREFIX))


@dataclass
class RunningTrial:
    """A trial started by :class:`ElasticPlacement`: ``work``: its predicted step work (reference-GPU seconds)
    for the members ``work_members``."""

    plan: TrialPlan
    gpu_type: str
    actor: ray.actor.ActorHandle
    work: float
    work_members: tuple[str, ...]


@dataclass
class WaitingTrial:
    """A trial the policy has not placed yet: its plan and, for merged survivors, their state (``None``: a new
    trial); ``since``: when it began to wait (``time.monotonic``)."""

    plan: TrialPlan
    state: dict | None = None
    since: float = field(default_factory=time.monotonic)


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
    """Places fused trials of ``spec`` on the cluster's GPU ``types`` with ``policy`` (default
    :class:`~schedulers.placement.policies.ElasticEarliestFinish`), predicting their step work with ``work``,
    and merges survivors. ``running``: the trials it started that have not ended."""

    def __init__(self, spec: TuneSpec, types: Mapping[str, GpuType], work: Callable[[TrialPlan], float],
                 policy: PlacementPolicy | None = None) -> None:
        declared = ray.cluster_resources()
        missing = [t for t in types if gpu_resource(t) not in declared]
        if missing:
            raise ValueError(f"hydro.tune.placement.elastic: no node declares GPU type(s) {missing}; start nodes with "
                             f"resources {{'{gpu_resource(missing[0])}': <count>}}")
        self.spec, self.types, self.work = spec, dict(types), work
        self.policy = ElasticEarliestFinish() if policy is None else policy
        self.train, _ = spec.load_data()
        if isinstance(self.policy, EarliestFinish) and self.train.num_batches(spec.batch_size) is None:
            raise ValueError(f"hydro.tune.placement.elastic: {type(self.policy).__name__} needs each trial's steps, but the "
                             f"training split is an iterable dataset (batches per epoch unknown); pass "
                             f"policy=ElasticHeterogeneityAware()")
        self.running: list[RunningTrial] = []

    def launch(self, trials: Sequence[TrialPlan | WaitingTrial]) -> tuple[list[RunningTrial], list[WaitingTrial]]:
        """Start the trials (a queue, in FIFO order) the policy places on free GPUs now; returns them (in queue
        order) and the trials left waiting. Pass those first, in their order, to the next launch: a GPU the
        policy waits for is reserved for the trials ahead in the queue."""
        queue = [t if isinstance(t, WaitingTrial) else WaitingTrial(t) for t in trials]
        now = time.monotonic()
        pending = [PendingTrial(str(i), self.work(t.plan), now - t.since, self._steps(t)) for i, t in enumerate(queue)]
        chosen = sorted(self.policy.place(pending, free_gpus(self.types), self.types, self.busy()))
        placed = {i for i, _ in chosen}
        started = [self._start(queue[i], gpu, pending[i].work) for i, gpu in chosen]
        return started, [t for i, t in enumerate(queue) if i not in placed]

    def merge(self, trials: Sequence[RunningTrial], survivors: Mapping[int, Sequence[str]],
              release_timeout_s: float = 60.0) -> RunningTrial | WaitingTrial | None:
        """Continue the ``survivors`` (trial index -> member ids) of ``trials`` (all at one epoch boundary) as one
        trial placed by the policy; every trial in ``trials`` is ended and its GPU returned to Ray first.
        Returns the merged trial, running, or waiting (when the policy waits for a busy GPU: launch it later);
        ``None`` when no member survives.

        Raises:
            ValueError: :func:`~hydro.trial.merge.merge_states` refuses their states; every trial in ``trials`` then
                runs on with its survivors.
        """
        keep = {i: list(ids) for i, ids in survivors.items() if ids}
        ray.get([trials[i].actor.keep.remote(ids) for i, ids in keep.items()])
        states = ray.get([trials[i].actor.state_dict.remote() for i in sorted(keep)])
        merged = merge_states(states) if states else None  # a refusal leaves every trial running
        self.end(trials, release_timeout_s)
        if merged is None:
            return None
        kept = set(merged["member_ids"])
        members = [(m, c) for t in trials for m, c in t.plan.members if m in kept]
        plan = TrialPlan(TrialKind.SURROGATE, members, scale=trials[0].plan.scale, mup=trials[0].plan.mup)
        started, waiting = self.launch([WaitingTrial(plan, merged)])
        where = started[0].gpu_type if started else "a busy GPU it waits for"
        logger.info("merged %d trials into one of %d members on %s", len(trials), len(members), where)
        return started[0] if started else waiting[0]

    def end(self, trials: Sequence[RunningTrial], release_timeout_s: float = 60.0) -> None:
        """End ``trials`` (kill their actors) and wait until Ray counts their GPUs free again."""
        before = free_gpus(self.types)
        for trial in trials:
            ray.kill(trial.actor)
        self.running = [t for t in self.running if all(t is not ended for ended in trials)]
        self._await_release(before, [t.gpu_type for t in trials], release_timeout_s)

    def busy(self) -> dict[str, list[float]] | None:
        """Per GPU type, the predicted seconds until each GPU held by :attr:`running` is given back: the trial's
        steps left to ``TuneSpec.epochs`` at its current members' predicted step time on that type (an upper
        bound for a surrogate, which gives its GPU back earlier at a merge or when all its members stop).
        ``None`` when steps per epoch are unknown (an iterable training split). Trials whose actor is gone
        (ended elsewhere) leave :attr:`running`."""
        held = []
        for trial, position in self._positions():
            per_epoch = self._steps_per_epoch(trial.plan)
            if per_epoch is None:
                return None
            if position.member_ids != trial.work_members:
                members = [(m, c) for m, c in trial.plan.members if m in position.member_ids]
                trial.work, trial.work_members = self.work(replace(trial.plan, members=members)), position.member_ids
            held.append(BusyGpu(trial.gpu_type, trial.work, self.spec.epochs * per_epoch,
                                position.epoch * per_epoch + position.step))
        return busy_seconds(held, self.types)

    def _positions(self) -> list[tuple[RunningTrial, TrialPosition]]:
        refs = [trial.actor.progress.remote() for trial in self.running]
        alive = []
        for trial, ref in zip(self.running, refs):
            try:
                alive.append((trial, ray.get(ref)))
            except ray.exceptions.RayActorError:
                logger.info("trial %s on %s has ended; its GPU no longer counts as busy", trial.plan, trial.gpu_type)
        self.running = [trial for trial, _ in alive]
        return alive

    def _steps_per_epoch(self, plan: TrialPlan) -> int | None:
        return self.train.num_batches(self.spec.batch_size_of(plan.members[0][1]))

    def _steps(self, trial: WaitingTrial) -> int:
        """Predicted steps of a waiting trial: its epochs left x its steps per epoch (0: not predicted)."""
        per_epoch = self._steps_per_epoch(trial.plan)
        done = 0 if trial.state is None else trial.state["epoch"]
        return 0 if per_epoch is None else (self.spec.epochs - done) * per_epoch

    def _await_release(self, before: Mapping[str, int], released: Sequence[str], timeout_s: float) -> None:
        """Wait until Ray counts the killed actors' GPUs as free again."""
        expected = {t: before[t] + released.count(t) for t in self.types}
        deadline = time.monotonic() + timeout_s
        while any(free < expected[t] for t, free in free_gpus(self.types).items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"hydro.tune.placement.elastic: Ray did not free the ended trials' GPUs within "
                                   f"{timeout_s:.0f} s (free now {free_gpus(self.types)}, expected {expected})")
            time.sleep(0.05)

    def _start(self, trial: WaitingTrial, gpu_type: str, work: float) -> RunningTrial:
        state = trial.state
        member_ids = None if state is None else state["member_ids"]
        options = {"num_cpus": 1, "resources": {gpu_resource(gpu_type): 1}}
        actor = TrialActor.options(**options).remote(self.spec, trial.plan, member_ids, state)
        running = RunningTrial(trial.plan, gpu_type, actor, work, tuple(member_ids or trial.plan.member_ids))
        self.running.append(running)
        return running
