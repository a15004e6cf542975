"""Per stage, spend the slack on energy (Perseus: slow its non-critical instructions) or on tuning trials
(the bubble squeezer: run fused trials in its bubbles), whichever is worth more.

Both sides are per iteration in joules. Energy: the stage's saving under the chosen frontier plan against
the all-max-clock plan. Trials: the squeezer turns a share of the stage's idle time (its bubbles at max
clocks) into trial compute; that work is valued at ``joules_per_trial_s`` (by default what the same work
costs on a dedicated device at max clock), minus the extra energy the fill draws over blocking. A stage
that takes trials runs at max clocks (its bubbles stay whole), which never lengthens the iteration.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from schedulers.pipeline_energy.dag import InstructionDAG, PlanPoint
from schedulers.pipeline_energy.profile import PipelineProfile


class SlackUse(enum.Enum):
    ENERGY = "energy"
    TRIALS = "trials"


@dataclass(frozen=True)
class StageSlack:
    """One stage's slack per iteration and both ways to use it (s and J per iteration)."""

    stage: int
    slack_s: float  # idle time at max clocks (bubbles)
    energy_saved_j: float  # the frontier plan's saving on this stage
    trial_work_s: float  # trial compute the squeezer fits into the slack
    trial_energy_j: float  # extra energy that compute draws over blocking

    @property
    def break_even_w(self) -> float:
        """The value of one second of trial work (J/s) above which trials beat the energy saving here."""
        if self.trial_work_s <= 0:
            return float("inf")
        return (self.energy_saved_j + self.trial_energy_j) / self.trial_work_s


class SlackPolicy(ABC):
    """Decides how one stage uses its slack."""

    @abstractmethod
    def choose(self, slack: StageSlack) -> SlackUse:
        """Energy or trials for this stage."""


@dataclass(frozen=True)
class EnergyOrTrials(SlackPolicy):
    """Trials when their value (``joules_per_trial_s`` per second of trial work, net of the energy the fill
    draws) exceeds the energy the plan saves on the stage; energy otherwise."""

    joules_per_trial_s: float

    def __post_init__(self) -> None:
        if self.joules_per_trial_s < 0:
            raise ValueError(f"pipeline_energy: joules_per_trial_s={self.joules_per_trial_s} is negative; give what "
                             f"one second of trial work is worth in J (e.g. a dedicated device's power).")

    def trials_value_j(self, slack: StageSlack) -> float:
        return slack.trial_work_s * self.joules_per_trial_s - slack.trial_energy_j

    def choose(self, slack: StageSlack) -> SlackUse:
        return SlackUse.TRIALS if self.trials_value_j(slack) > slack.energy_saved_j else SlackUse.ENERGY


def stage_slack(dag: InstructionDAG, profile: PipelineProfile, plan: PlanPoint, *, fill_share: float,
                fill_power_w: float) -> list[StageSlack]:
    """Both sides per stage: ``plan``'s saving against all-max clocks, and the trial work the squeezer fits
    (``fill_share`` of the idle time, drawing ``fill_power_w`` while it runs)."""
    if not 0 <= fill_share <= 1:
        raise ValueError(f"pipeline_energy: fill_share={fill_share} must be in [0, 1] (the share of bubble time the "
                         f"bubble squeezer turns into trial compute).")
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    durations = {k: profile.at(k.stage, k.instruction, f).time_s for k, f in baseline.frequencies.items()}
    slacks = []
    for stage, keys in enumerate(dag.order):
        idle = baseline.time_s - sum(durations[k] for k in keys)
        work = fill_share * idle
        slacks.append(StageSlack(stage, idle, baseline.stage_energy_j[stage] - plan.stage_energy_j[stage], work,
                                 work * (fill_power_w - profile.p2p_power_w)))
    return slacks


def apply_choices(dag: InstructionDAG, profile: PipelineProfile, plan: PlanPoint,
                  choices: Sequence[SlackUse]) -> PlanPoint:
    """``plan`` with the stages that chose trials back at max clocks (evaluated without the fill's energy)."""
    fastest = dag.max_frequency_plan(profile)
    frequencies = {k: fastest[k] if choices[k.stage] is SlackUse.TRIALS else f for k, f in plan.frequencies.items()}
    return dag.evaluate(frequencies, profile)
