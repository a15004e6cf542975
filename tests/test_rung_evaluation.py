"""Ladder-rung trials evaluate only their last epoch (``TrialPlan.final_score_only``): training is the same bit for
bit as when every epoch is evaluated, a schedule that follows the metric still gets every epoch's evaluation, and
the searcher's decisions read only a rung member's last result (no cluster: scripted results)."""
import math

import pytest
import torch
from ray.tune.search import Searcher
from torch import nn
from torch.utils.data import Dataset

from hydro.trial.plan import TrialKind, TrialPlan, plan_of
from hydro.trial.spec import TRAIN_LOSS, VAL_LOSS
from hydro.trial.unit import FusedTrial
from hydro.tune import HydroSearcher
from tests.digits import small_digits
from tests.tune.test_searcher import Scripted, member_result
from tests.tune.workload import spec

PLAN = TrialPlan(TrialKind.SURROGATE, [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.03, "momentum": 0.0})])
EPOCHS = 3


def dropout_mlp(config):
    """Training draws from torch's RNG (dropout): anything else drawing from it between epochs would show."""
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 10))


class NoisyVal(Dataset):
    """A validation split with a random transform drawn from torch's global RNG (no loader workers)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i] + 0.1 * torch.randn(self.x[i].shape), self.y[i]


def trained(evaluate_every_epoch: bool, **overrides):
    (x, y), (vx, vy) = small_digits()
    trial = FusedTrial(spec(epochs=EPOCHS, model=dropout_mlp, seed=3, **overrides), PLAN, ((x, y), NoisyVal(vx, vy)))
    torch.manual_seed(0)
    metrics = [trial.run_epoch(evaluate=evaluate_every_epoch or epoch == EPOCHS) for epoch in range(1, EPOCHS + 1)]
    return trial, metrics


def test_skipped_evaluations_leave_training_and_the_last_scores_unchanged():
    every, expected = trained(True)
    skipping, got = trained(False)
    for name, value in skipping.members.model.state_dict().items():
        assert torch.equal(value, every.members.model.state_dict()[name]), name
    assert all(torch.equal(got[-1][k], expected[-1][k]) for k in expected[-1])
    for epoch in range(EPOCHS - 1):  # the skipped epochs: training loss as always, validation metrics unread
        assert torch.equal(got[epoch][TRAIN_LOSS], expected[epoch][TRAIN_LOSS])
        assert set(got[epoch]) == set(expected[epoch])
        assert got[epoch][VAL_LOSS].isnan().all() and got[epoch]["val_acc"].isnan().all()
        assert expected[epoch][VAL_LOSS].isfinite().all()
    assert skipping.eval_s < every.eval_s


def test_a_schedule_following_the_metric_is_still_evaluated_every_epoch():
    plateau = dict(lr_scheduler=lambda o, c: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=0),
                   metric="val_loss", mode="min")
    every, expected = trained(True, **plateau)
    skipping, got = trained(False, **plateau)
    assert skipping.evaluation_steers_training
    assert all(torch.equal(g[k], e[k]) for g, e in zip(got, expected) for k in e)
    lrs = skipping.members.optimizer.param_groups[0]["lr"]
    assert torch.equal(lrs, every.members.optimizer.param_groups[0]["lr"])


def _ladder_run(first_epoch_value):
    """A ladder run (S=8 -> 4 -> 2 -> targets) with scripted member results: each member's last epoch scores
    by its configuration's index; ``first_epoch_value(member, last)`` is what rung members report after
    epoch 1 (the search's members always report their real value). Returns every suggested plan and the
    searcher's transfer report."""
    configs = [{"lr": 0.01 * (i + 1), "momentum": 0.0} for i in range(6)]
    s = HydroSearcher(spec(), Scripted(configs), num_samples=6, scale=8, fusion=3, ladder=True, eta=2, top_k=1,
                      escalate=False, fallback_targets=0)
    s.set_search_properties("val_acc", "max", {})
    scores = {8: lambda i: i / 10, 4: lambda i: 1 - i / 10, 2: lambda i: 0.5 + i / 100}
    plans, waiting = [], []
    while True:
        config = s.suggest(f"t{len(plans)}")
        if config is None and waiting:
            trial_id, plan = waiting.pop(0)
        elif config in (None, Searcher.FINISHED):
            break
        else:
            plan = plan_of(config)
            plans.append(plan)
            trial_id = f"t{len(plans) - 1}"
            if plan.kind == TrialKind.SURROGATE and plan.scale == 8:  # the search: finished as suggested
                pass
            elif plan.kind == TrialKind.TARGET:
                s.on_trial_complete(trial_id, {"val_acc": 0.5})
                continue
            else:
                waiting.append((trial_id, plan))
                continue
        ids = plan.member_ids
        last = {m: scores[plan.scale](int(m.split("@")[0][1:])) for m in ids}
        first = last if plan.scale == 8 else {m: first_epoch_value(m, last[m]) for m in ids}
        s.on_trial_result(trial_id, member_result(ids, 1, first))
        s.on_trial_complete(trial_id, member_result(ids, 2, last, done=True))
    return [(p.kind, p.scale, p.member_ids, p.decisions, p.final_score_only) for p in plans], s.transfer_report()


def test_a_rungs_skipped_evaluations_change_no_decision():
    evaluated, report = _ladder_run(lambda member, last: 1 - last)  # epoch 1 ranks the rung the other way round
    skipped, skipped_report = _ladder_run(lambda member, last: math.nan)  # what a rung that skips reports
    assert skipped == evaluated and skipped_report == report
    rungs = [p for p in evaluated if p[0] == TrialKind.SURROGATE and p[1] < 8]
    assert [p[1] for p in rungs] == [4, 2]
    assert all(final_only and decisions is None for *_, decisions, final_only in rungs)
    assert not any(final_only for kind, scale, *_, final_only in evaluated if scale == 8 or kind != TrialKind.SURROGATE)


@pytest.mark.parametrize("evaluated", [True, False])
def test_a_report_of_a_skipped_epoch_keeps_the_training_loss(monkeypatch, evaluated):
    from hydro.tune.search import session as session_module
    reports = []
    monkeypatch.setattr(session_module.tune, "report", lambda result, checkpoint=None: reports.append(result))
    session = session_module.MemberSession(PLAN.to_config(), "val_acc", "max")
    metrics = {TRAIN_LOSS: torch.tensor([0.5, 0.7]), VAL_LOSS: torch.full((2,), math.nan),
               "val_acc": torch.full((2,), math.nan)}
    session.step(1, metrics, evaluated=evaluated)
    session.report()
    losses = [reports[0]["members"][m][TRAIN_LOSS] for m in ("a", "b")]
    if evaluated:  # a NaN val_loss that was computed: the member diverged, every value NaN
        assert all(math.isnan(loss) for loss in losses)
    else:
        assert losses == [0.5, pytest.approx(0.7)]


def test_a_halving_rung_trial_stops_its_members_at_the_milestone_inside_the_trial(monkeypatch):
    from hydro.tune.search import session as session_module
    from schedulers.rung_halving import RungHalving
    reports = []
    monkeypatch.setattr(session_module.tune, "report", lambda result, checkpoint=None: reports.append(result))
    members = [(m, {"lr": 0.1}) for m in ("a@4", "b@4", "c@4")]
    plan = TrialPlan(TrialKind.SURROGATE, members, scale=4, mup=True, final_score_only=True,
                     halving=RungHalving((2,), (1,)))
    session = session_module.MemberSession(plan.to_config(), "val_loss", "min")
    unread = {TRAIN_LOSS: torch.tensor([0.5, 0.4, 0.6]), VAL_LOSS: torch.full((3,), math.nan)}
    assert session.step(1, unread, evaluated=False) == [0, 1, 2]  # no milestone: nobody stops on unread scores
    session.report()
    read = {TRAIN_LOSS: torch.tensor([0.5, 0.4, 0.6]), VAL_LOSS: torch.tensor([0.3, 0.2, 0.25])}
    assert session.step(2, read) == [1] and session.member_ids == ["b@4"]  # the lowest val_loss goes on
    session.report()
    stopped = reports[-1]["members"]
    assert stopped["a@4"]["stopped"] and stopped["c@4"]["done"] and not stopped["b@4"]["done"]
    assert [e for e in range(1, 5) if plan.halving.evaluates(e, 4)] == [2, 4]
