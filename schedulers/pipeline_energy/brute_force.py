"""The exact frontier of a small pipeline by trying every frequency plan (to check the solver)."""
from __future__ import annotations

import itertools
import math

from schedulers.pipeline_energy.dag import InstructionDAG, PlanPoint, pareto_front
from schedulers.pipeline_energy.profile import PipelineProfile


def brute_force_frontier(dag: InstructionDAG, profile: PipelineProfile, max_plans: int = 200_000) -> list[PlanPoint]:
    """Evaluate all plans (every instruction at every profiled frequency); the Pareto-optimal ones, fastest first."""
    keys = dag.instructions
    choices = [[r.frequency_mhz for r in profile.options(k.stage, k.instruction)] for k in keys]
    count = math.prod(len(c) for c in choices)
    if count > max_plans:
        raise ValueError(f"pipeline_energy: brute force would evaluate {count} plans (> max_plans={max_plans}); "
                         f"use fewer stages, microbatches or frequencies, or lowtime_frontier.")
    return pareto_front([dag.evaluate(dict(zip(keys, plan)), profile) for plan in itertools.product(*choices)])
