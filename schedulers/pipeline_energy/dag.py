"""The DAG of one pipeline iteration: a node per instruction (stage, forward/backward, microbatch).

Edges: each stage runs its instructions in schedule order (e.g. 1F1B); the forward of microbatch i on stage
s needs stage s-1's forward of i; its backward needs stage s+1's backward of i (the last stage's backward
follows its own forward). The iteration time is the longest path; a frequency plan gives every node a
frequency, hence a (time, energy) from the profile. Energy counts blocking: every stage draws the P2P
power whenever it is not computing, until the iteration's end.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import networkx as nx

from schedulers.pipeline_energy.profile import Instruction, PipelineProfile, ProfileError

_KINDS = {"F": Instruction.FORWARD, "B": Instruction.BACKWARD}


class ScheduledOp(Protocol):
    """One entry of a stage's schedule (``hydro.pipeline.schedule.Op`` fits): kind ``"F"``/``"B"``."""

    kind: str
    microbatch: int


@dataclass(frozen=True, order=True)
class InstructionKey:
    stage: int
    instruction: Instruction
    microbatch: int

    def __str__(self) -> str:
        return f"S{self.stage}{self.instruction.value[0].upper()}{self.microbatch}"


FrequencyPlan = Mapping[InstructionKey, int]  # MHz per instruction


@dataclass(frozen=True)
class PlanPoint:
    """A frequency plan and its iteration time (s) and energy (J) evaluated on the profile;
    ``stage_energy_j[s]``: stage s's compute plus blocking energy."""

    time_s: float
    energy_j: float
    frequencies: FrequencyPlan
    stage_energy_j: tuple[float, ...]


class InstructionDAG:
    """The iteration DAG of ``schedule`` (per stage, its instructions in execution order)."""

    def __init__(self, schedule: Sequence[Sequence[ScheduledOp]]) -> None:
        if not schedule or not all(schedule):
            raise ValueError("pipeline_energy: the schedule needs at least one stage with one instruction.")
        self.num_stages = len(schedule)
        self.order: list[list[InstructionKey]] = []
        graph = nx.DiGraph()
        for stage, ops in enumerate(schedule):
            keys = []
            for op in ops:
                if op.kind not in _KINDS:
                    raise ValueError(f"pipeline_energy: schedule op kind {op.kind!r}; expected 'F' or 'B'.")
                keys.append(InstructionKey(stage, _KINDS[op.kind], op.microbatch))
            graph.add_nodes_from(keys)
            graph.add_edges_from(zip(keys[:-1], keys[1:]))
            self.order.append(keys)
        for key in list(graph.nodes):
            for dependency in self._dependencies(key):
                if dependency not in graph:
                    raise ValueError(f"pipeline_energy: {key} depends on {dependency}, which the schedule lacks.")
                graph.add_edge(dependency, key)
        if not nx.is_directed_acyclic_graph(graph):
            raise ValueError("pipeline_energy: the schedule deadlocks (its dependency graph has a cycle).")
        self.graph = graph
        self._topological = list(nx.topological_sort(graph))

    def _dependencies(self, key: InstructionKey) -> list[InstructionKey]:
        forward, backward = Instruction.FORWARD, Instruction.BACKWARD
        if key.instruction is forward:
            return [InstructionKey(key.stage - 1, forward, key.microbatch)] if key.stage > 0 else []
        if key.stage < self.num_stages - 1:
            return [InstructionKey(key.stage + 1, backward, key.microbatch)]
        return [InstructionKey(key.stage, forward, key.microbatch)]

    @property
    def instructions(self) -> list[InstructionKey]:
        return list(self._topological)

    def finish_times(self, durations_s: Mapping[InstructionKey, float]) -> dict[InstructionKey, float]:
        """Earliest finish (s) of every instruction, the iteration starting at 0."""
        finish: dict[InstructionKey, float] = {}
        for key in self._topological:
            start = max((finish[p] for p in self.graph.predecessors(key)), default=0.0)
            finish[key] = start + durations_s[key]
        return finish

    def slack_s(self, durations_s: Mapping[InstructionKey, float]) -> dict[InstructionKey, float]:
        """How much later (s) each instruction could finish without lengthening the iteration (0: critical)."""
        finish = self.finish_times(durations_s)
        end = max(finish.values())
        latest: dict[InstructionKey, float] = {}
        for key in reversed(self._topological):
            latest[key] = min((latest[s] - durations_s[s] for s in self.graph.successors(key)), default=end)
        return {key: latest[key] - finish[key] for key in finish}

    def iteration_time_s(self, durations_s: Mapping[InstructionKey, float]) -> float:
        """The critical path length (s)."""
        return max(self.finish_times(durations_s).values())

    def evaluate(self, frequencies: FrequencyPlan, profile: PipelineProfile) -> PlanPoint:
        """Iteration time and energy of ``frequencies`` (MHz per instruction) from the profile's rows."""
        if profile.num_stages != self.num_stages:
            raise ProfileError(f"pipeline_energy: the profile has {profile.num_stages} stages, the schedule "
                               f"{self.num_stages}.")
        rows = {k: profile.at(k.stage, k.instruction, frequencies[k]) for k in self._topological}
        time_s = self.iteration_time_s({k: r.time_s for k, r in rows.items()})
        stage_energy = []
        for keys in self.order:
            busy_s = sum(rows[k].time_s for k in keys)
            stage_energy.append(sum(rows[k].energy_j for k in keys) + profile.p2p_power_w * (time_s - busy_s))
        return PlanPoint(time_s, sum(stage_energy), dict(frequencies), tuple(stage_energy))

    def max_frequency_plan(self, profile: PipelineProfile) -> dict[InstructionKey, int]:
        """Every instruction at its stage's highest profiled frequency (what runs without Perseus)."""
        return {k: profile.fastest(k.stage, k.instruction).frequency_mhz for k in self._topological}

    def stage_plans(self, frequencies: FrequencyPlan) -> list[list[int]]:
        """Per stage, the frequency (MHz) of each instruction in execution order (what a stage applies)."""
        return [[frequencies[k] for k in keys] for keys in self.order]


def pareto_front(points: Sequence[PlanPoint], tolerance: float = 1e-9) -> list[PlanPoint]:
    """The points no other point beats in both time and energy, fastest first; times within a relative
    ``tolerance`` count as equal (sums of float durations differ in the last bits)."""
    front: list[PlanPoint] = []
    for point in sorted(points, key=lambda p: (p.time_s, p.energy_j)):
        if front and point.time_s <= front[-1].time_s * (1 + tolerance):
            if point.energy_j < front[-1].energy_j:
                front[-1] = point
        elif not front or point.energy_j < front[-1].energy_j * (1 - tolerance):
            front.append(point)
    return front
