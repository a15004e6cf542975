"""Energy-aware placement: MC2 energy models fitted per GPU type from the energy windows metered trials report
(their cumulative per-epoch reports), and the type of least Zeus cost chosen from them."""
import pytest

from schedulers.placement.energy_choice import EnergyChoice, EpochEnergy, stage_windows
from schedulers.placement.predicted_finish import PredictedFinish
from schedulers.placement.cluster import GpuType
from schedulers.prediction.energy_model import EnergyModel, Stage, StageWindow

STEPS_PER_EPOCH, BATCH = 10, 32


def reports(power_w: float, wait_s: float, compute_s: float, eval_s: float = 0.5, epochs: int = 3):
    """What a metered trial reports after each epoch (cumulative), at a constant power."""
    return [EpochEnergy(e, power_w * e * (wait_s + compute_s + eval_s), e * (wait_s + compute_s + eval_s),
                        e * (wait_s + compute_s), e * wait_s) for e in range(1, epochs + 1)]


def measured(choice: EnergyChoice, gpu: str, power_w: float, wait_s: float, compute_s: float, members: int = 4):
    before = EpochEnergy(0, 0.0, 0.0, 0.0, 0.0)
    for now in reports(power_w, wait_s, compute_s):
        choice.record(gpu, stage_windows(before, now, STEPS_PER_EPOCH, BATCH, members))
        before = now


def test_stage_windows_of_two_reports_split_the_epochs_energy_by_time():
    first, second = reports(200.0, wait_s=1.0, compute_s=3.0, epochs=3)[0:3:2]  # epochs 1 and 3
    windows = stage_windows(first, second, STEPS_PER_EPOCH, BATCH, members=4)
    assert [w.stage for w in windows] == [Stage.PREPROCESS, Stage.COMPUTE]
    pre, compute = windows
    assert (pre.steps, pre.seconds, pre.samples_per_device) == (20, pytest.approx(2.0), BATCH)
    assert (compute.seconds, compute.samples_per_device, compute.devices) == (pytest.approx(6.0), 4 * BATCH, 1)
    assert pre.joules == pytest.approx(200.0 * 2.0) and compute.joules == pytest.approx(200.0 * 6.0)
    assert stage_windows(second, second, STEPS_PER_EPOCH, BATCH, 4) == []  # no epoch in between
    no_wait = EpochEnergy(3, second.energy_j, second.time_s, second.train_s, first.data_wait_s)
    assert [w.stage for w in stage_windows(first, no_wait, STEPS_PER_EPOCH, BATCH, 4)] == [Stage.COMPUTE]


def test_a_model_of_one_device_predicts_one_device_and_refuses_more():
    choice = EnergyChoice(0.5)
    measured(choice, "A100", 300.0, wait_s=0.5, compute_s=2.0)
    model = choice.models()["A100"]
    prediction = model.predict(1, BATCH, 0.0, steps=10)
    assert prediction.seconds[Stage.COMMUNICATE] == prediction.joules[Stage.COMMUNICATE] == 0.0
    assert prediction.seconds[Stage.PREPROCESS] == pytest.approx(0.5)  # 10 steps of 0.05 s
    assert prediction.joules[Stage.PREPROCESS] == pytest.approx(300.0 * 0.5)
    with pytest.raises(ValueError, match="one device only"):
        model.predict(2, BATCH, 0.0, steps=10)
    with pytest.raises(ValueError, match="communicate"):  # windows of several devices still need every stage
        EnergyModel.fit([StageWindow(s, 2, 16, 0.0, 10, 1.0, 2.0) for s in (Stage.PREPROCESS, Stage.COMPUTE)])


def test_the_least_cost_type_wins_once_every_type_has_a_model():
    choice = EnergyChoice(eta=1.0)  # energy only
    finish = {"A100": 100.0, "V100": 120.0}
    step = {"A100": 0.25, "V100": 0.3}
    measured(choice, "A100", 400.0, wait_s=0.5, compute_s=2.0)
    assert choice.rank(finish, step, steps=300, batch_size=BATCH) is None  # V100 not measured yet
    measured(choice, "V100", 150.0, wait_s=0.5, compute_s=2.4)
    ranking = choice.rank(finish, step, steps=300, batch_size=BATCH)
    # 300 steps of 0.05 s preprocessing + the rest of the predicted step, at each type's power
    assert ranking.cost_j["A100"] == pytest.approx(400.0 * 300 * 0.25)
    assert ranking.cost_j["V100"] == pytest.approx(150.0 * 300 * 0.3)
    assert ranking.gpu == "V100"  # slower, but less energy
    time_only = EnergyChoice(eta=0.0, windows=choice.windows).rank(finish, step, steps=300, batch_size=BATCH)
    assert time_only.gpu == "A100" and time_only.cost_j["A100"] == pytest.approx(400.0 * 100.0)  # MaxPower x T


def test_until_every_type_has_a_model_a_trial_measures_one_where_it_could_cost_least():
    choice = EnergyChoice(eta=0.5)
    free = {"A100": 1.0, "V100": 2.5}  # both types free: V100 is 2.5x slower
    assert choice.explore(free, measuring=()) == "A100"  # nothing measured: the quickest
    assert choice.explore(free, measuring={"A100"}) is None  # (1 - 0.5) x 2.5 >= 1: V100 cannot cost less
    queued = {"A100": 3.0, "V100": 2.5}  # the A100 busy with the trial measuring it
    assert choice.explore(queued, measuring={"A100"}) == "V100"
    assert choice.explore(queued, measuring={"A100", "V100"}) is None  # both being measured
    assert EnergyChoice(eta=1.0).explore(free, measuring={"A100"}) == "V100"  # energy only: any type could win
    assert EnergyChoice(eta=0.0).explore(queued, measuring=()) is None  # time only: energy models decide nothing
    measured(choice, "A100", 400.0, wait_s=0.5, compute_s=2.0)
    assert choice.explore(queued, measuring=()) == "V100"  # A100 has its model; V100 is still to measure
    assert choice.explore(free, measuring=()) is None
    measured(choice, "V100", 150.0, wait_s=0.5, compute_s=2.4)
    assert choice.explore(queued, measuring=()) is None  # every type has a model: rank decides
    assert choice.rank(queued, {"A100": 0.25, "V100": 0.3}, steps=300, batch_size=BATCH) is not None


def test_a_moved_trial_holds_its_new_type():
    finish = PredictedFinish({"fast": GpuType("fast", 2.0, 0.0), "slow": GpuType("slow", 1.0, 0.0)},
                             {"fast": 1, "slow": 1})
    choice = finish.choose("t1", work_per_member=0.1, members=2, steps=100)
    assert choice.gpu == "fast" and choice.step_s == {"fast": pytest.approx(0.1), "slow": pytest.approx(0.2)}
    finish.move("t1", "slow")
    assert finish.choose("t2", 0.1, 2, 100).finish_s["fast"] == pytest.approx(10.0)  # fast is free: t1 moved
    with pytest.raises(ValueError, match="unknown GPU type"):
        finish.move("t2", "H100")


def test_eta_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        EnergyChoice(1.5)
