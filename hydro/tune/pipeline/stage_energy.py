"""Energy or fill trials, per stage of a pipeline job that registers with the placement service.

With :class:`StageEnergy`, :meth:`PipelineJob.register <hydro.tune.pipeline.job.PipelineJob.register>` measures each
stage's bubbles (seconds per iteration) and profiles its clocks on its own device (Perseus's scan), solves the
time-energy frontier of the job's 1F1B iteration and picks the plan of at most ``slowdown``; the pure policy
(:func:`schedulers.pipeline_energy.decide_stages`) then decides per stage, from those values and the fills'
measured :class:`FillRate`: a stage whose bubbles are worth more to fill trials stays a bubble slot (all-max
clocks), any other is not offered and follows the plan's clocks (set through its device: the frequency controller,
whose default clock is restored after every run). Each decision and its reason is logged and kept by the placement
service (:meth:`~hydro.tune.bubbles.service.PlacementService.stage_decisions`).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from hydro.energy.device import EnergyDevice
from hydro.energy.frequency import DVFSModel, SimulatedDVFSDevice
from hydro.pipeline.schedule import one_f_one_b
from schedulers.pipeline_energy import (
    ByMaxSlowdown,
    FillValue,
    InstructionDAG,
    PipelineProfile,
    ProfileRow,
    StageDecision,
    decide_stages,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FillRate:
    """What fill trials did with a stage's bubbles, measured (see ``PipelineJob.measure_fill``).

    Args:
        member_steps_per_bubble_s: member-steps (a fused step of k members counts k) per bubble second.
        compute_share: the fills' compute seconds per bubble second, in [0, 1].
    """

    member_steps_per_bubble_s: float
    compute_share: float

    def __post_init__(self) -> None:
        if not (self.member_steps_per_bubble_s >= 0 and 0 <= self.compute_share <= 1):
            raise ValueError(f"pipeline_job: FillRate({self.member_steps_per_bubble_s}, {self.compute_share}) needs "
                             f"member-steps per bubble second >= 0 and a compute share in [0, 1].")


@dataclass(frozen=True)
class StageEnergy:
    """Energy on for a job's stages: each stage's clocks change on ``device(stage)`` (made in the stage's own
    process: e.g. its NVML GPU, or a simulated DVFS device); ``fill``: the fills' measured rate;
    ``joules_per_member_step``: what one member-step is worth (what it costs on a dedicated device, J);
    ``slowdown``: the plan's largest iteration slowdown over all-max clocks (0: only free savings)."""

    device: Callable[[int], EnergyDevice]
    fill: FillRate
    joules_per_member_step: float
    slowdown: float = 0.0
    repeats: int = 3  # runs per profiled clock


@dataclass(frozen=True)
class SimulatedDevices:
    """``StageEnergy.device`` for CPU-only machines: stage ``s`` gets a simulated DVFS device ``sim-gpu<s>`` of
    ``model`` on the wall clock (planned clocks really slow its instructions)."""

    model: DVFSModel

    def __call__(self, stage: int) -> SimulatedDVFSDevice:
        return SimulatedDVFSDevice(f"sim-gpu{stage}", self.model)


@dataclass(frozen=True)
class MeasuredStages:
    """What a job's stages measured (``PipelineJob.measure_stages``): per stage its profile (Perseus's rows, and
    its power while blocking, W), its bubble seconds per iteration and its bubble fraction of wall time."""

    profiles: tuple[tuple[list[ProfileRow], float], ...]
    bubble_s: tuple[float, ...]
    bubble_fractions: tuple[float, ...]


def decide(measured: MeasuredStages, microbatches: int, energy: StageEnergy) -> list[StageDecision]:
    """Each stage's decision from what it measured and ``energy`` (the fills' rate and worth, the slowdown)."""
    profiles, bubble_s = measured.profiles, measured.bubble_s
    profile = PipelineProfile(tuple(r for rows, _ in profiles for r in rows),
                              sum(p2p for _, p2p in profiles) / len(profiles))
    dag = InstructionDAG(one_f_one_b(len(profiles), microbatches))
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    fastest = min(r.time_s for r in profile.rows)
    from schedulers.pipeline_energy.frontier import lowtime_frontier  # here: lowtime's import is slow

    frontier = lowtime_frontier(dag, profile, min(fastest / 10, baseline.time_s / 1000))
    plan = ByMaxSlowdown(energy.slowdown).choose(frontier, baseline)
    top = [max(rows, key=lambda r: r.frequency_mhz) for rows, _ in profiles]
    fill_power_w = sum(r.energy_j for r in top) / sum(r.time_s for r in top)  # computing at all-max clocks
    fill = FillValue(energy.fill.member_steps_per_bubble_s, energy.fill.compute_share, energy.joules_per_member_step,
                     fill_power_w)
    decisions = decide_stages(dag, profile, plan, bubble_s, fill)
    for decision in decisions:
        logger.info("hydro: %s", decision.reason)
    return decisions


def record(decision: StageDecision) -> dict:
    """``decision`` as the placement service keeps it (plain values)."""
    return {"stage": decision.stage, "use": decision.use.value, "bubble_s": decision.bubble_s,
            "energy_saved_j": decision.energy_saved_j, "trials_value_j": decision.trials_value_j,
            "frequencies_mhz": list(decision.frequencies_mhz), "reason": decision.reason}
