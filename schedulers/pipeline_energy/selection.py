"""Choosing one plan from the frontier: by a deadline, or by a maximum slowdown over the all-max-frequency plan."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schedulers.pipeline_energy.dag import PlanPoint


class PlanChoice(ABC):
    """Picks a frontier point; ``baseline`` is the all-max-frequency plan (what runs without Perseus)."""

    @abstractmethod
    def choose(self, frontier: Sequence[PlanPoint], baseline: PlanPoint) -> PlanPoint:
        """The least-energy point that meets the choice's time bound."""


def _least_energy_within(frontier: Sequence[PlanPoint], limit_s: float, what: str) -> PlanPoint:
    if not frontier:
        raise ValueError("pipeline_energy: the frontier is empty; solve it first.")
    meeting = [p for p in frontier if p.time_s <= limit_s * (1 + 1e-12)]
    if not meeting:
        fastest = min(p.time_s for p in frontier)
        raise ValueError(f"pipeline_energy: no plan meets {what} ({limit_s:.6g} s per iteration); the fastest plan "
                         f"takes {fastest:.6g} s. Relax the bound.")
    return min(meeting, key=lambda p: (p.energy_j, p.time_s))


@dataclass(frozen=True)
class ByDeadline(PlanChoice):
    """The least-energy plan whose iteration time is at most ``deadline_s``."""

    deadline_s: float

    def choose(self, frontier: Sequence[PlanPoint], baseline: PlanPoint) -> PlanPoint:
        return _least_energy_within(frontier, self.deadline_s, f"the deadline {self.deadline_s} s")


@dataclass(frozen=True)
class ByMaxSlowdown(PlanChoice):
    """The least-energy plan at most ``slowdown`` (0.05 = 5%) slower than the baseline; 0 gives the
    zero-slowdown plan, whose saving is free."""

    slowdown: float = 0.0

    def __post_init__(self) -> None:
        if self.slowdown < 0:
            raise ValueError(f"pipeline_energy: slowdown {self.slowdown} is negative; use 0 for no slowdown.")

    def choose(self, frontier: Sequence[PlanPoint], baseline: PlanPoint) -> PlanPoint:
        limit = baseline.time_s * (1 + self.slowdown)
        return _least_energy_within(frontier, limit, f"a {self.slowdown:.1%} slowdown")
