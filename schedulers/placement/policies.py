"""Placement policies: which queued trials start now, and on which GPU type.

A policy sees the queue (FIFO order) and the free GPUs by type and returns assignments; it is a pure decision
(no clock, no cluster state of its own), used by the simulator and by ``hydro.tune.placement`` on Ray.
"""
from __future__ import annotations

import zlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schedulers.placement.cluster import GpuType


@dataclass(frozen=True)
class PendingTrial:
    """A trial waiting for a GPU: ``work``: reference-GPU seconds of one of its steps (all its members);
    ``waited_s``: how long it has waited."""

    key: str
    work: float
    waited_s: float = 0.0


class PlacementPolicy(ABC):
    """Chooses GPUs for queued trials. ``elastic``: whether survivors of several fused trials of a job are merged
    into fewer trials at each stopping rung, releasing the freed GPUs (the simulator / Ray side act on it)."""

    elastic: bool = False

    @abstractmethod
    def place(self, queue: Sequence[PendingTrial], free: Mapping[str, int],
              types: Mapping[str, GpuType]) -> list[tuple[int, str]]:
        """``(queue index, GPU type)`` for each trial to start now, using at most ``free[type]`` GPUs per type."""


class TypeOblivious(PlacementPolicy):
    """Ray's default: trials in FIFO order each take a free GPU whatever its type (a resource request of "1 GPU"
    does not see types); which one is a hash of the trial's key, so runs are reproducible."""

    def place(self, queue, free, types):
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

    def place(self, queue, free, types):
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


POLICIES: dict[str, type[PlacementPolicy]] = {
    "(a) type-oblivious (Ray default)": TypeOblivious,
    "(b) heterogeneity-aware": HeterogeneityAware,
    "(c) + elastic merge/release": ElasticHeterogeneityAware,
}
