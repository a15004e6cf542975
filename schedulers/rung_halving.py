"""Successive halving over epochs inside one trial of a width-ladder rung (plain Python).

A rung only has to rank its configurations well enough to choose the few that the next rung (or the full-size
target) trains, so it need not train all of them for every epoch: at each *milestone* epoch the trial ranks its
live members by their validation score and keeps the best ones; the last ``survivors`` train to the end. The rule
is synchronous and local to the trial (it sees all its members at each milestone), so it is exact: a trial
retried from a checkpoint makes the same decisions from the same scores, and no service is asked.

Milestones are ``epochs // eta²`` and ``epochs // eta`` (those >= 1 and below ``epochs``); at the ``k``-th
(``k`` = 1, 2) the trial keeps ``max(survivors, ceil(members / eta^k))``, so the members are cut by ``eta`` at each
milestone, never below the survivors. A rung's trial evaluates its members only at the milestones and its last
epoch. Members that stopped at a milestone rank below those that went on (``Score.reached`` in
:mod:`schedulers.transfer`): they were last together at that milestone, where the ones that went on were ahead.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

MILESTONES = 2  # at most this many cuts in a rung


@dataclass(frozen=True)
class RungHalving:
    """Which members of one rung trial go on: after epoch ``milestones[i]`` (ascending) the best ``keep[i]`` of
    the live members do (``keep`` non-increasing, each >= 1)."""

    milestones: tuple[int, ...]
    keep: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.milestones) != len(self.keep) or list(self.milestones) != sorted(set(self.milestones)) \
                or any(k < 1 for k in self.keep) or list(self.keep) != sorted(self.keep, reverse=True):
            raise ValueError(f"RungHalving: ascending distinct milestones with as many non-increasing keep counts "
                             f">= 1 are needed, got milestones={self.milestones}, keep={self.keep}")

    @classmethod
    def plan(cls, members: int, survivors: int, epochs: int, eta: int) -> RungHalving | None:
        """The halving of a trial of ``members`` members of which ``survivors`` train all ``epochs``, cutting by
        ``eta``; ``None`` when it would stop nobody (too few members or epochs)."""
        survivors = max(1, survivors)
        at = milestones(epochs, eta)
        keep = [max(survivors, math.ceil(members / eta ** (i + 1))) for i in range(len(at))]
        pairs = [(m, k) for m, k in zip(at, keep) if k < members]
        if not pairs:
            return None
        return cls(tuple(m for m, _ in pairs), tuple(k for _, k in pairs))

    def evaluates(self, epoch: int, epochs: int) -> bool:
        """Whether the members' validation score is needed after ``epoch`` (1-based) of ``epochs``."""
        return epoch in self.milestones or epoch == epochs

    def stops(self, epoch: int, scores: Mapping[str, float]) -> set[str]:
        """The live members that stop after ``epoch``, given every live member's score then (higher is better,
        ``-inf`` the worst; ties keep the order of ``scores``): all but the best ``keep`` at a milestone."""
        if epoch not in self.milestones:
            return set()
        keep = self.keep[self.milestones.index(epoch)]
        ranked = sorted(scores, key=lambda m: -scores[m])
        return set(ranked[keep:])

    def member_epochs(self, members: int, epochs: int) -> int:
        """Member-epochs a trial of ``members`` trains: every member up to the first milestone, then the kept ones."""
        total, start, live = 0, 0, members
        for milestone, keep in zip(self.milestones, self.keep):
            total += live * (milestone - start)
            start, live = milestone, min(live, keep)
        return total + live * (epochs - start)


def milestones(epochs: int, eta: int) -> tuple[int, ...]:
    """The milestone epochs of a rung whose members train ``epochs``, cutting by ``eta``, ascending: ``epochs //
    eta²`` and ``epochs // eta``, those >= 1 and below ``epochs``."""
    return tuple(m for m in sorted({epochs // eta ** k for k in range(1, MILESTONES + 1)} - {0}) if m < epochs)


def fraction(members: int, survivors: int, epochs: int, eta: int) -> float:
    """The share of ``members`` × ``epochs`` that a rung trial halving down to ``survivors`` trains (1: none stop)."""
    halving = RungHalving.plan(members, survivors, epochs, eta)
    return 1.0 if halving is None else halving.member_epochs(members, epochs) / (members * epochs)

