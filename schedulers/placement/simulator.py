"""Trace-driven simulation of a stream of tuning jobs on a mixed GPU cluster under a placement policy.

A job tunes ``configs`` configurations as fused µP surrogates (``fusion`` members per trial, one GPU each)
with synchronous successive halving: at each rung epoch only the best ``1/reduction`` of the job's
configurations go on (their order is the job's trace: a seeded quality per configuration). The stopping
decisions depend on the trace alone, so every policy reaches the same tuning result *by construction* (no
training happens here; that placement and merging keep a real run's results is shown by the trials' exactness
tests, not by this simulator); then the best
configuration trains at full size (the *target*, one GPU). A trial's epoch takes ``steps_per_epoch`` steps of
``GpuType.step_seconds(members × work per member)``; stopped members leave the trial (it shrinks, keeping its
GPU). With an elastic policy, a trial that reaches a rung hands its survivors to the job's rung pool and
releases its GPU; the pool starts full fused trials as soon as it holds ``fusion`` survivors and the rest when
the job's last trial reaches the rung; a merged trial pays ``merge_s`` (checkpoint and restore) first.

A policy that plans ahead (:class:`~schedulers.placement.policies.EarliestFinish`) sees each queued trial's
predicted steps until it gives its GPU back and each busy GPU's predicted remaining seconds: a target runs to its
last epoch; an elastic policy's surrogate trial to its next rung (where it hands its survivors on); a
non-elastic one to the surrogates' last epoch (an upper bound: its members may all stop earlier). Predictions
use the current members' step time, optionally missed by a random factor per trial (``prediction_error``). The
policy sees the cluster's true speeds, or, given a ``prior``, speeds it learns as the product does
(:class:`~schedulers.placement.learned_speeds.LearnedSpeeds`: the prior per type, corrected by the step times the
trials that ran on that type measured so far), while the trials run at the cluster's true speeds.

Metrics: makespan (last job done), GPU-hours (GPU time held by trials), mean queueing delay (trial enqueued ->
started) and mean job completion time (arrival -> target done). :func:`assumptions` lists every constant a
simulation assumes, for the record of its results.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from schedulers.placement.cluster import Cluster, GpuType
from schedulers.placement.learned_speeds import LearnedSpeeds
from schedulers.placement.policies import PendingTrial, PlacementPolicy


@dataclass(frozen=True)
class TuningJob:
    """One tuning job of the stream. Works are reference-GPU seconds per step of one member."""

    name: str
    arrival_s: float
    configs: int
    fusion: int
    surrogate_work: float
    target_work: float
    steps_per_epoch: int
    rungs: tuple[int, ...]  # epochs at which survivors are chosen; the last is the surrogates' final epoch
    reduction: int
    target_epochs: int
    seed: int

    def qualities(self) -> list[float]:
        return list(np.random.default_rng(self.seed).random(self.configs))

    def stop_epochs(self) -> list[int]:
        """Epoch after which each configuration stops (the last rung for those that finish)."""
        quality = self.qualities()
        alive = list(range(self.configs))
        stop = [self.rungs[-1]] * self.configs
        for rung in self.rungs[:-1]:
            keep = max(1, math.ceil(len(alive) / self.reduction))
            ranked = sorted(alive, key=lambda m: -quality[m])
            for m in ranked[keep:]:
                stop[m] = rung
            alive = ranked[:keep]
        return stop

    def best(self) -> int:
        """The configuration the job's target trains: the best of those that reached the last rung."""
        stop = self.stop_epochs()
        quality = self.qualities()
        return max((m for m in range(self.configs) if stop[m] == self.rungs[-1]), key=lambda m: quality[m])


@dataclass
class _Trial:
    key: str
    job: int
    members: list[int]
    work_per_member: float
    epoch: int
    last_epoch: int
    target: bool = False
    setup_s: float = 0.0
    enqueued: float = 0.0
    gpu: str | None = None
    started: float = 0.0
    epoch_end: float = 0.0  # when its current epoch ends (running)
    misprediction: float = 1.0  # predicted / simulated run time


@dataclass
class SimulationResult:
    policy: str
    makespan_s: float
    gpu_hours: float
    mean_queueing_s: float
    mean_jct_s: float
    best_configs: list[int]
    member_epochs: list[int]  # surrogate member-epochs trained per job (the tuning work: equal under any policy)
    gpu_seconds_by_type: dict[str, float] = field(default_factory=dict)
    busy: list[tuple[float, int]] = field(default_factory=list)  # (time, GPUs held) after each change

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "busy"}


