"""Placement policies: which queued trials start now, and on which GPU type.

A policy sees the queue (FIFO order), the free GPUs by type and, where the caller predicts them, how long each
busy GPU stays busy; it returns assignments. It is a pure decision (no clock, no cluster state of its own), used
by the simulator and by ``hydro.tune.placement.elastic`` on Ray.
"""
from __future__ import annotations

import heapq
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from schedulers.placement.cluster import GpuType


@dataclass(frozen=True)
class PendingTrial:
    """A trial waiting for a GPU: ``work``: reference-GPU seconds of one of its steps (all its members);
    ``waited_s``: how long it has waited; ``steps``: predicted steps it runs before it gives its GPU back (0:
    not predicted)."""

    key: str
    work: float
    waited_s: float = 0.0
    steps: int = 0


@dataclass(frozen=True)
class BusyGpu:
    """A GPU of type ``gpu`` held by a running trial: ``work``: reference-GPU seconds of one of its steps (its
    current members); ``planned_steps``: steps it runs before it gives the GPU back; ``done_steps``: steps done."""

    gpu: str
    work: float
    planned_steps: int
    done_steps: int

    def remaining_s(self, types: Mapping[str, GpuType]) -> float:
        """Predicted seconds until the GPU is given back: the steps left at the trial's step time on its type."""
        return max(0, self.planned_steps - self.done_steps) * types[self.gpu].step_seconds(self.work)


def busy_seconds(held: Iterable[BusyGpu], types: Mapping[str, GpuType]) -> dict[str, list[float]]:
    """``busy`` for :meth:`PlacementPolicy.place`: per GPU type, the predicted seconds until each of its GPUs
    in ``held`` is given back."""
    busy: dict[str, list[float]] = {}
    for gpu in held:
        busy.setdefault(gpu.gpu, []).append(gpu.remaining_s(types))
    return busy


class PlacementPolicy(ABC):
    """Chooses GPUs for queued trials. ``elastic``: whether survivors of several fused trials of a job are merged
    into fewer trials at each stopping rung, releasing the freed GPUs (the simulator / Ray side act on it)."""

    elastic: bool = False

    @abstractmethod
    def place(self, queue: Sequence[PendingTrial], free: Mapping[str, int], types: Mapping[str, GpuType],
              busy: Mapping[str, Sequence[float]] | None = None) -> list[tuple[int, str]]:
        """``(queue index, GPU type)`` for each trial to start now, using at most ``free[type]`` GPUs per type.
        ``busy[type]``: predicted seconds until each busy GPU of that type is given back (``None``: not
        predicted; only :class:`EarliestFinish` needs it)."""


class TypeOblivious(PlacementPolicy):
    """Ray's default: trials in FIFO order each take a free GPU whatever its type (a resource request of "1 GPU"
    does not see types); which one is a hash of the trial's key, so runs are reproducible."""

    def place(self, queue, free, types, busy=None):
        slots = [name for name, n in free.items() for _ in range(n)]
        chosen = []
        for index, trial in enumerate(queue[: len(slots)]):
            chosen.append((index, slots.pop(zlib.crc32(trial.key.encode()) % len(slots))))
        return chosen


class HeterogeneityAware(PlacementPolicy):
    """Greatest marginal gain: of the first trials of the queue (as many as GPUs are free), those that gain most
    from a fast GPU — predicted step time on the slowest type ÷ on the fastest free type — get the fastest free
    GPUs. Small surrogates, dominated by per-step overhead, land on the weaker GPUs and full-size targets on the
    strongest. A trial that would run below ``min_efficiency`` of its speed on the cluster's best type waits for
    a better GPU, at most ``patience_s`` (``min_efficiency=0``: never waits)."""

    def __init__(self, min_efficiency: float = 0.0, patience_s: float = 1800.0) -> None:
        self.min_efficiency, self.patience_s = min_efficiency, patience_s

    def place(self, queue, free, types, busy=None):
        slots = sorted((name for name, n in free.items() for _ in range(n)), key=lambda t: -types[t].rate)
        if not slots:
            return []
        slowest, fastest = min(types.values(), key=lambda g: g.rate), types[slots[0]]
        best = max(types.values(), key=lambda g: g.rate)

        def gain(i: int) -> float:
            return slowest.step_seconds(queue[i].work) / fastest.step_seconds(queue[i].work)

        ranked = sorted(range(min(len(queue), len(slots))), key=lambda i: (-gain(i), i))
        chosen = []
        for i, gpu in zip(ranked, slots):
            efficiency = best.step_seconds(queue[i].work) / types[gpu].step_seconds(queue[i].work)
            if efficiency >= self.min_efficiency or queue[i].waited_s >= self.patience_s:
                chosen.append((i, gpu))
        return chosen


class ElasticHeterogeneityAware(HeterogeneityAware):
    """:class:`HeterogeneityAware` placement, and survivors merged into fewer trials at each rung."""

    elastic = True


class EarliestFinish(PlacementPolicy):
    """Queue-aware placement by predicted finish time. Each queued trial, in FIFO order, goes to the GPU type on
    which it is predicted to finish first: the earliest moment a GPU of that type is available (free now, or when
    a running trial — or a trial placed ahead of it in this decision — gives one back) plus its run there
    (``steps`` x the type's predicted step time). It starts if that GPU is free now; otherwise it keeps that GPU
    reserved (later trials plan around it) and waits. So a short surrogate takes a free weak GPU rather than queue
    behind the targets for a strong one, and a full-size target waits for a strong GPU exactly when the wait is
    shorter than the time it saves there (which also saves GPU-hours: a target holds a V100 about 3x as long as
    an H100). Needs ``busy`` and every trial's ``steps``."""

    def place(self, queue, free, types, busy=None):
        if busy is None or any(trial.steps <= 0 for trial in queue):
            raise ValueError("EarliestFinish needs the predicted time each busy GPU is given back (busy=) and each "
                             "queued trial's predicted steps (PendingTrial.steps > 0); use HeterogeneityAware "
                             "where these are not predicted")
        # per type: a heap of (seconds from now its GPU is available, 0 if free now / 1 if busy or reserved)
        available = {name: sorted([(0.0, 0)] * free.get(name, 0) + [(t, 1) for t in busy.get(name, ())])
                     for name in types}

        def option(trial: PendingTrial, name: str) -> tuple[float, float, str]:
            """(predicted finish, run) of ``trial`` on type ``name``, in seconds from now."""
            run = trial.steps * types[name].step_seconds(trial.work)
            return available[name][0][0] + run, run, name

        chosen = []
        for index, trial in enumerate(queue):
            options = [option(trial, name) for name in types if available[name]]
            if not options:
                break
            end, _, best = min(options)  # ties: the shorter run (fewer GPU-seconds)
            if available[best][0][1] == 0:
                chosen.append((index, best))
            heapq.heapreplace(available[best], (end, 1))
        return chosen


class ElasticEarliestFinish(EarliestFinish):
    """:class:`EarliestFinish` placement, and survivors merged into fewer trials at each rung."""

    elastic = True


POLICIES: dict[str, type[PlacementPolicy]] = {
    "(a) type-oblivious (Ray default)": TypeOblivious,
    "(b) heterogeneity-aware, earliest predicted finish": EarliestFinish,
    "(c) + elastic merge/release": ElasticEarliestFinish,
    "greedy gain (no predicted release times)": HeterogeneityAware,
    "greedy gain + elastic merge/release": ElasticHeterogeneityAware,
}
