"""The 1F1B iteration DAG, the lowtime frontier against brute force, and plan choice."""
import random

import pytest

from hydro.pipeline.schedule import one_f_one_b, simulate
from schedulers.pipeline_energy import (
    ByDeadline,
    ByMaxSlowdown,
    Instruction,
    InstructionDAG,
    PipelineProfile,
    brute_force_frontier,
    lowtime_frontier,
)
from tests.pipeline_energy.plans import profile_of, solve

F, B = Instruction.FORWARD, Instruction.BACKWARD


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (4, 8), (3, 5)])
def test_dag_critical_path_is_the_simulated_iteration_time(stages, microbatches):
    rng = random.Random(stages * 100 + microbatches)
    forward = [rng.uniform(0.01, 0.05) for _ in range(stages)]
    backward = [rng.uniform(0.02, 0.1) for _ in range(stages)]
    schedule = one_f_one_b(stages, microbatches)
    ops, bubbles = simulate(schedule, forward, backward)
    dag = InstructionDAG(schedule)
    durations = {k: (forward if k.instruction is F else backward)[k.stage] for k in dag.instructions}
    assert dag.iteration_time_s(durations) == pytest.approx(max(o.end for o in ops), rel=1e-12)
    finish = dag.finish_times(durations)
    for op in ops:  # every instruction ends where the simulator ends it
        key = next(k for k in finish if k.stage == op.stage and f"{k.instruction.value[0].upper()}{k.microbatch}"
                   == op.label)
        assert finish[key] == pytest.approx(op.end, rel=1e-12)
    # Energy: compute energy plus blocking power over exactly the simulator's bubbles.
    table = {(s, i): [(1500, (forward if i is F else backward)[s], 3.0 + s)] for s in range(stages) for i in (F, B)}
    profile = profile_of(table, p2p_w=40.0)
    point = dag.evaluate(dag.max_frequency_plan(profile), profile)
    compute = sum(3.0 + k.stage for k in dag.instructions)
    assert point.energy_j == pytest.approx(compute + 40.0 * sum(b.length for b in bubbles), rel=1e-9)


def _small_profile() -> PipelineProfile:
    """2 stages; durations are whole milliseconds and costs (energy - P2P power x time) convex, so lowtime's
    integer problem is the exact discrete problem."""
    freqs = (1800, 1500, 1200)
    rows = {
        (0, F): [(10, 5.0), (11, 4.6), (12, 4.4)],
        (0, B): [(20, 9.0), (21, 8.5), (22, 8.3)],
        (1, F): [(10, 6.0), (11, 5.5), (12, 5.3)],
        (1, B): [(30, 12.0), (31, 11.2), (32, 10.9)],
    }
    return profile_of({k: [(f, ms / 1000, e) for f, (ms, e) in zip(freqs, v)] for k, v in rows.items()}, p2p_w=10.0)


def test_lowtime_frontier_equals_brute_force_on_2_stages_x_2_microbatches():
    profile = _small_profile()
    dag = InstructionDAG(one_f_one_b(2, 2))
    exact = brute_force_frontier(dag, profile)
    solved = lowtime_frontier(dag, profile, unit_s=0.001)
    assert len(exact) >= 4  # a real tradeoff, not one point
    assert [round(p.time_s, 9) for p in solved] == [round(p.time_s, 9) for p in exact]
    assert [p.energy_j for p in solved] == pytest.approx([p.energy_j for p in exact], rel=1e-9)
    for point in solved:  # the plans lowtime returns are what the profile says they are
        again = dag.evaluate(point.frequencies, profile)
        assert (again.time_s, again.energy_j) == pytest.approx((point.time_s, point.energy_j))


def test_zero_slowdown_plan_is_never_slower_than_all_max_and_saves_energy():
    _, frontier, baseline, free = solve(_small_profile(), microbatches=2)
    assert free.time_s <= baseline.time_s
    assert free.energy_j < baseline.energy_j  # stage 0 has slack: slowing it is free
    relaxed = ByMaxSlowdown(0.05).choose(frontier, baseline)
    assert relaxed.time_s <= 1.05 * baseline.time_s and relaxed.energy_j <= free.energy_j
    assert ByDeadline(relaxed.time_s).choose(frontier, baseline) == relaxed


def test_plan_choice_errors_name_the_fix():
    profile = _small_profile()
    dag, frontier, baseline, _ = solve(profile, microbatches=2)
    with pytest.raises(ValueError, match="Relax the bound"):
        ByDeadline(0.5 * baseline.time_s).choose(frontier, baseline)
    with pytest.raises(ValueError, match="negative"):
        ByMaxSlowdown(-0.1)
    with pytest.raises(ValueError, match="smaller unit"):
        lowtime_frontier(dag, profile, unit_s=0.005)


@pytest.mark.parametrize("seed", range(6))
def test_fastest_plan_matches_all_max_despite_rounding(seed):
    """Random 3-stage profiles whose times are not multiples of the (coarse) unit: the frontier's fastest plan
    is never slower than all-max clocks, and never uses more energy."""
    rng = random.Random(seed)
    table = {}
    for s in range(3):
        for kind, base in ((F, rng.uniform(0.010, 0.02)), (B, rng.uniform(0.02, 0.04))):
            table[(s, kind)] = [(1800 - 150 * n, base * (1 + 0.07 * n + rng.uniform(0, 0.02)),
                                 base * 300 * (1 - 0.06 * n + 0.012 * n * n)) for n in range(6)]
    profile = profile_of(table, p2p_w=70.0)
    dag = InstructionDAG(one_f_one_b(3, 4))
    frontier = lowtime_frontier(dag, profile, unit_s=0.001)
    baseline = dag.evaluate(dag.max_frequency_plan(profile), profile)
    free = ByMaxSlowdown(0.0).choose(frontier, baseline)
    assert free.time_s <= baseline.time_s * (1 + 1e-12)
    assert free.energy_j <= baseline.energy_j
    assert frontier[0] == free
