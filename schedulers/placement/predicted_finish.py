"""Choosing each fused trial's GPU type by predicted finish, one trial at a time, as a tuner asks for trials.

A trial's step on GPU type ``g`` has an overhead part ``o`` (its per-call overheads, which fusion amortises, plus
the type's per-step overhead) and a work part ``w`` (``work`` at the type's rate,
:class:`~schedulers.placement.cluster.GpuType`), ``work`` (linear in the trial's members) and the per-call
overheads coming from the step-time model. It is predicted as ``c_o[g] x o + c_w[g] x w``: once the step times
trials measured on ``g`` span two mixes of overhead and work, ``(c_o, c_w)`` is their least-squares fit (relative
to the measured times; a type's surrogates are overhead-bound and its targets compute-bound, which one factor
cannot both fit); before that, both are the median ratio of the measured step times to the prior's ``o + w``
(a type not measured yet takes the median ratio over all measurements, else 1). Each new trial goes to the type
on which it is predicted to finish first: when a GPU of that type is next available — after the trials already
given to that type, in the order they were given, run their predicted steps left — plus its own predicted run
there (:class:`~schedulers.placement.policies.EarliestFinish`'s rule, with the trials a tuner has queued for a
type counted as holding it in turn).
"""
from __future__ import annotations

import heapq
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from schedulers.placement.cluster import GpuType


@dataclass
class PlacedTrial:
    """A trial given a GPU type: ``work_per_member``: reference seconds of one member's step without per-call
    overheads (the step-time model's work, linear in members); ``overhead_s``: the step's per-call overheads;
    ``members``: its members now; ``steps``: predicted steps in all; ``done``: steps done."""

    gpu: str
    work_per_member: float
    overhead_s: float
    members: int
    steps: int
    done: int = 0

    @property
    def work(self) -> float:
        return self.work_per_member * self.members


@dataclass(frozen=True)
class Choice:
    """Where a trial goes: ``gpu``, and per type its predicted finish (seconds from now) and step (seconds)."""

    gpu: str
    finish_s: Mapping[str, float]
    step_s: Mapping[str, float] = field(default_factory=dict)


