"""The energy observer on the fused-trial unit (CPU training, simulated GPU): per-epoch energy split equally among
the members alive in the epoch, totals equal to the device's counter, profile stored per (F, batch size) and
reused, state carried through a checkpoint."""
from __future__ import annotations

import pytest

from hydro.energy.simulated_gpu import step_profile
from hydro.energy.tuning import DeviceSource, EnergySettings, trial_observer
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from schedulers.energy.power_limit import energy_cost
from tests.tune.workload import small_digits, spec

MEMBERS = [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.05, "momentum": 0.0}),
           ("c", {"lr": 0.01, "momentum": 0.9})]


def _settings(tmp_path, **kw):
    return EnergySettings(str(tmp_path / "energy.db"), "digits", DeviceSource.SIMULATED, warmup_steps=1,
                          window_steps=1, **kw)


def _trial(members=MEMBERS):
    return FusedTrial(spec(), TrialPlan(TrialKind.SURROGATE, list(members)), small_digits())


def test_epoch_energy_is_split_equally_among_alive_members(tmp_path):
    trial = _trial()
    meter = trial_observer(_settings(tmp_path), trial).start()
    trial.observers.append(meter)
    gpu = meter.stepped[0]
    try:
        trial.run_epoch()  # 10 steps of 3 members x 32 samples; profiling 7 limits takes 14 steps
        first = (gpu.energy_j(), gpu.clock.now())
        trial.keep([1, 2])  # "a" stops after epoch 1
        trial.run_epoch()
        trial.run_epoch()
    finally:
        meter.close()
    total = meter.trial_metrics()
    assert total["energy_j"] == pytest.approx(gpu.energy_j()) and total["time_s"] == pytest.approx(gpu.clock.now())
    assert total["cost"] == pytest.approx(energy_cost(gpu.energy_j(), gpu.clock.now(), 0.5, 250.0))
    assert total["member_epoch_cost"] == pytest.approx(total["cost"] / (3 + 2 + 2))
    rest = (gpu.energy_j() - first[0])
    assert meter.members["a"].energy_j == pytest.approx(first[0] / 3)
    assert meter.members["b"].energy_j == pytest.approx(first[0] / 3 + rest / 2)
    assert meter.members["a"].member_epochs == 1 and meter.members["c"].member_epochs == 3
    per_member = meter.member_metrics(["a", "b", "c"])
    assert per_member["energy_j"].sum().item() == pytest.approx(total["energy_j"])
    assert per_member["cost"].sum().item() == pytest.approx(total["cost"])
    # profiled on the way, then the cheapest limit of the model applied; the limit found (250 W) restored at close
    profile = step_profile(32, 3)
    costs = {p: energy_cost(s.step_time_s * s.power_w, s.step_time_s, 0.5, 250.0) for p, s in profile.items()}
    assert total["power_profiled_here"] and total["power_limit_w"] == min(costs, key=costs.get) < 250
    assert gpu.get_power_limit_w() == 250


def test_profile_is_reused_per_members_and_batch_size_and_state_survives_a_checkpoint(tmp_path):
    settings = _settings(tmp_path)
    first = _trial()
    meter = trial_observer(settings, first).start()
    first.observers.append(meter)
    first.run_epoch()
    first.run_epoch()
    meter.close()
    chosen = meter.trial_metrics()["power_limit_w"]

    again = _trial()  # same F and batch size: the stored profile, applied from the first step
    state = {**again.state_dict(), "energy": meter.state_dict()}
    meter2 = trial_observer(settings, again).start()
    meter2.load_state_dict(state["energy"])
    again.observers.append(meter2)
    gpu = meter2.stepped[0]
    assert gpu.set_calls == [chosen]
    again.run_epoch()
    meter2.close()
    m = meter2.trial_metrics()
    assert not m["power_profiled_here"] and m["power_limit_w"] == chosen
    assert m["energy_j"] == pytest.approx(meter.total.energy_j + gpu.energy_j())  # counts on from the checkpoint

    other = _trial(MEMBERS[:2])  # F = 2: another profile
    meter3 = trial_observer(settings, other).start()
    other.observers.append(meter3)
    other.run_epoch()
    other.run_epoch()
    meter3.close()
    assert meter3.trial_metrics()["power_profiled_here"]


def test_settings_refuse_bad_values_naming_the_fix(tmp_path):
    with pytest.raises(ValueError, match="eta=1.5 is outside"):
        _settings(tmp_path, eta=1.5)
    with pytest.raises(ValueError, match="beta=1.0 must be > 1"):
        _settings(tmp_path, beta=1.0)
    with pytest.raises(ValueError, match=r"devices must be one of \['detect', 'simulated'\], got 'cpu-only'"):
        EnergySettings("x.db", "job", "cpu-only")


def test_trials_sharing_a_card_are_charged_their_share_of_its_energy(tmp_path, monkeypatch):
    """NVML counts the card's energy: two trials given 0.25 and 0.75 of it (Ray's fractional GPUs) are charged
    those shares of what it used while they trained, adding up to the card's."""
    import sys

    import pynvml as real

    import hydro.energy.tuning as tuning
    from hydro.energy.nvml import nvml_devices
    from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml

    card = FakeGPU("GPU-aaaa", real.NVML_DEVICE_ARCH_VOLTA)
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml([card]))
    monkeypatch.setattr(tuning, "detect_devices", lambda: nvml_devices(env={}))
    settings = EnergySettings(str(tmp_path / "energy.db"), "digits", DeviceSource.DETECT)
    meters = [trial_observer(settings, _trial(MEMBERS[:1]), share).start() for share in (0.25, 0.75)]
    try:
        card.energy_mj += 8_000  # 8 J on the card while both trained
        used = [meter.energy.metrics()["energy_j"] for meter in meters]
    finally:
        for meter in meters:
            meter.close()
    assert used == pytest.approx([2.0, 6.0])
