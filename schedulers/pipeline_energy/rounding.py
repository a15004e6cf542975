"""Undo lowtime's rounding where it matters: at the fast end of the frontier.

lowtime plans in integer time units, so a plan's real iteration time can exceed its planned time by the
rounding of the instructions along a path; its fastest plan can then be a little slower than running
every instruction at max clock, and "zero slowdown" would not be met. ``speed_up_to`` raises the clock
of critical instructions, cheapest extra energy per second saved first, until the plan meets the time.
"""
from __future__ import annotations

from schedulers.pipeline_energy.dag import InstructionDAG, PlanPoint
from schedulers.pipeline_energy.profile import PipelineProfile, ProfileRow


def speed_up_to(dag: InstructionDAG, profile: PipelineProfile, point: PlanPoint, limit_s: float) -> PlanPoint:
    """``point`` with critical instructions sped up until its iteration time is at most ``limit_s``
    (at worst every critical instruction at max clock)."""
    frequencies = dict(point.frequencies)
    while True:
        rows = {k: profile.at(k.stage, k.instruction, f) for k, f in frequencies.items()}
        current = dag.evaluate(frequencies, profile)
        if current.time_s <= limit_s * (1 + 1e-12):
            return current
        slack = dag.slack_s({k: r.time_s for k, r in rows.items()})
        faster = {k: _next_faster(profile, rows[k]) for k, s in slack.items() if s <= 1e-12 * current.time_s}
        faster = {k: r for k, r in faster.items() if r is not None}
        if not faster:
            return current  # every critical instruction already at max clock: limit_s is below the minimum
        chosen = min(faster, key=lambda k: _price(rows[k], faster[k]))
        frequencies[chosen] = faster[chosen].frequency_mhz


def _next_faster(profile: PipelineProfile, row: ProfileRow) -> ProfileRow | None:
    higher = [r for r in profile.options(row.stage, row.instruction) if r.frequency_mhz > row.frequency_mhz]
    return higher[-1] if higher else None


def _price(now: ProfileRow, faster: ProfileRow) -> float:
    """Extra energy per second saved (J/s); a step that saves no time is the last resort."""
    saved = now.time_s - faster.time_s
    return (faster.energy_j - now.energy_j) / saved if saved > 0 else float("inf")
