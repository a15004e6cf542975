"""Stored power-limit profiles are keyed by the hardware measured: a simulated device's profile is never applied
on a real GPU, one GPU model's never on another, a profile of an older store (no device recorded) never; a trial
with a share of a card is charged that share of its MaxPower too."""
from __future__ import annotations

import logging
import sqlite3
import sys

import pynvml as real
import pytest

from hydro.energy import SimulatedDevice, VirtualClock
from hydro.energy.nvml import nvml_devices
from hydro.energy.share import CardShare
from hydro.energy.trial import TrialEnergy, device_key
from schedulers.energy.power_limit import LimitMeasurement, energy_cost
from schedulers.energy.store import EnergyStore, ProfileKey
from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml
from tests.energy.test_trial_and_store import PROFILE

H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
# a stored H100 profile whose cheapest limit (eta 0.5, MaxPower 250 W) is 200 W
WINDOWS = [LimitMeasurement(250, 1.0, 240.0), LimitMeasurement(225, 1.05, 220.0), LimitMeasurement(200, 1.1, 185.0),
           LimitMeasurement(175, 1.4, 165.0)]


def _card(monkeypatch, name: str) -> FakeGPU:
    gpu = FakeGPU("GPU-aaaa", real.NVML_DEVICE_ARCH_VOLTA, name=name)
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml([gpu]))
    return gpu


def _energy(devices, store) -> TrialEnergy:
    return TrialEnergy(devices, store=store, model="m", batch_size=32, warmup_steps=0, window_steps=1)


def test_device_key_names_each_kind_its_count_and_share(monkeypatch):
    _card(monkeypatch, H100)
    (gpu,) = nvml_devices(env={})
    sim = SimulatedDevice("gpu0", PROFILE, VirtualClock(), model="analytic-250W")
    assert device_key([gpu, gpu]) == f"2x nvml:{H100}"
    assert device_key([sim]) == "1x simulated:analytic-250W"
    assert device_key([CardShare(gpu, 0.25)]) == f"1x nvml:{H100}*0.25"


def test_a_profile_is_reused_only_on_the_hardware_it_was_measured_on(tmp_path, monkeypatch):
    store = EnergyStore(tmp_path / "e.db")
    clock = VirtualClock()
    sim = SimulatedDevice("gpu0", PROFILE, clock)
    with TrialEnergy([sim], store=store, model="m", batch_size=32, clock=clock.now, warmup_steps=0,
                     window_steps=1) as e:
        for _ in range(len(PROFILE)):
            sim.step()
            e.on_step()
        assert e.profiled_here and e.key == ProfileKey("m", "1x simulated:trace", 32)

    card = _card(monkeypatch, H100)  # a real run of the same job: the simulated profile is not applied
    with _energy(nvml_devices(env={}), store) as e:
        assert e.key.device == f"1x nvml:{H100}" and e.profiler.profiling
        assert card.set_history == [250_000]  # profiling starts at the ceiling, no stored limit applied
    assert store.save_profile(ProfileKey("m", f"1x nvml:{H100}", 32), WINDOWS)

    card = _card(monkeypatch, A100)  # another GPU model: profiled anew
    with _energy(nvml_devices(env={}), store) as e:
        assert e.profiler.profiling and card.set_history == [250_000]

    card = _card(monkeypatch, H100)  # the same model: the stored choice, at once
    with _energy(nvml_devices(env={}), store) as e:
        assert not e.profiler.profiling and e.power_limit_w == 200 and card.set_history == [200_000]


def test_profiles_of_an_older_store_without_device_are_not_reused(tmp_path, monkeypatch, caplog):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the layout before profiles recorded their device
        db.execute("CREATE TABLE profiles (model TEXT NOT NULL, batch_size INTEGER NOT NULL, power_limit_w INTEGER "
                   "NOT NULL, time_s REAL NOT NULL, energy_j REAL NOT NULL, PRIMARY KEY (model, batch_size, "
                   "power_limit_w))")
        db.executemany("INSERT INTO profiles VALUES ('m', 32, ?, ?, ?)",
                       [(w.power_limit_w, w.time_s, w.energy_j) for w in WINDOWS])
    with caplog.at_level(logging.WARNING, logger="schedulers.energy.store"):
        store = EnergyStore(path)
    assert "1 power-limit profiles were stored without the device" in caplog.text
    card = _card(monkeypatch, H100)
    with _energy(nvml_devices(env={}), store) as e:
        assert e.profiler.profiling and card.set_history == [250_000]


def test_a_card_share_is_charged_its_share_of_max_power_and_keyed_by_it(tmp_path, monkeypatch):
    card = _card(monkeypatch, H100)
    (gpu,) = nvml_devices(env={})
    now = [0.0]
    with TrialEnergy([CardShare(gpu, 0.25)], store=EnergyStore(tmp_path / "e.db"), model="m", batch_size=32,
                     clock=lambda: now[0]) as e:
        assert e.max_power_w == pytest.approx(0.25 * 250) and e.key.device == f"1x nvml:{H100}*0.25"
        assert e.profiler.optimizer.max_power_w == pytest.approx(0.25 * 250)
        card.energy_mj += 400_000  # the card used 400 J in 2 s
        now[0] = 2.0
        cost = e.metrics()["cost"]
    assert cost == pytest.approx(0.25 * energy_cost(400.0, 2.0, 0.5, 250.0))  # the share of the card's cost
