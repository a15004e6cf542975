"""The lower-level path: a user's own training loop reporting per member through ``MemberSession``."""
from __future__ import annotations

import math

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.tune import HydroSearcher, MemberSession, member_table
from tests.tune.workload import EPOCHS, SPACE, custom_loop, spec



def test_custom_loop_with_per_member_asha(ray_cluster, tmp_path):
    workload = spec(epochs=EPOCHS)
    searcher = HydroSearcher(workload, num_samples=6, fusion=6, transfer_fraction=None, seed=2,
                             scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2))
    results = tune.Tuner(custom_loop, param_space=SPACE,
                         tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max"),
                         run_config=tune.RunConfig(storage_path=str(tmp_path), name="custom", verbose=0)).fit()
    assert not results.errors
    table = member_table(results, workload)
    assert len(table) == 6 and table["stop_epoch"].notna().any() and (table["epochs"] == EPOCHS).any()
    assert sorted(searcher.member_results()) == sorted(table["member"])


def test_missing_metric_names_it_and_the_reported_keys():
    session = MemberSession({"lr": 0.1}, metric="val_acc", mode="max")  # a plain trial: no Ray needed here
    with pytest.raises(KeyError, match=r"'val_acc' is not among the reported metrics \['accuracy', 'loss'\]"):
        session.step(1, {"loss": [0.5], "accuracy": [0.9]})


def test_a_diverged_member_reports_nan_for_every_metric():
    """NaN logits still give an accuracy (argmax picks a class): a member with a non-finite loss reports NaN
    for every metric, so stopping rules and the ranking treat it as the worst on any metric."""
    plan = TrialPlan(TrialKind.SURROGATE, [("m00000", {}), ("m00001", {})], reports_objective=True)
    session = MemberSession(plan.to_config(), metric="val_acc", mode="max")  # no stopping service: no Ray here
    session.step(1, {"train_loss": [0.5, math.nan], "val_loss": [0.4, math.inf], "val_acc": [0.9, 0.1]})
    members = session._pending["members"]
    assert members["m00000"]["val_acc"] == 0.9 and members["m00000"]["val_loss"] == 0.4
    assert all(math.isnan(members["m00001"][k]) for k in ("train_loss", "val_loss", "val_acc"))
    assert session._pending["val_acc"] == 0.9  # the trial's objective: its best finite member
