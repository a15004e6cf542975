"""Where a trial's time goes: the unit times its set-up, training and evaluation, ``e2e_tuning`` sums the trials'
reports per stage (fresh workers' start, set-up, training, evaluation, checkpoints, idle gaps), and evaluation
runs at the training batch size on a GPU (the shapes training already autotuned)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.e2e_tuning import TIMES, stages
from hydro.trial.data import EVAL_BATCH, eval_batch_size
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec


def test_the_unit_times_its_set_up_training_and_evaluation():
    trial = FusedTrial(spec(), TrialPlan(TrialKind.SURROGATE, [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.2, "momentum": 0.9})]), small_digits())
    assert trial.build_s > 0 and trial.data_setup_s >= 0 and trial.train_s == trial.eval_s == 0
    trial.run_epoch()
    assert trial.train_s > 0 and trial.eval_s > 0


@pytest.mark.parametrize("batch,device,expected", [(128, "cuda", 128), (1000, "cuda", 1000), (128, "cpu", EVAL_BATCH),
                                                   (1000, "cpu", 1000)])
def test_evaluation_reuses_the_training_batch_size_on_a_gpu(batch, device, expected):
    assert eval_batch_size(batch, torch.device(device)) == expected


def _result(kind: TrialKind, scale: int, members: int, worker: float, start: float, end: float, trials: int,
            **times: float) -> SimpleNamespace:
    plan = TrialPlan(kind, [(f"m{i}", {}) for i in range(members)], scale=scale)
    metrics = {"trial_started_at": start, "worker_started_at": worker, "worker_trials": trials, "reported_at": end,
               **{name: times.get(name, 0.0) for name in TIMES[1:]}}
    return SimpleNamespace(config=plan.to_config(), metrics=metrics)


def test_stages_sum_their_trials_times_and_the_idle_gaps_between_them():
    results = [  # a fresh worker (started before the run) for the first S=4 trial, one reused for S=2 after an idle
                 # second, a fresh one for the target
        _result(TrialKind.SURROGATE, 4, 8, worker=95.0, start=102.0, end=110.0, trials=1, setup_build_s=1.5,
                train_s=5.0, eval_s=0.5),
        _result(TrialKind.SURROGATE, 4, 8, worker=90.0, start=103.0, end=111.0, trials=3, setup_plan_s=0.25,
                train_s=6.0, checkpoint_s=0.1),
        _result(TrialKind.SURROGATE, 2, 4, worker=100.0, start=112.0, end=120.0, trials=2, setup_data_s=0.2,
                train_s=7.0),
        _result(TrialKind.TARGET, 1, 1, worker=119.0, start=121.5, end=130.0, trials=1, train_s=8.0)]
    timeline = stages(results, started_at=100.0)
    assert [(s["stage"], s["members"]) for s in timeline] == [("S=4", [8, 8]), ("S=2", [4]), ("target", [1])]
    first, second, target = timeline
    assert (first["start_s"], first["end_s"], first["idle_before_s"]) == (0.0, 11.0, 0.0)
    assert first["worker_start_s"] == 2.0 and first["train_s"] == 11.0 and first["setup_build_s"] == 1.5
    assert first["setup_plan_s"] == 0.25 and first["eval_s"] == 0.5 and first["checkpoint_s"] == 0.1
    assert (second["start_s"], second["idle_before_s"], second["worker_start_s"]) == (12.0, 1.0, 0.0)
    assert (target["start_s"], target["idle_before_s"], target["worker_start_s"]) == (19.0, 0.0, 2.5)
    assert [s["new_workers"] for s in timeline] == [1, 0, 1]  # the trials that started a fresh worker
