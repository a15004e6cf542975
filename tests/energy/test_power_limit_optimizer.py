"""PowerLimitOptimizer on the real Zeus profiling logs and on the V100/P100 power traces."""
from __future__ import annotations

import pytest

from schedulers.energy.power_limit import PowerLimitError, PowerLimitOptimizer, energy_cost
from schedulers.energy.traces import WORKLOADS, ZeusTraces, read_profile_log


def _profile_logs(root):
    logs = sorted((root / "profile").glob("*.csv"))
    assert len(logs) == 6, logs
    return logs


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_chosen_limit_is_cost_minimal_on_profile_logs(zeus_traces, eta):
    for log in _profile_logs(zeus_traces):
        gpus, windows = read_profile_log(log)
        max_power = 250.0 * gpus  # V100 maximum limit times the number of GPUs
        opt = PowerLimitOptimizer([w.power_limit_w for w in windows], eta=eta, max_power_w=max_power)
        assert opt.next_limit() == 250  # profiling starts at the highest limit
        for w in windows:
            opt.observe(w.power_limit_w, w.time_s, w.energy_j)
        assert opt.done
        costs = {w.power_limit_w: energy_cost(w.energy_j, w.time_s, eta, max_power) for w in windows}
        chosen = opt.best()
        assert costs[chosen] == min(costs.values()), (log.name, costs, chosen)
        if eta == 0.0:
            assert chosen == min(windows, key=lambda w: w.time_s).power_limit_w
        if eta == 1.0:
            assert chosen == min(windows, key=lambda w: w.energy_j).power_limit_w


def test_profile_logs_energy_optimum_is_below_max(zeus_traces):
    """Zeus's point on real data: minimum energy is never at the maximum limit in these logs."""
    for log in _profile_logs(zeus_traces):
        _, windows = read_profile_log(log)
        opt = PowerLimitOptimizer([w.power_limit_w for w in windows], eta=1.0, max_power_w=250)
        for w in windows:
            opt.observe(w.power_limit_w, w.time_s, w.energy_j)
        assert opt.best_energy() < 250


@pytest.mark.parametrize("gpu", ["v100", "p100"])
def test_selectors_on_power_trace(zeus_traces, gpu):
    traces = ZeusTraces(gpu, zeus_traces)
    w = WORKLOADS["cifar100"]
    power = traces.power(w, 128)
    opt = PowerLimitOptimizer(power, eta=0.5, max_power_w=traces.max_power_w(w))
    for limit, p in power.items():
        opt.observe(limit, p.time_per_epoch_s, p.time_per_epoch_s * p.average_power_w)
    energies = {k: p.time_per_epoch_s * p.average_power_w for k, p in power.items()}
    times = {k: p.time_per_epoch_s for k, p in power.items()}
    assert opt.best_energy() == min(energies, key=energies.get)
    assert opt.best_time() == min(times, key=times.get)
    top = max(power)
    slow = opt.best_within_slowdown(1.1)
    assert times[slow] <= 1.1 * times[top]
    assert all(energies[slow] <= energies[k] for k in power if times[k] <= 1.1 * times[top])
    assert opt.best_within_slowdown(1.0) in {k for k in power if times[k] <= times[top]}


def test_bad_input_raises_typed_errors():
    with pytest.raises(PowerLimitError, match="eta"):
        PowerLimitOptimizer([100, 200], eta=1.5, max_power_w=200)
    with pytest.raises(PowerLimitError, match="empty"):
        PowerLimitOptimizer([], max_power_w=200)
    opt = PowerLimitOptimizer([100, 200], max_power_w=200)
    with pytest.raises(PowerLimitError, match="observe"):
        opt.best()
    with pytest.raises(PowerLimitError, match="not a candidate"):
        opt.observe(150, 1.0, 100.0)
    with pytest.raises(PowerLimitError, match="time_s > 0"):
        opt.observe(100, 0.0, 100.0)
    assert [opt.next_limit()] == [200]
    opt.observe(200, 1.0, 200.0)
    assert opt.next_limit() == 100 and not opt.done
