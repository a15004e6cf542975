"""Heterogeneity-aware, elastic placement on a real local Ray cluster with two fake GPU types (custom
resources): trials land where EarliestFinish predicts they finish first (from the step-time model's work, the
spec's steps and the running trials' progress), merged survivors continue bit-identically, and the ended
trials' resources go back to Ray."""
import time
from pathlib import Path

import pytest
import torch

from hydro.examples.models import MLP
from hydro.profiling import fit_step_time_model
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from schedulers.placement.cluster import GpuType
from schedulers.placement.policies import ElasticEarliestFinish, HeterogeneityAware, PendingTrial
from tests.prediction.workload import grouped_sgd, mlp_without_input_bias
from tests.test_data_sources import splits
from tests.tune.workload import small_digits, spec

REPO = Path(__file__).resolve().parents[2]
# no per-step overhead: every decision below follows from the ratio of predicted works (the layers' FLOPs and
# bytes), not from how fast this shared CPU timed the layers
TYPES = {"fast": GpuType("fast", rate=4.0, overhead_s=0.0), "slow": GpuType("slow", rate=1.0, overhead_s=0.0)}
STEPS = 3 * 10  # spec(): 3 epochs of 320 samples in batches of 32
A = [("a1", {"lr": 0.1, "momentum": 0.9, "hidden": 16}), ("a2", {"lr": 0.05, "momentum": 0.0, "hidden": 16})]
B = [("b1", {"lr": 0.02, "momentum": 0.9, "hidden": 16}), ("b2", {"lr": 0.3, "momentum": 0.9, "hidden": 16})]
TARGET = [("t", {"lr": 0.05, "momentum": 0.9, "hidden": 1024})]


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, resources={"hydro_gpu:fast": 1, "hydro_gpu:slow": 1}, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield ray
    ray.shutdown()


def free(ray):
    available = ray.available_resources()
    return {t: available.get(f"hydro_gpu:{t}", 0.0) for t in TYPES}


def reference_epochs(workload, members, survivors):
    """The same members trained in this process: one epoch, keep the survivors, a second epoch."""
    trial = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, members), small_digits())
    trial.run_epoch()
    trial.keep([trial.member_ids.index(m) for m in survivors])
    return trial.run_epoch(), trial.state_dict()


def test_placement_by_predicted_finish_merge_and_release(fake_gpu_cluster):
    from hydro.tune.placement.elastic import ElasticPlacement, RunningTrial, predicted_work

    ray = fake_gpu_cluster
    fast, slow = TYPES["fast"], TYPES["slow"]
    workload = spec(model=mlp_without_input_bias)
    x = small_digits()[0][0][:32]
    model = fit_step_time_model(MLP((64, 1024, 10)), x, members=(1, 4))
    placement = ElasticPlacement(workload, TYPES, predicted_work(workload, model))
    assert isinstance(placement.policy, ElasticEarliestFinish)  # the default
    surrogate_a, surrogate_b = TrialPlan(TrialKind.SURROGATE, A), TrialPlan(TrialKind.SURROGATE, B)
    target = TrialPlan(TrialKind.TARGET, TARGET)
    assert placement.work(target) > 10 * placement.work(surrogate_a)  # predicted from the layers' FLOPs

    # both GPUs free: the surrogate finishes first on the fast one
    (a,), waiting = placement.launch([surrogate_a])
    assert not waiting and a.gpu_type == "fast"
    assert ray.get(a.actor.assigned_gpus.remote()) == ["hydro_gpu:fast"]
    assert placement.busy() == {"fast": [pytest.approx(STEPS * fast.step_seconds(a.work))]}

    # the target waits for the fast GPU (a's rest there + its own run there < its run on the slow one, reserved
    # for it); the surrogate behind it takes the free slow GPU rather than queue behind the target. Greedy gain,
    # which does not see when the fast GPU comes back, would put the target on the slow GPU.
    pending = [PendingTrial("t", placement.work(target)), PendingTrial("b", placement.work(surrogate_b))]
    assert HeterogeneityAware().place(pending, {"slow": 1}, TYPES) == [(0, "slow")]
    (b,), waiting = placement.launch([target, surrogate_b])
    assert b.gpu_type == "slow" and [w.plan for w in waiting] == [target]
    assert ray.get(b.actor.assigned_gpus.remote()) == ["hydro_gpu:slow"]
    assert free(ray) == {"fast": 0.0, "slow": 0.0}

    # progress: after one epoch each, two of three epochs left; a1 stops, and a's step work shrinks with it
    first = ray.get([a.actor.run_epoch.remote(), b.actor.run_epoch.remote()])
    assert all(len(m["val_loss"]) == 2 for m in first)
    assert placement.busy() == {"fast": [pytest.approx(20 * fast.step_seconds(a.work))],
                                "slow": [pytest.approx(20 * slow.step_seconds(b.work))]}
    ray.get(a.actor.keep.remote(["a2"]))
    a2_work = placement.work(TrialPlan(TrialKind.SURROGATE, A[1:]))
    assert a2_work < a.work and placement.busy()["fast"] == [pytest.approx(20 * fast.step_seconds(a2_work))]

    # a2 and b1 continue as one trial: both GPUs come back, the merged trial takes the fast one
    merged = placement.merge([a, b], {0: ["a2"], 1: ["b1"]})
    assert isinstance(merged, RunningTrial) and merged.gpu_type == "fast"
    assert ray.get(merged.actor.member_ids.remote()) == ["a2", "b1"]  # the merged trial's actor is up
    assert free(ray) == {"fast": 0.0, "slow": 1.0}  # two trials' GPUs returned, one taken by the merged trial
    assert placement.running == [merged]
    second = ray.get(merged.actor.run_epoch.remote())
    state = ray.get(merged.actor.state_dict.remote())
    assert placement.busy() == {"fast": [pytest.approx(10 * fast.step_seconds(merged.work))]}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the actors train
    try:
        expected_a, state_a = reference_epochs(workload, A, ["a2"])
        expected_b, state_b = reference_epochs(workload, B, ["b1"])
    finally:
        torch.set_num_threads(threads)
    for name in ("train_loss", "val_loss", "val_acc"):
        assert second[name] == expected_a[name].tolist() + expected_b[name].tolist()  # bit-identical
    weights = state["members"][0]["modules"][0]
    for key, value in weights.items():
        reference = torch.cat([state_a["members"][0]["modules"][0][key], state_b["members"][0]["modules"][0][key]])
        assert torch.equal(value, reference), key

    # the target still waits for the fast GPU while the merged trial's last epoch is the shorter wait ...
    started, waiting = placement.launch(waiting)
    assert not started and [w.plan for w in waiting] == [target]
    # ... and takes it once the merged trial ends
    placement.end([merged])
    assert free(ray) == {"fast": 1.0, "slow": 1.0}
    (t,), waiting = placement.launch(waiting)
    assert not waiting and t.gpu_type == "fast"
    assert ray.get(t.actor.assigned_gpus.remote()) == ["hydro_gpu:fast"]

    # a trial ended outside the placement stops counting as busy
    ray.kill(t.actor)
    wait_until_free(ray, {"fast": 1.0, "slow": 1.0})
    assert placement.busy() == {} and placement.running == []


