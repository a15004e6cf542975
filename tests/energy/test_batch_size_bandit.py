"""BatchSizeBandit: pruning order, Thompson sampling, bound, robustness; Hydro vs Zeus on the traces."""
from __future__ import annotations

import numpy as np
import pytest

from schedulers.energy.batch_size import BanditError, BatchSizeBandit
from schedulers.energy.simulator import JobSimulator, simulate_grid
from schedulers.energy.traces import WORKLOADS, ZeusTraces

SIZES = [8, 16, 32, 64, 128]


def _drive(bandit, outcome):
    """Run choose/observe until pruning ends; outcome(b) -> (cost, converged). Returns the chosen order."""
    order = []
    while bandit.pruning:
        b = bandit.choose()
        order.append(b)
        bandit.observe(b, *outcome(b))
    return order


def test_pruning_goes_smaller_then_larger_and_stops_at_failure():
    bandit = BatchSizeBandit.zeus(SIZES, 32, seed=0)
    fails = {8, 128}
    order = _drive(bandit, lambda b: (100.0 + b, b not in fails))
    # Round 1: 32, 16, 8 (fails: stop), 64, 128 (fails: stop). Round 2 on survivors {16, 32, 64}.
    assert order == [32, 16, 8, 64, 128, 32, 16, 64]
    assert bandit.arms == [16, 32, 64]


def test_direction_stops_before_unexplored_sizes():
    bandit = BatchSizeBandit(SIZES, 32, seed=0, prune_margin=None)
    order = _drive(bandit, lambda b: (100.0, b != 16))
    assert order == [32, 16, 64, 128]  # 8 never tried: the smaller direction stopped at 16
    assert bandit.arms == [32, 64, 128]


def test_hydro_prunes_clearly_worse_sizes():
    bandit = BatchSizeBandit(SIZES, 32, seed=0, prune_margin=0.5)
    costs = {8: 50.0, 16: 400.0, 32: 100.0, 64: 120.0, 128: 90.0}
    order = _drive(bandit, lambda b: (costs[b], True))
    assert order == [32, 16, 64, 128]  # 16 costs 4x the best: the direction stops, 8 is never run
    assert bandit.arms == [32, 64, 128]


def test_thompson_sampling_prefers_cheapest_arm_and_bound():
    bandit = BatchSizeBandit(SIZES, 32, seed=1)
    rng = np.random.default_rng(0)
    mean = {8: 200.0, 16: 130.0, 32: 100.0, 64: 80.0, 128: 110.0}
    _drive(bandit, lambda b: (mean[b] * rng.uniform(0.9, 1.1), True))
    picks = []
    for _ in range(40):
        b = bandit.choose()
        picks.append(b)
        bandit.observe(b, mean[b] * rng.uniform(0.9, 1.1), True)
    assert picks[-20:].count(64) >= 18
    assert bandit.stop_cost == pytest.approx(2.0 * bandit.min_cost)
    assert 72.0 <= bandit.min_cost <= 88.0


def test_runs_that_never_started_do_not_break_statistics():
    bandit = BatchSizeBandit(SIZES, 32, seed=2)
    _drive(bandit, lambda b: (100.0 if b == 32 else 150.0, True))
    assert not bandit.pruning
    for _ in range(5):  # e.g. trials cancelled before they ran: enormous cost, not converged
        bandit.observe(bandit.choose(), 1e30, False)
        bandit.observe(bandit.choose(), float("inf"), False)
    picks = [bandit.choose() for _ in range(10)]
    assert set(picks) <= set(bandit.arms)
    assert bandit.stop_cost == 200.0


def test_concurrent_choices_during_pruning_do_not_duplicate_candidate():
    bandit = BatchSizeBandit(SIZES, 32, seed=0)
    assert bandit.choose() == 32  # pruning starts at the default
    assert bandit.choose() == 32  # concurrent caller, nothing known yet: the default
    bandit.observe(32, 100.0, True)
    assert bandit.choose() == 16  # next pruning candidate
    assert bandit.choose() == 32  # 16 is in flight: best known instead of a duplicate 16
    bandit.observe(32, 104.0, True)  # the concurrent run of 32 finishes first
    bandit.observe(16, 90.0, True)
    assert bandit.choose() == 8
    assert len(bandit.history) == 3


def test_replaying_history_restores_state():
    a = BatchSizeBandit(SIZES, 32, seed=3)
    _drive(a, lambda b: (100.0 + b, b != 8))
    b = BatchSizeBandit(SIZES, 32, seed=3)
    for o in a.history:
        b.observe(o.batch_size, o.cost, o.converged)
    assert (b.arms, b.pruning, b.stop_cost) == (a.arms, a.pruning, a.stop_cost)


def test_bad_input_raises_typed_errors():
    with pytest.raises(BanditError, match="default batch size"):
        BatchSizeBandit(SIZES, 24)
    with pytest.raises(BanditError, match="beta"):
        BatchSizeBandit(SIZES, 32, beta=1.0)
    bandit = BatchSizeBandit(SIZES, 32)
    with pytest.raises(BanditError, match="not one of"):
        bandit.observe(24, 1.0, True)
    with pytest.raises(BanditError, match="finite cost"):
        bandit.observe(32, float("inf"), True)
    with pytest.raises(BanditError, match="non-negative"):
        bandit.observe(32, float("nan"), False)


@pytest.mark.parametrize("gpu", ["v100", "p100"])
def test_simulated_runs_find_cheap_batch_size(zeus_traces, gpu):
    """After 50 recurrences the last choices cost close to the oracle arm (expected costs)."""
    sim = JobSimulator(ZeusTraces(gpu, zeus_traces), WORKLOADS["cifar100"])
    oracle_b, oracle_cost = sim.oracle()
    result = sim.simulate("hydro", seed=0)
    last = [r.batch_size for r in result.recurrences[-10:]]
    expected = {b: sim.expected(b, sim.power_limit[b])[0] for b in set(last)}
    assert all(expected[b] <= 1.15 * oracle_cost for b in last), (oracle_b, last)
    assert result.totals["cost_savings"] > 0.3  # the default (b0=1024 at max power) is far from optimal


def test_hydro_beats_zeus_on_traces(zeus_traces):
    """Mean cumulative cost over seeds, all six workloads on V100: Hydro's policy is lower in total."""
    results = simulate_grid(["v100"], list(WORKLOADS), ["hydro", "zeus"], range(5), traces_path=str(zeus_traces))
    total = {p: sum(r.totals["cost"] / r.oracle_cost for r in results if r.policy == p) for p in ("hydro", "zeus")}
    assert total["hydro"] < total["zeus"]
