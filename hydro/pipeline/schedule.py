"""1F1B pipeline schedule and its timeline: which operations each stage runs, and where it idles.

Plain Python. ``one_f_one_b`` gives each stage's operation order; ``simulate`` plays the schedule with
per-stage forward/backward times (seconds, e.g. profiled) and returns every operation's start/end and every
bubble (a stage waiting for an activation or a gradient), which the stages use as predicted bubble lengths.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    kind: str  # "F" (forward) or "B" (backward)
    microbatch: int


@dataclass(frozen=True)
class Interval:
    stage: int
    start: float
    end: float
    label: str  # "F3", "B0", or "bubble"

    @property
    def length(self) -> float:
        return self.end - self.start


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Op]]:
    """Per stage, the 1F1B order: warm-up forwards, alternating forward/backward, cool-down backwards."""
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError(f"bubbles: a 1F1B schedule needs at least one stage and one microbatch, got "
                         f"num_stages={num_stages}, num_microbatches={num_microbatches}")
    schedule = []
    for stage in range(num_stages):
        warmup = min(num_stages - stage - 1, num_microbatches)
        ops = [Op("F", i) for i in range(warmup)]
        for i in range(num_microbatches - warmup):
            ops += [Op("F", warmup + i), Op("B", i)]
        ops += [Op("B", i) for i in range(num_microbatches - warmup, num_microbatches)]
        schedule.append(ops)
    return schedule


def simulate(schedule: list[list[Op]], forward_s: list[float], backward_s: list[float],
             comm_s: float = 0.0) -> tuple[list[Interval], list[Interval]]:
    """Play ``schedule`` with per-stage op times; returns (operations, bubbles), times from 0 (seconds).

    A forward of microbatch i on stage s starts when stage s is free and stage s-1 finished F(i) (+comm);
    a backward when stage s+1 finished B(i) (+comm) — the last stage's B(i) follows its own F(i).
    Bubbles are the gaps before an operation, and the tail after a stage's last operation up to the end
    of the iteration (all stages wait for the slowest before the optimizer step).
    """
    stages = len(schedule)
    done: dict[tuple[int, str, int], float] = {}
    position, free = [0] * stages, [0.0] * stages
    ops: list[Interval] = []
    bubbles: list[Interval] = []
    remaining = sum(len(s) for s in schedule)
    while remaining:
        progressed = False
        for s in range(stages):
            if position[s] == len(schedule[s]):
                continue
            op = schedule[s][position[s]]
            dependency = ((s - 1, "F", op.microbatch) if op.kind == "F" and s > 0 else
                          (s + 1, "B", op.microbatch) if op.kind == "B" and s < stages - 1 else None)
            if dependency is not None and dependency not in done:
                continue
            ready = free[s] if dependency is None else max(free[s], done[dependency] + comm_s)
            if ready > free[s]:
                bubbles.append(Interval(s, free[s], ready, "bubble"))
            end = ready + (forward_s[s] if op.kind == "F" else backward_s[s])
            ops.append(Interval(s, ready, end, f"{op.kind}{op.microbatch}"))
            done[(s, op.kind, op.microbatch)] = end
            free[s], position[s] = end, position[s] + 1
            remaining -= 1
            progressed = True
        if not progressed:
            raise ValueError("schedule deadlocks: an operation waits for one that never runs")
    finish = max(free)
    bubbles += [Interval(s, free[s], finish, "bubble") for s in range(stages) if free[s] < finish]
    return ops, sorted(bubbles, key=lambda b: (b.stage, b.start))


def bubble_fraction(ops: list[Interval], bubbles: list[Interval]) -> float:
    """Idle share of stage-time in one iteration."""
    span = max(i.end for i in ops) * len({i.stage for i in ops})
    return sum(b.length for b in bubbles) / span