def assumptions(cluster: Cluster, jobs: Sequence[TuningJob], merge_s: float = 30.0,
                prediction_error: float = 0.0) -> dict:
    """Every constant :func:`simulate` assumes for ``jobs`` on ``cluster``: the GPU types (rate, per-step
    overhead, their source), the step-time form, the jobs' shape (each field's value, or its distinct values), the
    merge cost
    and the prediction error, and what holds by construction."""
    fields = ("configs", "fusion", "surrogate_work", "target_work", "steps_per_epoch", "rungs", "reduction",
              "target_epochs")
    shape = {f: sorted({getattr(j, f) for j in jobs}) for f in fields}
    shape = {f: values[0] if len(values) == 1 else values for f, values in shape.items()}
    return {
        "gpu_types": cluster.assumptions(),
        "step_seconds": "overhead_s + work / rate (work in reference-GPU seconds; linear, no memory limits)",
        "jobs": {"count": len(jobs), "arrivals": "Poisson (seeded)", **shape},
        "merge_s": merge_s,
        "prediction_error_sigma": prediction_error,
        "by_construction": [
            "the same tuning result (best configuration, member-epochs) under every policy: stopping follows each "
            "job's seeded trace, not training",
            "a trial runs at its type's rate whatever shares the node (no interference, no data loading)",
        ],
    }


def simulate(cluster: Cluster, jobs: Sequence[TuningJob], policy: PlacementPolicy, name: str = "",
             merge_s: float = 30.0, prediction_error: float = 0.0, seed: int = 0,
             prior: Mapping[str, GpuType] | None = None) -> SimulationResult:
    """Run ``jobs`` on ``cluster`` under ``policy``; see the module docstring. ``prediction_error``: σ of the
    log of the factor by which each trial's predicted run time (what the policy sees) misses the simulated one,
    drawn once per trial with ``seed`` (0: exact predictions). ``prior``: per type of the cluster, the speed the
    policy starts from and corrects by measured step times (``None``: it sees the true speeds).

    Raises:
        ValueError: a negative ``prediction_error``, or a ``prior`` not naming exactly the cluster's types.
    """
    if prediction_error < 0:
        raise ValueError(f"simulate: prediction_error is a standard deviation (>= 0), got {prediction_error}")
    if prior is not None and set(prior) != set(cluster.types):
        raise ValueError(f"simulate: prior must give a speed for each of the cluster's GPU types "
                         f"{sorted(cluster.types)}, got {sorted(prior)}")
    speeds = None if prior is None else LearnedSpeeds(prior, cluster.counts)
    simulation = _Simulation(cluster, list(jobs), policy, merge_s, np.random.default_rng(seed), prediction_error,
                             speeds)
    return simulation.run(name or type(policy).__name__)


