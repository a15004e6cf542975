"""Every Pareto-optimal frequency plan of a pipeline iteration, with ``lowtime`` (Phillips-Dessouky).

lowtime works on integer durations, so times are given to it in units of ``unit_s`` (rounded; real times
come back when plans are evaluated on the profile). An instruction's cost is its energy minus the P2P
power times its time: the iteration's energy is the sum of those costs plus stages x P2P power x iteration
time, so at a fixed iteration time the solver minimises energy. The cost model is the lower convex hull of
the profiled (duration, cost) points, interpolated linearly (the solver needs convex costs; lowtime's
default exponential fit can miss points). Each plan lowtime yields is re-evaluated on the profile's rows;
its fastest plan is also sped up to the all-max-clock time where rounding made it slower
(:func:`~schedulers.pipeline_energy.rounding.speed_up_to`); the frontier keeps the Pareto-optimal plans,
fastest first.
"""
from __future__ import annotations

import logging

import networkx as nx
import numpy as np
from lowtime.cost_model import CostModel
from lowtime.operation import (
    CandidateExecutionOptions,
    DummyOperation,
    ExecutionOption,
    Operation,
    OperationSpec,
)
from lowtime.solver import PhillipsDessouky

from schedulers.pipeline_energy.dag import InstructionDAG, PlanPoint, pareto_front
from schedulers.pipeline_energy.profile import Instruction, PipelineProfile
from schedulers.pipeline_energy.rounding import speed_up_to

logger = logging.getLogger(__name__)


class ConvexHullCost(CostModel):
    """Piecewise-linear cost through the lower convex hull of the options' (quantised time, cost) points."""

    def __init__(self, options: CandidateExecutionOptions) -> None:
        points = sorted((o.quant_time, o.cost) for o in options.options)
        hull: list[tuple[int, float]] = []
        for point in points:  # Andrew's monotone chain, lower half
            while len(hull) >= 2 and _cross(hull[-2], hull[-1], point) <= 0:
                hull.pop()
            hull.append(point)
        self.times = np.array([t for t, _ in hull], dtype=float)
        self.costs = np.array([c for _, c in hull], dtype=float)

    def __call__(self, quant_time: int) -> float:
        return float(np.interp(quant_time, self.times, self.costs))


def _cross(o: tuple[int, float], a: tuple[int, float], b: tuple[int, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def operation_spec(profile: PipelineProfile, stage: int, instruction: Instruction, unit_s: float) -> OperationSpec:
    """lowtime's spec of one instruction: its Pareto-optimal (units, cost J) options, knob = MHz."""
    options = [ExecutionOption(real_time=float(round(r.time_s / unit_s)), unit_time=1.0,
                               cost=r.energy_j - profile.p2p_power_w * r.time_s, knob=r.frequency_mhz)
               for r in profile.options(stage, instruction)]
    candidates = CandidateExecutionOptions(options=options)
    return OperationSpec(options=candidates, cost_model=ConvexHullCost(candidates))


def lowtime_frontier(dag: InstructionDAG, profile: PipelineProfile, unit_s: float) -> list[PlanPoint]:
    """The time-energy frontier of ``dag``'s frequency plans (fastest first), solved with lowtime."""
    fastest = min(profile.fastest(s, i).time_s for s in range(profile.num_stages) for i in Instruction)
    if not 0 < unit_s <= fastest / 10 * (1 + 1e-9):
        raise ValueError(f"pipeline_energy: unit_s={unit_s} s must be positive and at most a tenth of the fastest "
                         f"instruction ({fastest:.3g} s), or rounding decides the plan; use a smaller unit.")
    specs = {(s, i): operation_spec(profile, s, i, unit_s) for s in range(profile.num_stages) for i in Instruction}
    graph = nx.DiGraph()
    keys = dag.instructions
    ids = {key: n for n, key in enumerate(keys)}
    operations = {key: Operation(spec=specs[(key.stage, key.instruction)]) for key in keys}
    for key, node in ids.items():
        graph.add_node(node, op=operations[key])
    graph.add_edges_from((ids[a], ids[b]) for a, b in dag.graph.edges)
    source, sink = len(keys), len(keys) + 1
    graph.add_node(source, op=DummyOperation())
    graph.add_node(sink, op=DummyOperation())
    graph.add_edges_from((source, ids[k]) for k in keys if dag.graph.in_degree(k) == 0)
    graph.add_edges_from((ids[k], sink) for k in keys if dag.graph.out_degree(k) == 0)
    graph.graph["source_node"], graph.graph["sink_node"] = source, sink

    def current() -> PlanPoint:
        return dag.evaluate({key: op.assigned_knob for key, op in operations.items()}, profile)

    solver = PhillipsDessouky(graph)
    points = [current()]  # every instruction at its slowest Pareto-optimal frequency: the solver's start
    for result in solver.run():
        points.append(current())
        logger.debug("lowtime iteration %d: %d units, modelled cost %.3f J", result.iteration, result.quant_time,
                     result.cost)
    all_max = dag.evaluate(dag.max_frequency_plan(profile), profile)
    points.append(speed_up_to(dag, profile, min(points, key=lambda p: p.time_s), all_max.time_s))
    return pareto_front(points)
