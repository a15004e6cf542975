"""Shared test helpers: profiles from tables, and a solved frontier with its all-max baseline."""
from __future__ import annotations

from hydro.pipeline.schedule import one_f_one_b
from schedulers.pipeline_energy import (
    ByMaxSlowdown,
    Instruction,
    InstructionDAG,
    PipelineProfile,
    PlanPoint,
    ProfileRow,
    lowtime_frontier,
)


def profile_of(table: dict[tuple[int, Instruction], list[tuple[int, float, float]]], p2p_w: float) -> PipelineProfile:
    """``table[(stage, instruction)]``: (MHz, s, J) rows."""
    return PipelineProfile(tuple(ProfileRow(s, i, f, t, e) for (s, i), rows in table.items() for f, t, e in rows),
                           p2p_w)


def solve(profile: PipelineProfile, microbatches: int) -> tuple[InstructionDAG, list[PlanPoint], PlanPoint, PlanPoint]:
    """1F1B DAG, lowtime frontier (1 ms units), all-max baseline and the zero-slowdown plan."""
    dag = InstructionDAG(one_f_one_b(profile.num_stages, microbatches))
    frontier = lowtime_frontier(dag, profile, unit_s=0.001)
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    return dag, frontier, baseline, ByMaxSlowdown(0.0).choose(frontier, baseline)


def two_stage_profile() -> PipelineProfile:
    """Stage 1 is the bottleneck; stage 0 has slack and slows cheaply."""
    rows = []
    for stage, scale in ((0, 1.0), (1, 2.0)):
        for kind, base in ((Instruction.FORWARD, 0.010), (Instruction.BACKWARD, 0.020)):
            for mhz, slow, energy in ((1800, 1.0, 3.0), (1500, 1.1, 2.6), (1200, 1.2, 2.4)):
                rows.append(ProfileRow(stage, kind, mhz, round(base * scale * slow, 6), energy * scale * base / 0.01))
    return PipelineProfile(tuple(rows), p2p_power_w=50.0)
