"""What a user gets back from ``hydro.tune.run.fit``: member progress instead of Ray's trial table, the best
result's config as their own configuration, member table and best configuration on disk, the trained
full-size model as their own class (``load_model``), and early-stopped members as PRUNED in Optuna."""
from __future__ import annotations

import logging
import os

import pytest
import torch
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from hydro.examples.models import MLP
from hydro.trial.plan import HYDRO_KEY, TARGET_MEMBER_ID, TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from hydro.tune import load_model, member_table
from hydro.tune.search.results import BEST_FILE, MEMBER_TABLE_FILE
from hydro.tune.run import fit
from hydro.tune.search.trainable import STATE_FILE
from tests.tune.workload import SPACE, small_digits, spec


def accuracy_of(model):
    _, (x, y) = small_digits()
    with torch.no_grad():
        return (model(x).argmax(-1) == y).float().mean().item()


def test_fit_reports_members_and_returns_the_users_configuration_and_model(ray_cluster, tmp_path, caplog, capsys):
    from optuna.samplers import TPESampler
    from optuna.trial import TrialState
    from ray.tune.search.optuna import OptunaSearch

    workload = spec(epochs=3)
    optuna = OptunaSearch(sampler=TPESampler(seed=0))
    with caplog.at_level(logging.INFO, logger="hydro.tune.search.progress"):
        results, searcher = fit(workload, SPACE, num_samples=6, fusion=3, searcher=optuna, seed=0,
                                scheduler=ASHAScheduler(max_t=3, grace_period=1, reduction_factor=2),
                                storage_path=str(tmp_path), name="api")
    assert "Number of trials" not in capsys.readouterr().out  # no Ray trial table
    table = member_table(results, workload)
    members = table[table["kind"] == "fused"]  # full-size members of fused trials
    stopped = members[members["stop_epoch"].notna()]
    assert len(members) == 6 and len(stopped) >= 1
    # The last progress line counts members, names the best one and the target.
    last = [r.getMessage() for r in caplog.records if r.name == "hydro.tune.search.progress"][-1]
    top = members.iloc[0]
    assert last.startswith(f"members: 0 running, {len(stopped)} stopped early, {6 - len(stopped)} finished, 0 failed, "
                           f"0 to start | best member: {top['member']} val_acc={top['val_acc']:.4g} | "
                           f"target: finished (epoch 3, val_acc="), last
    # The best result is the target; its config is the user's configuration, Hydro's plan under its own key.
    best = results.get_best_result()
    assert set(best.config) == {"lr", "momentum", HYDRO_KEY} and best.config[HYDRO_KEY].kind == TrialKind.TARGET
    assert best.config["lr"] == top["config/lr"]
    surrogate_configs = [r.config for r in results if r.config[HYDRO_KEY].kind == TrialKind.SURROGATE]
    assert surrogate_configs and all(c["lr"] is None and c["momentum"] is None for c in surrogate_configs)
    assert os.path.exists(os.path.join(results.experiment_path, MEMBER_TABLE_FILE))
    assert os.path.exists(os.path.join(results.experiment_path, BEST_FILE))
    # The trained full-size model, as the user's class, scores what the target reported.
    model = load_model(best, workload)
    assert type(model) is MLP and not model.training
    assert accuracy_of(model) == pytest.approx(best.metrics["val_acc"], abs=1e-6)
    # Members stopped early are PRUNED in Optuna, with their last value; the others COMPLETE.
    study = optuna._ot_study
    for _, row in members.iterrows():
        trial = study.trials[optuna._ot_trials[row["member"]].number]
        if pd_notna(row["stop_epoch"]):
            assert trial.state == TrialState.PRUNED
            assert trial.intermediate_values[trial.last_step] == pytest.approx(row["val_acc"])
        else:
            assert trial.state == TrialState.COMPLETE and trial.value == pytest.approx(row["val_acc"])


def pd_notna(value) -> bool:
    return value is not None and value == value


def test_load_model_returns_a_mup_target_as_the_users_module(tmp_path):
    """The target of a shrunk run trains in µP (fused, F=1); load_model gives the user's plain module."""
    workload = spec(model=lambda config: MLP((64, 64, 64, 10)))
    config = {"lr": 0.05, "momentum": 0.9}
    plan = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], scale=1, mup=True)
    trial = FusedTrial(workload, plan, small_digits())
    trial.run_epoch()
    torch.save(trial.state_dict(), tmp_path / STATE_FILE)
    result = tune.Result(metrics={"config": {**config, **plan.to_config()}}, checkpoint=tune.Checkpoint(str(tmp_path)),
                         error=None, path=str(tmp_path))
    model = load_model(result, workload)
    assert type(model) is MLP and not any(hasattr(p, "hydro_mup") for p in model.parameters())
    _, (x, _) = small_digits()
    trial.members.train(False)
    with torch.no_grad():
        assert torch.equal(model(x), trial.members(x)[0])
    surrogate = TrialPlan(TrialKind.SURROGATE, [("m00000", config)], scale=8, mup=True)
    with pytest.raises(ValueError, match="trains fused surrogate members .scale 8., not the full-size model"):
        load_model(tune.Result(metrics={"config": surrogate.to_config()}, checkpoint=None, error=None,
                               path=str(tmp_path)), workload)
