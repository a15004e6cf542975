"""Trials on the GPUs Ray gives them: resources from gpus_per_trial, the device each trial resolves, and every
tensor of a trial on that device. This machine has no GPU: the local cluster declares one (Ray schedules and
assigns it), and torch, which has no CUDA here, trains on the CPU standing in through the same code path."""
from __future__ import annotations

import logging

import pytest
import ray
import torch

from hydro.trial.device import resolve_device
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial, Observer
from hydro.tune.run import fit
from hydro.tune.search.trainable import trial_resources
from tests.conftest import REPO
from tests.tune.workload import SPACE, small_digits, spec

CONFIGS = [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.01, "momentum": 0.0})]


@pytest.fixture(scope="module")
def one_gpu_cluster():
    """A local Ray cluster that declares one GPU (2 CPUs, no dashboard)."""
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


def test_auto_device_follows_the_assigned_gpus(monkeypatch, caplog):
    assert resolve_device("auto", []) == torch.device("cpu")
    assert resolve_device("cpu", ["0"]) == torch.device("cpu")
    with caplog.at_level(logging.WARNING):
        assert resolve_device("auto", ["0"]) == torch.device("cpu")  # this torch has no CUDA: the CPU stands in
    assert "GPUs ['0'] were assigned" in caplog.text
    with pytest.raises(RuntimeError, match="device='cuda'.*gpus_per_trial"):
        resolve_device("cuda", [])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto", ["3"]) == torch.device("cuda", 0)  # Ray's CUDA_VISIBLE_DEVICES=3 -> cuda:0
    assert resolve_device("auto", []) == torch.device("cpu")  # a trial without GPUs stays on the CPU
    assert resolve_device("auto", None) == torch.device("cuda", 0)  # outside Ray: what the process sees


def test_bad_resources_fail_before_anything_runs():
    with pytest.raises(ValueError, match="gpus_per_trial must be a fraction"):
        trial_resources(spec(), gpus_per_trial=1.5)
    with pytest.raises(ValueError, match="device='cuda' but gpus_per_trial=0"):
        trial_resources(spec(device="cuda"))
    with pytest.raises(ValueError, match="TuneSpec.device must be 'auto' or a torch device"):
        spec(device="gpu")
    assert trial_resources(spec(), 2, 0.5) == {"cpu": 2, "gpu": 0.5}


class Devices(Observer):
    def __init__(self):
        self.seen = set()

    def on_step_end(self, trial, losses):
        self.seen.add(losses.device.type)


@pytest.mark.parametrize("kind", [TrialKind.SURROGATE, TrialKind.PLAIN])
def test_every_tensor_of_a_trial_lives_on_its_device(kind):
    """The meta device holds no data and its elementwise ops refuse CPU operands; every tensor a trial holds
    (members, optimizer state, data, losses, metrics) must be on the trial's device."""
    with pytest.raises(RuntimeError, match="not on the expected device"):
        torch.ones(2, 3, device="meta") + torch.ones(2, 3)
    members = CONFIGS if kind is TrialKind.SURROGATE else CONFIGS[:1]
    observer = Devices()
    trial = FusedTrial(spec(), TrialPlan(kind, members), small_digits(), device="meta", observers=[observer])
    metrics = trial.run_epoch()
    assert {t.device.type for t in metrics.values()} == {"meta"} and observer.seen == {"meta"}
    optimizers = trial.members.optimizers()
    tensors = [*(t for m in trial.modules() for t in [*m.parameters(), *m.buffers()]),
               *(t for o in optimizers for s in o.state.values() for t in s.values() if isinstance(t, torch.Tensor)),
               *(t for split in trial.data for t in (split.x, split.y))]
    assert {t.device.type for t in tensors} == {"meta"}
    assert any(o.state for o in optimizers)  # momentum buffers exist (and are on the device)


def test_trials_given_half_a_gpu_each_train_on_the_device_they_resolve(one_gpu_cluster, tmp_path):
    results, _ = fit(spec(epochs=2), SPACE, num_samples=4, fusion=2, gpus_per_trial=0.5, transfer_fraction=None,
                     storage_path=str(tmp_path), name="gpu", verbose=0, seed=0)
    assert not results.errors and len(results) == 2
    for result in results:
        assert result.metrics["gpu_ids"] == "0"  # Ray gave each trial (half of) the cluster's one GPU
        assert (result.metrics["trial_cpus"], result.metrics["trial_gpus"]) == (1.0, 0.5)  # ... and it reports that
        assert result.metrics["device"] == "cpu"  # ... and the trial resolved it: CPU standing in for CUDA
        assert result.metrics["epoch"] == 2 and result.metrics["live_members"] == 0


def test_a_trial_out_of_memory_splits_its_members_and_later_trials_get_fewer(one_gpu_cluster, tmp_path):
    from tests.test_memory_split import FITS_TWO

    workload = spec(epochs=1, memory_budget_bytes=FITS_TWO)  # 4 fused members do not fit, 2 do
    results, searcher = fit(workload, SPACE, num_samples=8, fusion=4, transfer_fraction=None, max_concurrent_trials=1,
                            storage_path=str(tmp_path), name="oom", verbose=0, seed=0)
    assert not results.errors and len(searcher.member_results()) == 8  # every member finished
    sizes = sorted((r.metrics["max_fusion"], len(r.config["hydro"].members)) for r in results)
    assert sizes == [(2, 2), (2, 2), (2, 4)]  # the first trial split 4 -> 2 + 2; the searcher then planned 2


def test_with_gpus_fusion_is_planned_in_the_trials_not_the_driver(one_gpu_cluster, tmp_path):
    results, searcher = fit(spec(epochs=1), SPACE, num_samples=4, fusion="auto", max_fusion=4, gpus_per_trial=1,
                            transfer_fraction=None, storage_path=str(tmp_path), name="planned", verbose=0, seed=0)
    assert not results.errors and len(searcher.member_results()) == 4
    assert type(searcher._planner).__name__ == "FixedFusion"  # the driver handed out max_fusion, measured nothing
    (result,) = results  # one trial of the 4 members, which planned how many to fuse on its device (CPU here)
    assert len(result.config["hydro"].members) == 4 and 1 <= result.metrics["max_fusion"] <= 4
    assert result.metrics["device"] == "cpu" and result.metrics["gpu_ids"] == "0"
