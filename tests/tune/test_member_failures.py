"""Bad members and bad set-ups on a real local Ray cluster, through ``tune.Tuner`` as a Ray user writes it: a
Tune scheduler given to Tune is refused at start; invalid members are rejected before their trial (the inner
searcher hears they failed) while their siblings train; a fused trial that cannot be built, or whose loss raises
mid-training, ends once, not retried, its members failed with the cause and their earlier epochs kept; a NaN
member is stopped by per-member ASHA on a loss metric; trial directories stay short."""
from __future__ import annotations

import math
import os

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from hydro.tune import HydroSearcher, best_configuration, member_table, trainable
from tests.tune.test_searcher import Scripted
from tests.tune.workload import SPACE, FaultAtEpoch, Recoveries, faults, mlp_or_untraceable, spec


class ValLoss(Scripted):
    """``Scripted`` on the ``val_loss`` objective."""

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result["val_loss"]))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append((trial_id, None if result is None else result["val_loss"], error))


def test_bad_members_fail_alone_and_nan_members_stop_on_a_loss_metric(ray_cluster, tmp_path):
    ok = {"momentum": 0.0, "kind": "ok"}
    configs = [{"lr": 0.1, **ok}, {"lr": math.nan, **ok},           # m00001 diverges: NaN from its first step
               {"lr": -0.01, **ok}, dict(ok),                         # rejected: negative lr, no lr at all
               {"lr": 0.1, "momentum": 0.0, "kind": "untraceable"},  # a fused pair that cannot be built
               {"lr": 0.2, "momentum": 0.0, "kind": "untraceable"}]
    workload = spec(epochs=3, model=mlp_or_untraceable, metric="val_loss", mode="min", group_by=["kind"])
    inner = ValLoss(configs)
    searcher = HydroSearcher(workload, inner, num_samples=6, fusion=2, transfer_fraction=None,
                             scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2))
    recoveries = Recoveries()
    results = tune.Tuner(
        trainable(workload), param_space={},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_loss", mode="min",
                                    reuse_actors=True),
        run_config=tune.RunConfig(name="bad", storage_path=str(tmp_path), verbose=0, callbacks=[recoveries],
                                  failure_config=tune.FailureConfig(max_failures=2))).fit()
    completed = {member: (value, error) for member, value, error in inner.completed}
    assert sorted(completed) == [f"m0000{i}" for i in range(6)]
    # Rejected before any trial, with the optimizer's or the model's own message; told to the inner searcher.
    rejected = searcher.rejected_members()
    assert sorted(rejected) == ["m00002", "m00003"]
    assert rejected["m00002"][1] == "ValueError: Invalid learning rate: -0.01"
    assert rejected["m00003"][1] == "KeyError: 'lr'"
    assert completed["m00002"] == (None, True) and completed["m00003"] == (None, True)
    # The unfusable pair: its trial ended once with the cause (no retry), its members failed.
    assert recoveries.recovered == []
    assert completed["m00004"] == (None, True) and completed["m00005"] == (None, True)
    table = member_table(results, workload).set_index("member")
    assert table.loc["m00004", "error"] and table.loc["m00005", "error"] and table.loc["m00004", "epochs"] == 0
    failed = next(r for r in results if r.metrics.get("hydro_error"))
    assert failed.metrics["hydro_error"].startswith("FuseError: hydro.fuse: torch.fx cannot trace Untraceable")
    # Its sibling trained to the end; the NaN member stopped at ASHA's first rung, on val_loss (mode min).
    assert completed["m00000"][1] is not None and math.isfinite(completed["m00000"][1])
    assert table.loc["m00000", "epochs"] == 3 and not table.loc["m00000", "error"]
    assert table.loc["m00001", "stop_epoch"] == 1 and math.isnan(table.loc["m00001", "val_loss"])
    # Trial directories are named after the plan, not every member's configuration.
    names = [d for d in os.listdir(results.experiment_path) if d.startswith("hydro_trial")]
    assert len(names) == 2 and all("hydro=surrogate_m0000" in n and "lr=" not in n for n in names), names


def test_a_loss_that_raises_mid_training_fails_its_members_once_with_the_cause_and_siblings_go_on(ray_cluster,
                                                                                                  tmp_path):
    log = str(tmp_path / "faults")
    workload = spec(epochs=3, loss=FaultAtEpoch(2, log), checkpoint_every=1)  # raises in epoch 2 at batch size 32
    inner = Scripted([{"lr": 0.1, "momentum": 0.0, "batch_size": b} for b in (32, 32, 16, 16)])
    searcher = HydroSearcher(workload, inner, num_samples=4, fusion=2, transfer_fraction=None)
    recoveries = Recoveries()
    results = tune.Tuner(
        trainable(workload), param_space={},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max"),
        run_config=tune.RunConfig(name="raises", storage_path=str(tmp_path), verbose=0, callbacks=[recoveries],
                                  failure_config=tune.FailureConfig(max_failures=1))).fit()
    # Raised in one process only (the fused loss, then each member's own: every member raised), not retried; the
    # trial ends with the cause instead of a Tune error.
    assert len(set(faults(log))) == 1 and recoveries.recovered == [] and not results.errors
    failed = next(r for r in results if r.metrics.get("hydro_error"))
    assert failed.metrics["hydro_error"] == "ZeroDivisionError: fault injected by the test's loss in epoch 2"
    assert "Traceback" in failed.metrics["hydro_traceback"] and "in __call__" in failed.metrics["hydro_traceback"]
    # Its members failed with their epoch-1 results (the inner searcher heard them once); their siblings of the
    # other trial (batch size 16) trained to the end.
    completed = {member: (value, error) for member, value, error in inner.completed}
    assert sorted(completed) == [f"m0000{i}" for i in range(4)]
    assert all(completed[m][1] and math.isfinite(completed[m][0]) for m in ("m00000", "m00001"))
    assert all(not completed[m][1] and math.isfinite(completed[m][0]) for m in ("m00002", "m00003"))
    assert searcher.member_results()["m00000"]["epoch"] == 1
    table = member_table(results, workload).set_index("member")
    assert table.loc[["m00000", "m00001"], "error"].all() and (table.loc[["m00000", "m00001"], "epochs"] == 1).all()
    assert not table.loc[["m00002", "m00003"], "error"].any() and (table.loc[["m00002", "m00003"], "epochs"] == 3).all()
    assert best_configuration(results, workload)["member"] in ("m00002", "m00003")  # never a failed member


def test_a_tune_scheduler_given_to_tune_is_refused_at_start(ray_cluster, tmp_path):
    workload = spec(epochs=2)
    searcher = HydroSearcher(workload, num_samples=4, fusion=2)
    tuner = tune.Tuner(
        trainable(workload), param_space=SPACE,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max",
                                    scheduler=ASHAScheduler(max_t=2)),
        run_config=tune.RunConfig(name="refused", storage_path=str(tmp_path), verbose=0))
    with pytest.raises(Exception) as raised:
        tuner.fit()
    message = "".join(str(e) for e in _chain(raised.value))
    assert ("hydro: TuneConfig(scheduler=AsyncHyperBandScheduler(...)) with a HydroSearcher would compare whole "
            "fused trials, not members, and stop nothing; pass it as HydroSearcher(..., "
            "scheduler=AsyncHyperBandScheduler(...)) and leave TuneConfig.scheduler unset") in message
    assert not any(d.startswith("hydro_trial") for d in os.listdir(tmp_path / "refused"))  # no trial started


def _chain(error):
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__
