"""A trial restored after its first member was stopped writes its
per-member columns aligned in ``progress.csv`` (Ray's CSV logger writes a restored trial's rows under the old
header, so a result whose key set had shrunk was misaligned and a member showed 0 epochs)."""
from __future__ import annotations

import math

import pandas as pd
from ray import tune

from hydro.tune import HydroSearcher, member_table, trainable
from tests.tune.test_tune_integration import InterruptOnce
from tests.tune.workload import SPACE, StopFirstMemberAfterEpoch1, spec


def test_restored_trial_keeps_every_members_rows_aligned(ray_cluster, tmp_path):
    workload = spec(epochs=4, checkpoint_every=1)
    searcher = HydroSearcher(workload, num_samples=3, fusion=3, seed=0, transfer_fraction=None,
                             scheduler=StopFirstMemberAfterEpoch1(), trial_resources={})  # {}: one fused trial
    # Ctrl+C after the epoch-2 result (checkpoints from epoch 1 on hold m00001 and m00002 only), then a restored
    # run: a new CSV logger continues the trial's progress.csv under the header of its first run.
    interrupt = InterruptOnce(2, tmp_path / "fired")
    first = tune.Tuner(
        trainable(workload), param_space=SPACE,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max",
                                    reuse_actors=True),
        run_config=tune.RunConfig(name="aligned", storage_path=str(tmp_path), verbose=0, callbacks=[interrupt])).fit()
    (interrupted,) = first
    assert interrupted.metrics["epoch"] < 4
    results = tune.Tuner.restore(str(tmp_path / "aligned"), trainable(workload), resume_unfinished=True).fit()
    assert not results.errors
    (result,) = results
    rows = pd.read_csv(f"{result.path}/progress.csv")
    epochs = rows["epoch"].tolist()
    assert epochs[:2] == [1, 2] and epochs[-1] == 4 and epochs.count(1) == 1  # resumed from a checkpoint
    for _, row in rows.iterrows():  # each member's columns hold that member's values of the row's epoch
        assert row["members/m00000/epoch"] == 1 if row["epoch"] == 1 else math.isnan(row["members/m00000/epoch"])
        assert row["members/m00001/epoch"] == row["epoch"] and row["members/m00002/epoch"] == row["epoch"]
        assert row["members/m00001/training_iteration"] == row["epoch"]
        assert 0 <= row["members/m00002/val_acc"] <= 1 and row["members/m00001/train_loss"] > 0
    table = member_table(results, workload).set_index("member")
    assert table.loc["m00000", "stop_epoch"] == 1 and table.loc["m00000", "epochs"] == 1
    assert (table.loc[["m00001", "m00002"], "epochs"] == 4).all()