@dataclass
class PredictedFinish:
    """Per-trial GPU-type choice by predicted finish on a cluster of ``counts[type]`` GPUs of ``types[type]``;
    ``trials``: the trials given a type that have not ended; ``ratios``: per type, measured ÷ predicted step
    times so far."""

    types: Mapping[str, GpuType]
    counts: Mapping[str, int]
    trials: dict[str, PlacedTrial] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    samples: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)  # per type: (o, w, measured)
    _fits: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False, compare=False)

    def __setstate__(self, state: dict) -> None:  # a placement saved before the fit was kept
        self.__dict__.update({"samples": {}, "_fits": {}, **state})

    def __post_init__(self) -> None:
        if set(self.types) != set(self.counts) or not self.counts or min(self.counts.values()) < 1:
            raise ValueError(f"PredictedFinish: every GPU type needs a count >= 1; got types {sorted(self.types)}, "
                             f"counts {dict(self.counts)}")

    def correction(self, gpu: str) -> float:
        """Measured ÷ predicted step time on ``gpu`` (median; the median over all types where ``gpu`` has no
        measurement yet; 1 with none at all)."""
        own = self.ratios.get(gpu) or [r for rs in self.ratios.values() for r in rs]
        return statistics.median(own) if own else 1.0

    def corrections(self, gpu: str) -> tuple[float, float]:
        """``(c_o, c_w)`` of ``gpu``: the factors of its overhead and work parts (see the module docstring)."""
        if gpu not in self._fits:
            fitted = _fit(self.samples.get(gpu, []))
            self._fits[gpu] = fitted if fitted is not None else (self.correction(gpu),) * 2
        return self._fits[gpu]

    def step_seconds(self, gpu: str, trial: PlacedTrial) -> float:
        """Predicted seconds of one step of ``trial`` on ``gpu``, corrected by what trials measured there."""
        c_o, c_w = self.corrections(gpu)
        o, w = self._parts(gpu, trial)
        return c_o * o + c_w * w

    def choose(self, key: str, work_per_member: float, members: int, steps: int, overhead_s: float = 0.0) -> Choice:
        """Give trial ``key`` (``members`` members of ``work_per_member`` each plus ``overhead_s`` per step,
        ``steps`` steps) the type on which it is predicted to finish first (ties: the shorter run, then the name),
        and count it as holding that type until :meth:`end`."""
        if steps < 1 or members < 1 or work_per_member < 0 or overhead_s < 0:
            raise ValueError(f"PredictedFinish.choose: a trial needs steps >= 1, members >= 1, work and overhead "
                             f">= 0; got steps={steps}, members={members}, work_per_member={work_per_member}, "
                             f"overhead_s={overhead_s}")
        trial = PlacedTrial("", work_per_member, overhead_s, members, steps)
        options, step = {}, {}
        for gpu in self.types:
            step[gpu] = self.step_seconds(gpu, trial)
            options[gpu] = (self._available_s(gpu) + steps * step[gpu], steps * step[gpu], gpu)
        best = min(options.values())[2]
        trial.gpu = best
        self.trials[key] = trial
        return Choice(best, {gpu: option[0] for gpu, option in options.items()}, step)

    def move(self, key: str, gpu: str) -> None:
        """Count trial ``key`` (given a type by :meth:`choose`) as holding ``gpu`` instead (another rule chose)."""
        if gpu not in self.types:
            raise ValueError(f"PredictedFinish.move: unknown GPU type {gpu!r}; the types are {sorted(self.types)}")
        self.trials[key].gpu = gpu

    def progress(self, key: str, done: int, members: int, seconds_per_step: float | None = None) -> None:
        """Trial ``key`` has done ``done`` steps and has ``members`` live members now; ``seconds_per_step``: its
        measured step time over its steps since the last call (trained by the members it had then), which refines
        its type's correction."""
        trial = self.trials.get(key)
        if trial is None:
            return
        if seconds_per_step is not None and seconds_per_step > 0:
            o, w = self._parts(trial.gpu, trial)
            self.ratios.setdefault(trial.gpu, []).append(seconds_per_step / (o + w))
            self.samples.setdefault(trial.gpu, []).append((o, w, seconds_per_step))
            self._fits.clear()  # a type without measurements of its own follows the median over all
        trial.done, trial.members = done, members

    def end(self, key: str) -> None:
        """Trial ``key`` ended: its type's GPU is free for the next."""
        self.trials.pop(key, None)

    def _available_s(self, gpu: str) -> float:
        """Seconds from now until a GPU of ``gpu`` is free for a new trial: its GPUs taken in turn by the trials
        given to it (in the order given), each for its predicted steps left."""
        heap = [0.0] * self.counts[gpu]
        for trial in self.trials.values():
            if trial.gpu == gpu:
                left = max(0, trial.steps - trial.done) * self.step_seconds(gpu, trial)
                heapq.heapreplace(heap, heap[0] + left)
        return heap[0]

    def _parts(self, gpu: str, trial: PlacedTrial) -> tuple[float, float]:
        """The prior's overhead and work parts of one step of ``trial`` on ``gpu`` (s)."""
        kind = self.types[gpu]
        return trial.overhead_s + kind.overhead_s, kind.step_seconds(trial.work) - kind.overhead_s


def _fit(samples: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """``(c_o, c_w)`` minimising ``sum(((c_o o + c_w w) / m - 1) ** 2)`` over ``(o, w, m)`` samples with ``c_o >=
    0``; ``None`` with fewer than two samples, samples of one mix of overhead and work (no unique fit), or no
    ``c_w > 0``."""
    if len(samples) < 2:
        return None
    a = [o / m for o, _, m in samples]
    b = [w / m for _, w, m in samples]
    aa, bb, ab = sum(x * x for x in a), sum(y * y for y in b), sum(x * y for x, y in zip(a, b))
    det = aa * bb - ab * ab
    if det <= 1e-6 * aa * bb:  # (nearly) collinear: every sample had the same mix
        return None
    sa, sb = sum(a), sum(b)
    c_o, c_w = (bb * sa - ab * sb) / det, (aa * sb - ab * sa) / det
    if c_o < 0:  # no overhead to see: the work part alone
        c_o, c_w = 0.0, sb / bb
    return (c_o, c_w) if c_w > 0 else None
