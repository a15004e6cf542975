"""plan_fusion measures real training and respects the memory budget."""
import time

import pytest
import torch
from torch import nn

from hydro.examples.data import digits
from hydro.examples.models import MLP
from hydro import profiling
from hydro.fusion_measure import plan_fusion
from hydro.profiling import throughput_clock, torch_threads


@pytest.fixture(scope="module")
def batch():
    train, _ = digits()
    return train.x[:64], train.y[:64]


def test_plan_measures_each_count_and_picks_a_measured_one(batch):
    plan = plan_fusion(MLP, batch, nn.CrossEntropyLoss(), max_members=8, steps=2)
    counts = [m.num_members for m in plan.measurements]
    assert counts[:2] == [1, 2] and plan.num_members in counts
    assert all(m.peak_bytes > 0 and m.samples_per_s > 0 for m in plan.measurements)
    peaks = [m.peak_bytes for m in plan.measurements]
    assert peaks == sorted(peaks)  # more members need more memory
    best = max(m.samples_per_s for m in plan.measurements)
    chosen = next(m for m in plan.measurements if m.num_members == plan.num_members)
    assert chosen.samples_per_s >= 0.95 * best


def test_plan_measures_with_the_trials_threads_and_restores_the_setting(batch):
    seen, before = [], torch.get_num_threads()

    def factory():
        seen.append(torch.get_num_threads())
        return MLP()

    torch.set_num_threads(2)
    try:
        plan_fusion(factory, batch, nn.CrossEntropyLoss(), max_members=2, steps=1, threads=1)
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_one_thread_is_timed_by_its_cpu_time_and_several_by_the_wall_clock(batch, monkeypatch):
    """With one torch thread a step's CPU time (this thread's) is its time on an idle core, so a load spike while
    one count is timed cannot make it look slower; several threads idle within a step, so the wall clock times
    them."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(profiling.time, "thread_time", lambda: 0.5 * next(ticks))  # far slower than a step
    with torch_threads(1):
        assert throughput_clock("cpu") is profiling.time.thread_time
        assert throughput_clock("cuda") is time.perf_counter
        plan = plan_fusion(MLP, batch, nn.CrossEntropyLoss(), max_members=4, steps=1)
    times = {m.step_time_s for m in plan.measurements}
    assert len(times) == 1 and min(times) >= 0.5  # every count timed in ticks of the (fake) CPU clock
    with torch_threads(2):
        assert throughput_clock("cpu") is time.perf_counter
        plan = plan_fusion(MLP, batch, nn.CrossEntropyLoss(), max_members=4, steps=1)
    assert all(m.step_time_s < 0.5 for m in plan.measurements)  # real steps, timed by the wall clock


def test_memory_budget_limits_the_fusion_count(batch):
    one = plan_fusion(MLP, batch, nn.CrossEntropyLoss(), max_members=1, steps=1).measurements[0].peak_bytes
    budget = int(3.5 * one)
    # tolerance=1: throughput never decides, so only the budget can stop the search.
    plan = plan_fusion(MLP, batch, nn.CrossEntropyLoss(), max_members=64, memory_budget_bytes=budget, steps=1,
                       tolerance=1.0)
    assert "budget" in plan.reason and plan.num_members == plan.measurements[-1].num_members < 64
    assert all(m.peak_bytes <= budget for m in plan.measurements)
    with pytest.raises(MemoryError, match="even one member"):
        plan_fusion(MLP, batch, nn.CrossEntropyLoss(), memory_budget_bytes=one // 2, steps=1)


def test_demo_main_job_runs(capsys):
    from hydro.cli import main

    assert main(["demo", "--configs", "4", "--epochs", "1", "--fusion", "auto"]) == 0
    out = capsys.readouterr().out
    assert "plan_fusion: F=" in out and "best: lr=" in out
