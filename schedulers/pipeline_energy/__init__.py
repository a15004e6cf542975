"""Perseus in plain Python: per-instruction GPU frequency plans of a pipeline iteration and their
time-energy frontier (``lowtime``), plan choice by deadline or slowdown, and the slack policy that
spends a stage's slack on energy or on fused tuning trials."""
from __future__ import annotations

from schedulers.pipeline_energy.brute_force import brute_force_frontier
from schedulers.pipeline_energy.dag import InstructionDAG, InstructionKey, PlanPoint, pareto_front
from schedulers.pipeline_energy.profile import Instruction, PipelineProfile, ProfileError, ProfileRow
from schedulers.pipeline_energy.scan import DownwardScan
from schedulers.pipeline_energy.selection import ByDeadline, ByMaxSlowdown, PlanChoice
from schedulers.pipeline_energy.slack import (
    EnergyOrTrials,
    SlackPolicy,
    SlackUse,
    StageSlack,
    apply_choices,
    stage_slack,
)
from schedulers.pipeline_energy.stage_choice import FillValue, StageDecision, decide_stages

__all__ = [
    "ByDeadline",
    "ByMaxSlowdown",
    "DownwardScan",
    "EnergyOrTrials",
    "FillValue",
    "Instruction",
    "InstructionDAG",
    "InstructionKey",
    "PipelineProfile",
    "PlanChoice",
    "PlanPoint",
    "ProfileError",
    "ProfileRow",
    "SlackPolicy",
    "SlackUse",
    "StageDecision",
    "StageSlack",
    "apply_choices",
    "brute_force_frontier",
    "decide_stages",
    "lowtime_frontier",
    "pareto_front",
    "stage_slack",
]


def __getattr__(name: str):
    """``lowtime_frontier`` on first use: lowtime (and the matplotlib, networkx and scipy it imports) costs about a
    second of a process's start, which a process that never plans frequencies need not pay."""
    if name == "lowtime_frontier":
        from schedulers.pipeline_energy.frontier import lowtime_frontier

        return lowtime_frontier
    raise AttributeError(f"module 'schedulers.pipeline_energy' has no attribute {name!r}")
