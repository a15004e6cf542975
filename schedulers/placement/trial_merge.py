"""When the survivors of several fused trials of one group continue as one trial (plain Python).

Trials of one fused group (same architecture, scale and stage: one group key) whose members were stopped early
hold few survivors each; when one trial could hold all of them (the group's fusion count), they merge: each hands
over its exact state at one epoch boundary and a new trial continues the union. A merge frees GPU slots (its
trials less one). It is made only when the merged trial is predicted to finish no later than the latest of
``horizon_s`` (the stage's end: the latest predicted finish of the running trials) and its trials' own predicted
finishes, times ``1 + slack`` (:class:`MergeRule`).

The epoch boundary a merge happens at is the first one every trial of it has yet to check: a trial checks
whether to hand over after each report is processed, so the trial whose report is being processed checks at its
reported epoch, the others at the epoch after their last report. A merge needs that boundary before the last
epoch.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

from schedulers.placement.predicted_finish import PlacedTrial, PredictedFinish


@dataclass(frozen=True)
class MergeCandidate:
    """A running trial that may merge: ``key``: its fused group; ``members``: its live members; ``epoch``: its
    last reported epoch; ``reporting``: its report is the one being processed (it has not checked at ``epoch``
    yet); ``finish_s``: its predicted seconds to its end, alone."""

    trial: str
    key: Hashable
    members: int
    epoch: int
    reporting: bool
    finish_s: float

    @property
    def next_check(self) -> int:
        """The first epoch boundary at which this trial has yet to check whether to hand over."""
        return self.epoch if self.reporting else self.epoch + 1


@dataclass(frozen=True)
class Merge:
    """Trials ``trials`` hand over at epoch boundary ``epoch`` and continue as one trial of ``members`` members,
    predicted to finish in ``finish_s`` seconds (``alone_s``: the latest of theirs alone, or the stage's end)."""

    trials: tuple[str, ...]
    epoch: int
    members: int
    finish_s: float
    alone_s: float


@dataclass(frozen=True)
class MergeRule:
    """Which trials merge. ``slack``: how much later than the latest of the stage's end and its trials' own
    finishes a merged trial may be predicted to finish, as a fraction (0: strictly no later). The step-time
    model's step grows linearly with a trial's members, so a merged trial on the same GPU type is always
    predicted a little later, by its added members' share of a step (small for surrogates, whose steps are
    dominated by per-call overheads); the default 5% lets such merges happen."""

    slack: float = 0.05

    def __post_init__(self) -> None:
        if not self.slack >= 0:
            raise ValueError(f"MergeRule: slack must be >= 0 (a fraction of the predicted finish), got {self.slack!r}")

    def plan(self, candidates: Sequence[MergeCandidate], limit: Callable[[Hashable], int], epochs: int,
             merged_finish_s: Callable[[Sequence[MergeCandidate], int, int], float],
             horizon_s: float = 0.0) -> list[Merge]:
        """The merges to make among ``candidates``: per group, trials taken fewest members first while their
        members fit ``limit(key)`` (the group's most members in one trial), the last one dropped until the merge
        pays. ``merged_finish_s(trials, members, epoch)``: the predicted finish of ``trials`` merged at ``epoch``
        with ``members`` members; ``epochs``: the epochs a trial trains."""
        groups: dict[Hashable, list[MergeCandidate]] = {}
        for candidate in candidates:
            if candidate.members >= 1:
                groups.setdefault(candidate.key, []).append(candidate)
        merges = []
        for key, group in groups.items():
            pending = sorted(group, key=lambda c: (c.members, c.trial))
            while len(pending) >= 2:
                chosen = []
                for candidate in pending:
                    if sum(c.members for c in chosen) + candidate.members <= limit(key):
                        chosen.append(candidate)
                merge = self._paying(chosen, epochs, merged_finish_s, horizon_s)
                if merge is None:
                    break
                merges.append(merge)
                pending = [c for c in pending if c.trial not in merge.trials]
        return merges

    def _paying(self, chosen: list[MergeCandidate], epochs: int,
                merged_finish_s: Callable[[Sequence[MergeCandidate], int, int], float],
                horizon_s: float) -> Merge | None:
        """The largest prefix (of two or more) of ``chosen`` whose merge pays, or ``None``."""
        while len(chosen) >= 2:
            epoch = max(c.next_check for c in chosen)
            members = sum(c.members for c in chosen)
            if epoch < epochs:
                finish = merged_finish_s(chosen, members, epoch)
                alone = max(horizon_s, *(c.finish_s for c in chosen))
                if finish <= alone * (1 + self.slack):
                    return Merge(tuple(c.trial for c in chosen), epoch, members, finish, alone)
            chosen = chosen[:-1]
        return None


def finish_alone_s(finish: PredictedFinish, trial: str, members: int | None = None) -> float:
    """Predicted seconds until placed trial ``trial`` ends alone: its steps left at its step time on its type with
    ``members`` members (default: the members it was last counted with)."""
    placed = finish.trials[trial]
    if members is not None:
        placed = dataclasses.replace(placed, members=members)
    return max(0, placed.steps - placed.done) * finish.step_seconds(placed.gpu, placed)


def merged_finish_s(finish: PredictedFinish, trials: Sequence[str], members: int, epoch: int, epochs: int) -> float:
    """Predicted seconds until placed ``trials`` merged at epoch boundary ``epoch`` with ``members`` members end:
    the last of them reaches ``epoch`` (each at its own step time), then the merged trial trains the epochs left on
    the fastest of their types."""
    placed = [finish.trials[t] for t in trials]
    per_epoch = placed[0].steps // epochs
    reach = max(max(0, epoch * per_epoch - p.done) * finish.step_seconds(p.gpu, p) for p in placed)
    merged = PlacedTrial("", placed[0].work_per_member, placed[0].overhead_s, members, (epochs - epoch) * per_epoch)
    return reach + min(merged.steps * finish.step_seconds(p.gpu, merged) for p in placed)


def park_members(trials: dict[str, list[str]], finished: Mapping[str, object], source: str, merged: str) -> list[str]:
    """Move the unfinished members of trial ``source`` (it handed them over) to the entry ``merged`` of
    ``trials`` (trial id -> member ids: a member ledger's), which the merged trial renames to its id when it
    starts; returns the members moved."""
    moving = [m for m in trials.get(source, []) if m not in finished]
    trials[source] = [m for m in trials.get(source, []) if m in finished]
    trials.setdefault(merged, []).extend(moving)
    return moving