class _Simulation:
    def __init__(self, cluster: Cluster, jobs: list[TuningJob], policy: PlacementPolicy, merge_s: float,
                 rng: np.random.Generator, prediction_error: float, speeds: LearnedSpeeds | None) -> None:
        self.cluster, self.jobs, self.policy, self.merge_s = cluster, jobs, policy, merge_s
        self.speeds = speeds
        self.rng, self.prediction_error = rng, prediction_error
        self.member_epochs = [0] * len(jobs)  # surrogate member-epochs trained per job
        self.free = dict(cluster.counts)
        self.queue: list[_Trial] = []
        self.running: dict[str, _Trial] = {}  # by key
        self.events: list[tuple[float, int, str, object]] = []
        self.order = itertools.count()
        self.now = 0.0
        self.stops = [job.stop_epochs() for job in jobs]
        self.pool: dict[tuple[int, int], list[int]] = {}  # (job, rung) -> survivors waiting to be merged
        self.toward: dict[tuple[int, int], int] = {}  # (job, rung) -> trials still to reach it
        self.surrogates_left = [job.configs for job in jobs]
        self.done_at: dict[int, float] = {}
        self.waits: list[float] = []
        self.gpu_seconds = {name: 0.0 for name in cluster.types}
        self.busy: list[tuple[float, int]] = [(0.0, 0)]
        self.names = itertools.count()

    def run(self, name: str) -> SimulationResult:
        for index, job in enumerate(self.jobs):
            self._push(job.arrival_s, "arrive", index)
        while self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "arrive":
                self._arrive(payload)
            else:
                self._epoch_end(payload)
            self._schedule()
        if len(self.done_at) != len(self.jobs):
            raise RuntimeError(f"simulate: {len(self.jobs) - len(self.done_at)} jobs never finished (a trial needs "
                               f"a GPU the cluster lacks?)")
        if self.member_epochs != [sum(stops) for stops in self.stops]:
            raise RuntimeError("simulate: a job's members trained other epochs than its stopping trace says")
        return SimulationResult(
            policy=name, makespan_s=max(self.done_at.values()), gpu_hours=sum(self.gpu_seconds.values()) / 3600,
            mean_queueing_s=float(np.mean(self.waits)),
            mean_jct_s=float(np.mean([self.done_at[i] - j.arrival_s for i, j in enumerate(self.jobs)])),
            best_configs=[job.best() for job in self.jobs], member_epochs=self.member_epochs,
            gpu_seconds_by_type=dict(self.gpu_seconds),
            busy=self.busy)

    # --- events ---------------------------------------------------------------------------------------

    def _push(self, time: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (time, next(self.order), kind, payload))

    def _arrive(self, index: int) -> None:
        job = self.jobs[index]
        groups = [list(range(i, min(i + job.fusion, job.configs))) for i in range(0, job.configs, job.fusion)]
        self.toward[index, job.rungs[0]] = len(groups)
        for members in groups:
            self._enqueue(_Trial("", index, members, job.surrogate_work, 0, job.rungs[-1]))

    def _enqueue(self, trial: _Trial) -> None:
        trial.key, trial.enqueued = f"t{next(self.names)}", self.now
        trial.misprediction = float(np.exp(self.rng.normal(0.0, self.prediction_error)))
        self.queue.append(trial)

    def _seen_types(self) -> Mapping[str, GpuType]:
        """The speeds the policy places by: learned ones, or the cluster's true ones."""
        return self.cluster.types if self.speeds is None else self.speeds.types()

    def _schedule(self) -> None:
        pending = [PendingTrial(t.key, len(t.members) * t.work_per_member, self.now - t.enqueued, max(1, round(
            t.misprediction * (self._release_epoch(t) - t.epoch) * self.jobs[t.job].steps_per_epoch)))
                   for t in self.queue]
        busy: dict[str, list[float]] = {}
        for trial in self.running.values():
            busy.setdefault(trial.gpu, []).append(self._remaining_s(trial))
        chosen = self.policy.place(pending, {k: v for k, v in self.free.items() if v > 0}, self._seen_types(), busy)
        started = set()
        for index, gpu in chosen:
            if self.free.get(gpu, 0) < 1 or index in started:
                raise ValueError(f"placement policy {type(self.policy).__name__} assigned a busy GPU or a trial twice")
            trial = self.queue[index]
            started.add(index)
            self.free[gpu] -= 1
            trial.gpu, trial.started = gpu, self.now
            self.waits.append(self.now - trial.enqueued)
            self.running[trial.key] = trial
            if self.speeds is not None:
                self.speeds.started(trial.key, gpu, trial.work_per_member, len(trial.members),
                                    (self._release_epoch(trial) - trial.epoch) * self.jobs[trial.job].steps_per_epoch)
            self._next_epoch(trial, trial.setup_s)
        self.queue = [t for i, t in enumerate(self.queue) if i not in started]
        self._record_busy()

    def _next_epoch(self, trial: _Trial, setup_s: float = 0.0) -> None:
        trial.epoch_end = self.now + setup_s + self._epoch_seconds(trial)
        self._push(trial.epoch_end, "epoch", trial)

    def _release_epoch(self, trial: _Trial) -> int:
        """The epoch after which ``trial`` is predicted to give its GPU back: a target's last; with an elastic
        policy, a surrogate's next rung; otherwise the surrogates' last epoch (an upper bound: all its members
        may stop earlier)."""
        if self.policy.elastic and not trial.target:
            return next(r for r in self.jobs[trial.job].rungs if r > trial.epoch)
        return trial.last_epoch

    def _remaining_s(self, trial: _Trial) -> float:
        """Predicted seconds until running ``trial`` gives its GPU back: its steps left (those of its current
        epoch, then of its later ones) at its current members' step time as the policy sees it."""
        later = self._release_epoch(trial) - trial.epoch - 1  # epochs after the current one
        true, seen = self._epoch_seconds(trial), self._epoch_seconds(trial, self._seen_types())
        current = trial.epoch_end - self.now
        if seen != true:
            current *= seen / true
        return trial.misprediction * (current + later * seen)

    def _epoch_seconds(self, trial: _Trial, types: Mapping[str, GpuType] | None = None) -> float:
        """Seconds of ``trial``'s epoch at its current members, at ``types``' speeds (default: the true ones)."""
        job = self.jobs[trial.job]
        gpu = (types or self.cluster.types)[trial.gpu]
        return job.steps_per_epoch * gpu.step_seconds(len(trial.members) * trial.work_per_member)

    def _measured(self, trial: _Trial, seconds_per_step: float) -> None:
        """Report ``trial``'s epoch just ended, stepped at ``seconds_per_step``, to the learned speeds."""
        if self.speeds is not None:
            self.speeds.measured(trial.key, trial.epoch * self.jobs[trial.job].steps_per_epoch, max(1, len(
                trial.members)), seconds_per_step)

    def _release(self, trial: _Trial) -> None:
        del self.running[trial.key]
        if self.speeds is not None:
            self.speeds.ended(trial.key)
        self.free[trial.gpu] += 1
        self.gpu_seconds[trial.gpu] += self.now - trial.started
        self._record_busy()

    def _record_busy(self) -> None:
        held = sum(self.cluster.counts.values()) - sum(self.free.values())
        if self.busy[-1][1] != held:
            self.busy.append((self.now, held))

    def _epoch_end(self, trial: _Trial) -> None:
        trial.epoch += 1
        trial.setup_s = 0.0
        job_index, job = trial.job, self.jobs[trial.job]
        stepped = self._epoch_seconds(trial) / job.steps_per_epoch  # at the members that ran the epoch
        if trial.target:
            self._measured(trial, stepped)
            if trial.epoch < trial.last_epoch:
                self._next_epoch(trial)
                return
            self._release(trial)
            self.done_at[job_index] = self.now
            return
        stops = self.stops[job_index]
        self.member_epochs[job_index] += len(trial.members)
        leaving = [m for m in trial.members if stops[m] <= trial.epoch]
        trial.members = [m for m in trial.members if stops[m] > trial.epoch]
        self._measured(trial, stepped)
        self.surrogates_left[job_index] -= len(leaving)
        if self.policy.elastic and trial.epoch in job.rungs[:-1]:
            self.toward[job_index, trial.epoch] -= 1
            self._release(trial)
            self._merge(job_index, trial.epoch, trial.members)
        elif trial.members:
            self._next_epoch(trial)
        else:
            self._release(trial)
        if self.surrogates_left[job_index] == 0:
            self._start_target(job_index)

    def _merge(self, job_index: int, rung: int, survivors: list[int]) -> None:
        job = self.jobs[job_index]
        pool = self.pool.setdefault((job_index, rung), [])
        pool.extend(survivors)
        last = self.toward[job_index, rung] == 0
        next_rung = job.rungs[job.rungs.index(rung) + 1]
        while len(pool) >= job.fusion or (last and pool):
            members, pool[:] = pool[: job.fusion], pool[job.fusion:]
            self.toward[job_index, next_rung] = self.toward.get((job_index, next_rung), 0) + 1
            self._enqueue(_Trial("", job_index, members, job.surrogate_work, rung, job.rungs[-1],
                                 setup_s=self.merge_s))

    def _start_target(self, job_index: int) -> None:
        job = self.jobs[job_index]
        self._enqueue(_Trial("", job_index, [job.best()], job.target_work, 0, job.target_epochs, target=True))


def job_stream(count: int, seed: int = 0, mean_interarrival_s: float = 1200.0, **overrides) -> list[TuningJob]:
    """``count`` jobs with Poisson arrivals; defaults: 32 configurations fused 8 per trial, a full-size step of
    0.25 reference-GPU seconds shrunk by S=8 (work ÷ 64), 100 steps per epoch, rungs 1, 3, 9, 27 with reduction
    3, and a 27-epoch target."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(mean_interarrival_s, count)) - mean_interarrival_s
    defaults = dict(configs=32, fusion=8, surrogate_work=0.25 / 64, target_work=0.25, steps_per_epoch=100,
                    rungs=(1, 3, 9, 27), reduction=3, target_epochs=27)
    return [TuningJob(f"job{i}", float(max(0.0, a)), seed=seed * 1000 + i, **{**defaults, **overrides})
            for i, a in enumerate(arrivals)]
