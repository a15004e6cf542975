"""A plain ``tune.Tuner`` with ``search_alg=HydroSearcher(...)`` and nothing else of Hydro's: it behaves as
``hydro.tune.fit`` does — member progress in place of Ray's trial reporter, the member table, best configuration and
trained full-size model written to the run directory, the trials' resources read from the trainable, so that the
search spreads over the cluster's trial slots (a local cluster of 2 CPUs, 1 CPU per trial: 2 slots)."""
from __future__ import annotations

import json
import logging
import os

import pandas as pd
import pytest
import torch
from ray import tune

from hydro.tune import HydroSearcher, load_model, trainable
from hydro.tune.search.results import BEST_FILE, MEMBER_TABLE_FILE, MODEL_FILE, target_result
from tests.tune.real_workloads import width_not_grouped
from tests.tune.workload import SPACE, small_digits, spec


def test_a_plain_tuner_reports_members_writes_the_results_and_fills_the_slots(ray_cluster, tmp_path, caplog, capsys):
    workload = spec(epochs=1)
    searcher = HydroSearcher(workload, num_samples=4, scale=2, fusion=4, seed=0)
    tuner = tune.Tuner(trainable(workload), param_space=SPACE,
                       tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1),
                       run_config=tune.RunConfig(name="plain", storage_path=str(tmp_path)))
    with caplog.at_level(logging.INFO, logger="hydro.tune"):
        results = tuner.fit()
    out = capsys.readouterr().out
    assert "Number of trials" not in out and "Trial status" not in out, out  # Ray's header and trial table
    progress = [r.getMessage() for r in caplog.records if r.name == "hydro.tune.search.progress"]
    assert progress[-1].startswith("members: 0 running, 0 stopped early, 4 finished, 0 failed, 0 to start"), progress
    # The trials' resources (1 CPU, the trainable's default) were read before the first trial: 2 trial slots, so
    # the 4 members trained in 2 fused trials of 2 rather than one trial of 4 on one slot.
    assert searcher.state.trial_request["CPU"] == 1.0
    table = pd.read_csv(os.path.join(results.experiment_path, MEMBER_TABLE_FILE))
    members = table[table["kind"] == "surrogate"]
    assert len(members) == 4 and members["trial"].nunique() == 2
    assert table.iloc[0]["kind"] == "target"  # the returned target first
    with open(os.path.join(results.experiment_path, BEST_FILE)) as f:
        best = json.load(f)
    target = target_result(results)  # no spec: the run's metric and mode (the searcher's)
    assert best["kind"] == "target" and best["checkpoint"] == target.checkpoint.path
    assert best["value"] == pytest.approx(target.metrics["val_acc"])
    # The trained full-size model, from the run directory alone, scores what the target reported.
    model = load_model(results.experiment_path)
    assert os.path.exists(os.path.join(results.experiment_path, MODEL_FILE))
    _, (x, y) = small_digits()
    with torch.no_grad():
        assert (model(x).argmax(-1) == y).float().mean().item() == pytest.approx(best["value"], abs=1e-6)
    assert "RAY_TUNE_CALLBACKS" not in os.environ  # the hook is restored once the run's callbacks are made


def test_a_plain_tuner_refuses_a_key_outside_group_by_before_the_first_trial(ray_cluster, tmp_path):
    workload, space = width_not_grouped()
    searcher = HydroSearcher(workload, num_samples=4, scale=4)
    tuner = tune.Tuner(trainable(workload), param_space=space,
                       tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1),
                       run_config=tune.RunConfig(name="grouped", storage_path=str(tmp_path)))
    with pytest.raises(Exception, match=r"TuneSpec.group_by misses 'width'.*TuneSpec\(group_by=\['width'\]\)"):
        tuner.fit()
    assert not searcher.driver.state.ledger.trials  # no trial started
    assert "RAY_TUNE_CALLBACKS" not in os.environ