def test_trials_whose_states_do_not_merge_keep_running(fake_gpu_cluster):
    """A merge that merge_states refuses (here: the trials' optimizers group parameters differently) ends no trial:
    each trains on with its survivors, on its GPU."""
    from hydro.tune.placement.elastic import ElasticPlacement

    ray = fake_gpu_cluster
    placement = ElasticPlacement(spec(optimizer=grouped_sgd), TYPES, lambda plan: 1.0, HeterogeneityAware())
    plans = [TrialPlan(TrialKind.SURROGATE, [(f"{name}{i}", {"lr": 0.1, "groups": groups}) for i in (1, 2)])
             for name, groups in (("g", True), ("w", False))]
    (a, b), waiting = placement.launch(plans)
    assert not waiting
    ray.get([a.actor.run_epoch.remote(), b.actor.run_epoch.remote()])
    with pytest.raises(ValueError, match="merge_states: the trials' optimizers differ in their parameter groups"):
        placement.merge([a, b], {0: ["g2"], 1: ["w1", "w2"]})
    assert placement.running == [a, b] and free(ray) == {"fast": 0.0, "slow": 0.0}
    assert ray.get([a.actor.member_ids.remote(), b.actor.member_ids.remote()]) == [["g2"], ["w1", "w2"]]
    second = ray.get([a.actor.run_epoch.remote(), b.actor.run_epoch.remote()])
    assert [len(metrics["val_loss"]) for metrics in second] == [1, 2]
    placement.end([a, b])
    assert free(ray) == {"fast": 1.0, "slow": 1.0}


def test_earliest_finish_needs_the_steps_of_an_epoch(fake_gpu_cluster):
    from hydro.tune.placement.elastic import ElasticPlacement

    streamed = spec(data=lambda: splits("stream"))  # an iterable dataset: batches per epoch unknown
    with pytest.raises(ValueError, match="iterable dataset.*policy=ElasticHeterogeneityAware"):
        ElasticPlacement(streamed, TYPES, lambda plan: 1.0)
    assert ElasticPlacement(streamed, TYPES, lambda plan: 1.0, HeterogeneityAware()).busy() == {}


def wait_until_free(ray, expected, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while free(ray) != expected:
        assert time.monotonic() < deadline, f"Ray did not free the killed actor's GPU: {free(ray)}"
        time.sleep(0.05)
