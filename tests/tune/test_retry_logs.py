"""A trial whose worker is killed before its first checkpoint and before its folder exists at the storage path (a
reused worker killed while it sets up a new trial; here the folder is removed when Tune decides to retry) is
retried and the run goes on: ``KeepResultsOnRetry`` makes the folder; no error of it can end ``Tuner.fit``."""
from __future__ import annotations

import math
import os

import logging
import shutil
from types import SimpleNamespace

from ray import tune

from hydro.tune import HydroSearcher, KeepResultsOnRetry, member_table, trainable
from tests.tune.test_searcher import Scripted
from tests.tune.workload import FaultAtEpoch, Recoveries, faults, spec


class RemoveTrialFolder(tune.Callback):
    """Removes a retried trial's folder at the storage path, before ``KeepResultsOnRetry`` sees the retry."""

    def __init__(self):
        self.removed = []

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.removed.append(os.path.isdir(trial.storage.trial_fs_path))
        shutil.rmtree(trial.storage.trial_fs_path, ignore_errors=True)


def test_a_trial_killed_before_its_first_checkpoint_and_folder_is_retried(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "100000")  # Ray copies nothing to the storage path on its own
    log = str(tmp_path / "faults")
    workload = spec(epochs=3, loss=FaultAtEpoch(1, log, fault="kill_once"), checkpoint_every=3)
    inner = Scripted([{"lr": 0.1, "momentum": 0.0}, {"lr": 0.05, "momentum": 0.9}])
    searcher = HydroSearcher(workload, inner, num_samples=2, fusion=2, transfer_fraction=None)
    folders, recoveries = RemoveTrialFolder(), Recoveries()
    results = tune.Tuner(
        trainable(workload), param_space={},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max"),
        run_config=tune.RunConfig(name="killed", storage_path=str(tmp_path / "runs"), verbose=0,
                                  callbacks=[folders, KeepResultsOnRetry(), recoveries],
                                  failure_config=tune.FailureConfig(max_failures=1))).fit()
    # every trial (the search fills both trial slots) reaches epoch 1's first batch once; the killed one twice
    # (killed, then trained through after its retry)
    assert len(recoveries.recovered) == 1 and len(faults(log)) == len(results) + 1
    assert folders.removed == [True]  # KeepResultsOnRetry found no folder to copy the result logs into
    assert not results.errors
    table = member_table(results, workload).set_index("member")
    assert (table["epochs"] == 3).all() and table["val_acc"].map(math.isfinite).all()
    frame = results[0].metrics_dataframe
    assert frame["epoch"].tolist() == [1, 2, 3]  # trained from the start again (no checkpoint)


class Failing:
    """A storage whose every operation raises."""

    def __getattr__(self, name):
        raise OSError(28, "No space left on device")


def test_an_error_of_the_recovery_callback_is_logged_not_raised(tmp_path, caplog):
    (tmp_path / "result.json").write_text("{}\n")
    trial = SimpleNamespace(trial_id="t1", local_path=str(tmp_path), storage=SimpleNamespace(
        syncer=Failing(), experiment_fs_path="/runs/x", trial_fs_path="/runs/x/t1", storage_filesystem=Failing()))
    with caplog.at_level(logging.WARNING, "hydro.tune.search.retry_logs"):
        KeepResultsOnRetry().on_trial_recover(1, [trial], trial)
    assert "could not copy trial t1's result logs to the storage path before its retry" in caplog.text
