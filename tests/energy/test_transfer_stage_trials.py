"""``hydro tune --energy`` compares, stops and records only the search's trials: a width-ladder rung (its
surrogates are wider, so each member-epoch costs more) or a full-size target is never stopped by the search's cost
bound and gets no batch size from the bandit (it trains its configurations as the search trained them)."""
from __future__ import annotations

from types import SimpleNamespace

import torch
from ray.tune.schedulers import TrialScheduler
from torch import nn

from hydro.energy.tuning import EnergySettings
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.tune.energy.scheduler import HYDRO_COST_KEY, for_hydro


def trial(trial_id: str, plan: TrialPlan) -> SimpleNamespace:
    """What the scheduler reads of a Tune trial: its id and its configuration."""
    return SimpleNamespace(trial_id=trial_id, config=plan.to_config())


def test_rungs_are_measured_but_neither_stopped_nor_given_a_batch_size(tmp_path):
    spec = TuneSpec(model=lambda config: nn.Linear(4, 2), data=lambda: None, loss=nn.CrossEntropyLoss(),
                    optimizer=lambda params, config: torch.optim.SGD(params, lr=config["lr"]), batch_size=32)
    scheduler = for_hydro(EnergySettings(store_path=str(tmp_path / "energy.db"), job="job", batch_sizes=(16, 32)),
                          spec, seed=0)
    search = trial("search", TrialPlan(TrialKind.SURROGATE, [("m00000", {"lr": 0.1})], scale=4, decisions="d"))
    scheduler.on_trial_add(None, search)
    chosen = search.config["hydro"].members[0][1]["batch_size"]
    assert chosen in (16, 32)
    scheduler.on_trial_result(None, search, {HYDRO_COST_KEY: 1.0})
    scheduler.on_trial_complete(None, search, {HYDRO_COST_KEY: 1.0})
    assert scheduler.stop_cost == 2.0  # beta 2 x the converged search trial's cost

    rung = trial("rung", TrialPlan(TrialKind.SURROGATE, [("m00000@2", {"lr": 0.1, "batch_size": chosen})], scale=2,
                                   final_score_only=True))
    scheduler.on_trial_add(None, rung)
    assert rung.config["hydro"].members[0][1]["batch_size"] == chosen  # as the search trained it
    assert scheduler.on_trial_result(None, rung, {HYDRO_COST_KEY: 4.0}) == TrialScheduler.CONTINUE
    scheduler.on_trial_complete(None, rung, {HYDRO_COST_KEY: 4.0})
    assert scheduler.stop_cost == 2.0  # not recorded: the bound is still the search's

    another = trial("search2", TrialPlan(TrialKind.SURROGATE, [("m00001", {"lr": 0.2})], scale=4, decisions="d"))
    scheduler.on_trial_add(None, another)
    assert scheduler.on_trial_result(None, another, {HYDRO_COST_KEY: 4.0}) == TrialScheduler.STOP  # the bound acts
