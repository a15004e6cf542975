"""Heterogeneity-aware, elastic placement on a real local Ray cluster with two fake GPU types (custom
resources): trials land where the step-time model predicts, merged survivors continue bit-identically, and
the merged trials' resources go back to Ray."""
from pathlib import Path

import pytest
import torch

from hydro.examples.models import MLP
from hydro.profiling import fit_step_time_model
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from schedulers.placement.cluster import GpuType
from schedulers.placement.policies import HeterogeneityAware
from tests.prediction.workload import mlp_without_input_bias
from tests.tune.workload import small_digits, spec

REPO = Path(__file__).resolve().parents[2]
TYPES = {"fast": GpuType("fast", rate=4.0, overhead_s=0.002), "slow": GpuType("slow", rate=1.0, overhead_s=0.002)}
A = [("a1", {"lr": 0.1, "momentum": 0.9, "hidden": 16}), ("a2", {"lr": 0.05, "momentum": 0.0, "hidden": 16})]
B = [("b1", {"lr": 0.02, "momentum": 0.9, "hidden": 16}), ("b2", {"lr": 0.3, "momentum": 0.9, "hidden": 16})]
TARGET = [("t", {"lr": 0.05, "momentum": 0.9, "hidden": 1024})]



@pytest.fixture(scope="module")
def fake_gpu_cluster():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, resources={"hydro_gpu:fast": 1, "hydro_gpu:slow": 1}, include_dashboard=False,
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


def test_placement_by_prediction_merge_and_release(fake_gpu_cluster):
    from hydro.tune.placement import ElasticPlacement, predicted_work

    ray = fake_gpu_cluster
    workload = spec(model=mlp_without_input_bias)
    x = small_digits()[0][0][:32]
    model = fit_step_time_model(MLP((64, 1024, 10)), x, members=(1, 4))
    placement = ElasticPlacement(workload, TYPES, HeterogeneityAware(), predicted_work(workload, model))
    surrogate_a, target = TrialPlan(TrialKind.SURROGATE, A), TrialPlan(TrialKind.TARGET, TARGET)
    assert placement.work(target) > 10 * placement.work(surrogate_a)  # predicted from the layers' FLOPs

    # the full-size target lands on the fast type, the small surrogate on the slow one
    (a, t), waiting = placement.launch([surrogate_a, target])
    assert not waiting and (a.gpu_type, t.gpu_type) == ("slow", "fast")
    assert ray.get(a.actor.assigned_gpus.remote()) == ["hydro_gpu:slow"]
    assert ray.get(t.actor.assigned_gpus.remote()) == ["hydro_gpu:fast"]
    assert free(ray) == {"fast": 0.0, "slow": 0.0}
    ray.kill(t.actor)

    # a second surrogate; after one epoch a1 and b2 stop and the survivors continue as one trial
    (b,), _ = _launch_when_free(placement, TrialPlan(TrialKind.SURROGATE, B))
    first = ray.get([a.actor.run_epoch.remote(), b.actor.run_epoch.remote()])
    assert all(len(m["val_loss"]) == 2 for m in first)
    assert sum(free(ray).values()) == 0
    merged = placement.merge([a, b], {0: ["a2"], 1: ["b1"]})
    assert ray.get(merged.actor.member_ids.remote()) == ["a2", "b1"]  # the merged trial's actor is up
    assert sum(free(ray).values()) == 1  # two trials' GPUs returned, one taken by the merged trial
    second = ray.get(merged.actor.run_epoch.remote())
    state = ray.get(merged.actor.state_dict.remote())

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

    ray.kill(merged.actor)
    placement._await_release({"fast": 0, "slow": 0} | {merged.gpu_type: 0}, [merged.gpu_type], 30)
    assert free(ray) == {"fast": 1.0, "slow": 1.0}


def _launch_when_free(placement, plan):
    """Launch once the killed target's GPU is back."""
    placement._await_release({"fast": 0, "slow": 0}, ["fast"], 30)
    running, waiting = placement.launch([plan])
    assert not waiting
    return running, waiting
