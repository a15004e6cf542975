"""Measurement windows and the JIT power-limit driver on simulated devices."""
from __future__ import annotations

import pytest

from hydro.energy import EnergyMonitor, SimulatedDevice, VirtualClock
from hydro.energy.monitor import WindowError
from hydro.energy.power_limit import PowerLimitProfiler, PowerLimitWarning, candidate_limits
from hydro.energy.simulated import StepProfile
from schedulers.energy.power_limit import energy_cost

# Step time (s) and power (W) per limit: lower limits are slower but use less energy per step.
PROFILE = {
    250: StepProfile(1.00, 240.0),
    225: StepProfile(1.02, 215.0),
    200: StepProfile(1.08, 190.0),
    175: StepProfile(1.25, 168.0),
    150: StepProfile(1.60, 148.0),
}


def _device(name="gpu0", clock=None, **kw):
    return SimulatedDevice(name, PROFILE, clock or VirtualClock(), **kw)


def test_windows_nest_and_report_time_and_energy():
    clock = VirtualClock()
    dev = _device(clock=clock)
    monitor = EnergyMonitor([dev], clock.now)
    with monitor.window("epoch") as epoch:
        dev.step(3)
        with monitor.window("step") as step:
            dev.step()
    assert step.measurement.time_s == pytest.approx(1.0)
    assert step.measurement.energy_j == {"gpu0": pytest.approx(240.0)}
    assert epoch.measurement.time_s == pytest.approx(4.0)
    assert epoch.measurement.total_energy_j == pytest.approx(960.0)
    with pytest.raises(WindowError, match="not begun"):
        monitor.end_window("epoch")
    monitor.begin_window("a")
    with pytest.raises(WindowError, match="already open"):
        monitor.begin_window("a")


def _train(profiler, devices, steps):
    for _ in range(steps):
        for d in devices:
            d.step()
        profiler.on_step()


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
def test_profiler_picks_cost_minimal_limit_and_restores_max(eta):
    clock = VirtualClock()
    devs = [_device("gpu0", clock), _device("gpu1", clock)]
    chosen = []
    with PowerLimitProfiler(devs, eta=eta, warmup_steps=2, window_steps=5, clock=clock.now,
                            on_chosen=lambda limit, opt: chosen.append(limit)) as prof:
        assert prof.optimizer.power_limits == [250, 225, 200, 175, 150]
        _train(prof, devs, 5 * 7 + 3)
        assert not prof.profiling
        costs = {p: energy_cost(2 * s.step_time_s * s.power_w, s.step_time_s, eta, 500.0) for p, s in PROFILE.items()}
        assert chosen == [min(costs, key=costs.get)] == [prof.chosen_limit]
        assert all(d.get_power_limit_w() == prof.chosen_limit for d in devs)
        assert devs[0].set_calls == [250, 225, 200, 175, 150, prof.chosen_limit]
    assert all(d.get_power_limit_w() == 250 for d in devs)


def test_profiler_restores_max_when_training_raises():
    clock = VirtualClock()
    dev = _device(clock=clock)
    with pytest.raises(RuntimeError, match="boom"):
        with PowerLimitProfiler([dev], warmup_steps=1, window_steps=2, clock=clock.now) as prof:
            _train(prof, [dev], 4)
            assert dev.get_power_limit_w() < 250
            raise RuntimeError("boom")
    assert dev.get_power_limit_w() == 250


def test_profiler_restores_at_interpreter_exit(monkeypatch):
    hooks = []
    monkeypatch.setattr("hydro.energy.power_limit.exit_guard.guard", hooks.append)
    dev = _device()
    prof = PowerLimitProfiler([dev], known_limit=175)
    assert dev.get_power_limit_w() == 175
    assert hooks == [prof.restore]
    hooks[0]()  # what the exit guard runs if the process ends (exit, SIGTERM, SIGINT) without close()
    assert dev.get_power_limit_w() == 250


def test_known_limit_skips_profiling():
    dev = _device()
    with PowerLimitProfiler([dev], known_limit=200) as prof:
        assert not prof.profiling and dev.set_calls == [200]


def test_missing_permission_warns_once_and_keeps_measuring():
    clock = VirtualClock()
    dev = _device(clock=clock, allow_set=False)
    monitor = EnergyMonitor([dev], clock.now)
    with pytest.warns(PowerLimitWarning) as record:
        with PowerLimitProfiler([dev], warmup_steps=1, window_steps=1, clock=clock.now) as prof:
            monitor.begin_window("run")
            _train(prof, [dev], 20)
            run = monitor.end_window("run")
    assert len(record) == 1 and "permission" in str(record[0].message)
    assert not prof.controllable and prof.chosen_limit is None
    assert run.total_energy_j == pytest.approx(20 * 240.0)
    assert dev.get_power_limit_w() == 250 and dev.set_calls == []


def test_candidate_limits_are_common_to_all_devices():
    clock = VirtualClock()
    a = SimulatedDevice("a", {100: StepProfile(1, 1), 300: StepProfile(1, 1)}, clock)
    b = SimulatedDevice("b", {150: StepProfile(1, 1), 250: StepProfile(1, 1)}, clock)
    assert candidate_limits([a, b]) == [250, 225, 200, 175, 150]
