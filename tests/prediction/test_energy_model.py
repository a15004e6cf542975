"""MC2-style energy model: stages fitted from their own windows predict a job on more devices."""
import pytest

from schedulers.prediction.energy_model import EnergyModel, Stage, StageWindow, rank_placements

TRUTH = {  # per-step seconds coefficients and power per device (W)
    Stage.PREPROCESS: ((2e-4, 1e-3), 90.0),
    Stage.COMPUTE: ((1e-3, 5e-3), 300.0),
    Stage.COMMUNICATE: ((1 / 10e9, 2e-5), 120.0),  # 10 GB/s, 20 µs per hop
}
GRAD = 100e6  # bytes


def window(stage, devices, batch, steps=50):
    (a, c), power = TRUTH[stage]
    per_device = batch / devices
    if stage is Stage.COMMUNICATE:
        step = a * 2 * (devices - 1) / devices * GRAD + c * 2 * (devices - 1)
    else:
        step = a * per_device + c
    return StageWindow(stage, devices, per_device, GRAD, steps, steps * step, devices * power * steps * step)


def windows(device_counts=(1, 2, 4), batches=(256, 512)):
    return [window(s, n, b) for s in Stage for n in device_counts for b in batches
            if not (s is Stage.COMMUNICATE and n == 1)]


def test_stage_fits_from_small_runs_predict_a_larger_job():
    model = EnergyModel.fit(windows())
    prediction = model.predict(64, 4096, GRAD, steps=1000)
    expected = {s: 1000 * (window(s, 64, 4096, steps=1).seconds) for s in Stage}
    for stage in Stage:
        assert prediction.seconds[stage] == pytest.approx(expected[stage], rel=1e-6)
        assert prediction.joules[stage] == pytest.approx(64 * TRUTH[stage][1] * expected[stage], rel=1e-6)
    single = model.predict(1, 4096, GRAD, steps=1000)
    assert single.seconds[Stage.COMMUNICATE] == 0.0
    assert prediction.total_joules == pytest.approx(sum(prediction.joules.values()))


def test_compute_seconds_from_the_step_time_model_replace_the_fitted_stage():
    model = EnergyModel.fit(windows())
    prediction = model.predict(4, 512, GRAD, steps=10, compute_seconds=0.5)
    assert prediction.seconds[Stage.COMPUTE] == 5.0
    assert prediction.joules[Stage.COMPUTE] == pytest.approx(4 * 300.0 * 5.0)


def test_placements_are_ranked_by_energy():
    fast = EnergyModel.fit(windows())
    slow = EnergyModel.fit([StageWindow(w.stage, w.devices, w.samples_per_device, w.gradient_bytes, w.steps,
                                        3 * w.seconds, 2 * w.joules) for w in windows()])  # 3x time, 2/3 power
    ranked = rank_placements({"fast": fast, "slow": slow}, [("slow", 4), ("fast", 4), ("fast", 16)], 1024, GRAD,
                             100)
    energies = [p.total_joules for _, _, p in ranked]
    assert energies == sorted(energies) and ranked[0][:2] == ("fast", 4) and ranked[-1][:2] == ("slow", 4)
    with pytest.raises(ValueError, match="no energy model for device type"):
        rank_placements({"fast": fast}, [("v100", 1)], 1024, GRAD, 1)


def test_missing_stages_and_bad_windows_are_refused():
    with pytest.raises(ValueError, match="communicate"):
        EnergyModel.fit([w for w in windows() if w.stage is not Stage.COMMUNICATE])
    with pytest.raises(ValueError, match="more than one device"):
        EnergyModel.fit([StageWindow(Stage.COMMUNICATE, 1, 256, GRAD, 1, 1e-3, 0.1)] + windows(device_counts=(1,)))
    with pytest.raises(ValueError, match="seconds > 0"):
        EnergyModel.fit([StageWindow(Stage.COMPUTE, 1, 1, 1, 1, 0.0, 1.0)])
