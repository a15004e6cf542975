"""The returned full-size target, also when fallback targets trained: the best target's checkpoint is what
``best_configuration`` (``hydro_best.json``) and ``target_result`` name and what ``load_model(run_dir)`` loads; the
member table puts it first. Trials are real (trained with ``FusedTrial``), their results built as Tune gives them."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest
import torch
from ray import tune

from hydro.examples.models import MLP
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune import load_model
from hydro.tune.search.results import BEST_FILE, MODEL_FILE, best_configuration, member_table, target_result, write_results
from hydro.tune.search.trainable import STATE_FILE
from tests.tune.workload import small_digits, spec


def trained_target(directory, workload, lr: float, trial_id: str) -> tune.Result:
    """A full-size µP target trained one epoch with ``lr``, checkpointed in ``directory``, as Tune's result."""
    config = {"lr": lr, "momentum": 0.9}
    plan = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], scale=1, mup=True)
    trial = FusedTrial(workload, plan, small_digits())
    trial.run_epoch()
    os.makedirs(directory / "checkpoint_000000")
    torch.save(trial.state_dict(), directory / "checkpoint_000000" / STATE_FILE)
    _, (x, y) = small_digits()
    trial.members.train(False)
    with torch.no_grad():
        acc = (trial.members(x)[0].argmax(-1) == y).float().mean().item()
    row = {"epoch": 1, "train_loss": 1.0, "val_loss": 1.0, "val_acc": acc, "stopped": False}
    return tune.Result(metrics={"config": {**config, **plan.to_config()}, "trial_id": trial_id, **row},
                       checkpoint=tune.Checkpoint(str(directory / "checkpoint_000000")), error=None,
                       path=str(directory), metrics_dataframe=pd.DataFrame([row]))


def test_the_best_of_several_targets_is_returned_printed_written_and_loaded(tmp_path):
    workload = spec(model=lambda config: MLP((64, 64, 64, 10)))
    first = trained_target(tmp_path / "first", workload, 1e-3, "first")  # the first target: barely trained
    fallback = trained_target(tmp_path / "fallback", workload, 0.1, "fallback")
    assert fallback.metrics["val_acc"] > first.metrics["val_acc"]
    results = [first, fallback]

    assert target_result(results, workload) is fallback
    best = best_configuration(results, workload)
    assert best["trial"] == "fallback" and best["checkpoint"] == fallback.checkpoint.path
    assert best["config"] == {"lr": 0.1, "momentum": 0.9}
    table = member_table(results, workload)
    assert list(table["trial"]) == ["fallback", "first"]  # the returned target is the first row

    _, best_path = write_results(results, workload, str(tmp_path))
    with open(best_path) as f:
        assert json.load(f)["checkpoint"] == fallback.checkpoint.path
    model = load_model(str(tmp_path))  # the run directory alone
    expected = load_model(fallback, workload)
    assert type(model) is MLP and not model.training and os.path.exists(tmp_path / MODEL_FILE)
    _, (x, _) = small_digits()
    with torch.no_grad():
        assert torch.equal(model(x), expected(x))
    assert os.path.basename(best_path) == BEST_FILE


def test_load_model_needs_a_run_directory_with_a_model_or_a_result_with_its_spec(tmp_path):
    with pytest.raises(ValueError, match="holds no trained full-size model"):
        load_model(str(tmp_path))
    with pytest.raises(TypeError, match=r"load_model\(result, spec\)"):
        load_model(tune.Result(metrics={}, checkpoint=None, error=None, path=str(tmp_path)))
