"""TrialEnergy + EnergyStore on simulated devices: profile once and reuse, claims, persistence."""
from __future__ import annotations

import math
import sys

import pytest

from hydro.energy import EnergyError, NotSupported, SimulatedDevice, VirtualClock
from hydro.energy.detect import EnergyWarning, detect_devices
from hydro.energy.power_limit import PowerLimitWarning
from hydro.energy.simulated import StepProfile
from hydro.energy.trial import TrialEnergy
from schedulers.energy.batch_size import Observation
from schedulers.energy.store import ClaimOwner, EnergyStore, ProfileKey

KEY = ProfileKey("m", "1x simulated:trace", 32)  # what TrialEnergy keys the profile of model "m" on PROFILE's GPU
PROFILE = {
    250: StepProfile(1.0, 240.0),
    225: StepProfile(1.05, 220.0),
    200: StepProfile(1.1, 185.0),
    175: StepProfile(1.4, 165.0),
    150: StepProfile(1.7, 145.0),
}


def _run(store, steps, clock=None, **kw):
    clock = clock or VirtualClock()
    dev = SimulatedDevice("gpu0", PROFILE, clock, **kw)
    with TrialEnergy([dev], store=store, model="m", batch_size=32, clock=clock.now, warmup_steps=1, window_steps=2) as e:
        for _ in range(steps):
            dev.step()
            e.on_step()
        metrics = e.metrics()
        profiled = e.profiled_here
    return dev, metrics, profiled


def test_first_run_profiles_later_runs_reuse(tmp_path):
    store = EnergyStore(tmp_path / "state.db")
    dev, m1, profiled1 = _run(store, 30)
    assert profiled1 and dev.set_calls[:5] == [250, 225, 200, 175, 150]
    assert [w.power_limit_w for w in store.load_profile(KEY)] == [250, 225, 200, 175, 150]
    chosen = m1["power_limit_w"]
    assert chosen == 200  # 1.1 s x (0.5 x 185 + 0.5 x 250) W is the cheapest step
    dev2, m2, profiled2 = _run(EnergyStore(tmp_path / "state.db"), 20)
    assert not profiled2 and dev2.set_calls == [chosen, 250] and m2["power_limit_w"] == chosen
    assert m2["time_s"] == pytest.approx(20 * 1.1)
    assert m2["energy_j"] == pytest.approx(20 * 1.1 * 185.0)
    assert m2["cost"] == pytest.approx(0.5 * m2["energy_j"] + 0.5 * 250 * m2["time_s"])
    assert dev2.get_power_limit_w() == 250  # the maximum was restored on exit


def test_concurrent_run_waits_for_claimed_profile(tmp_path):
    store = EnergyStore(tmp_path / "state.db")
    other = ClaimOwner("elsewhere", 1, "token")
    assert store.claim_profile(KEY, other)  # another trial is profiling
    dev, m, profiled = _run(store, 5)
    assert not profiled and dev.set_calls == [] and m["power_limit_w"] is None
    assert store.claim_holder(KEY)[0] == other


def test_expired_claim_is_taken_over_and_the_lease_renewed_while_profiling(tmp_path):
    clock = VirtualClock(100.0)
    store = EnergyStore(tmp_path / "state.db", clock=clock.now)
    assert store.claim_profile(KEY, ClaimOwner("dead-host", 1, "t"), lease_s=10)  # then SIGKILLed
    dev = SimulatedDevice("gpu0", PROFILE, clock)
    with TrialEnergy([dev], store=store, model="m", batch_size=32, clock=clock.now, warmup_steps=1, window_steps=2,
                     poll_steps=5, lease_s=6) as e:
        for _ in range(5):  # 5 s: the dead owner's lease runs until 110
            dev.step()
            e.on_step()
        assert e.profiler is None and store.claim_holder(KEY)[0].host == "dead-host"
        for _ in range(5):  # at 110 s the next poll takes the claim over
            dev.step()
            e.on_step()
        assert e.profiler is not None and store.claim_holder(KEY)[0] == e.owner
        for _ in range(10):  # 10 s > the 6 s lease: renewed as it profiles
            dev.step()
            e.on_step()
            assert store.claim_holder(KEY)[1] > clock.now()
        for _ in range(10):
            dev.step()
            e.on_step()
        assert e.profiled_here and e.power_limit_w == 200
    assert store.claim_holder(KEY) is None


def test_interrupted_profiling_releases_claim(tmp_path):
    store = EnergyStore(tmp_path / "state.db")
    _run(store, 2)  # stops before profiling finishes
    assert store.load_profile(KEY) == []
    assert store.claim_holder(KEY) is None  # the claim was released
    assert store.claim_profile(KEY, ClaimOwner.this_process())


def test_no_permission_measures_and_leaves_nothing_set(tmp_path):
    store = EnergyStore(tmp_path / "state.db")
    with pytest.warns(PowerLimitWarning):
        dev, m, profiled = _run(store, 10, allow_set=False)
    assert dev.set_calls == [] and m["energy_j"] == pytest.approx(10 * 240.0) and not profiled
    assert store.claim_holder(KEY) is None


def test_cost_needs_max_power_without_controllable_device(tmp_path):
    class Meter(SimulatedDevice):  # energy only, like a RAPL package
        def power_limit_range_w(self):
            raise NotSupported("no limit")

    meter = Meter("cpu", PROFILE, VirtualClock())
    with pytest.raises(EnergyError, match="max_power_w"):
        TrialEnergy([meter], store=EnergyStore(tmp_path / "s.db"), model="m", batch_size=32)
    with TrialEnergy([meter], store=EnergyStore(tmp_path / "s.db"), model="m", batch_size=32, max_power_w=100,
                     clock=meter.clock.now) as e:
        meter.step(3)
        assert e.metrics()["cost"] == pytest.approx(0.5 * 3 * 240.0 + 0.5 * 100 * 3.0)


def test_observations_persist_in_order_with_infinite_costs(tmp_path):
    store = EnergyStore(tmp_path / "state.db")
    store.add_observation("job", Observation(32, 10.0, True), "t1")
    store.add_observation("job", Observation(64, math.inf, False))
    store.add_observation("other", Observation(8, 1.0, True))
    assert EnergyStore(tmp_path / "state.db").observations("job") == [
        Observation(32, 10.0, True),
        Observation(64, math.inf, False),
    ]


def test_detect_devices_without_gpu_or_rapl_warns_once(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.warns(EnergyWarning) as record:
        assert detect_devices(env={}, powercap_root=tmp_path) == []
    assert len(record) == 1 and "nvidia-ml-py" in str(record[0].message) and "RAPL" in str(record[0].message)
