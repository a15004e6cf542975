"""Rung halving chosen from the search's own curves (``halving="auto"``, pure): the choice on curves whose milestone
ranking agrees with the end and on overfitting ones, and the driver that records the curves, decides when the stages
start, plans the rungs with that decision and keeps it across a save and restore."""
import logging
import math
import pickle

import pytest

from schedulers.halving_choice import choose_halving, reads_curves
from schedulers.member_pool import MemberPool, Suggestion
from schedulers.rung_halving import RungHalving, milestones
from schedulers.search_driver import SearchDriver, Stage
from schedulers.transfer import AUTO, TransferPolicy, rho_lower_bound, rho_upper_bound
from tests.test_search_driver import Cluster


def test_milestones_are_the_rungs_cut_epochs():
    assert milestones(8, 3) == (2,) and milestones(27, 3) == (3, 9) and milestones(2, 3) == ()
    assert RungHalving.plan(30, 2, epochs=27, eta=3).milestones == milestones(27, 3)


def test_the_lower_bound_mirrors_the_upper_one():
    assert rho_lower_bound(0.8, 24) < 0.8 < rho_upper_bound(0.8, 24)
    assert rho_lower_bound(0.8, 24) == pytest.approx(-rho_upper_bound(-0.8, 24))
    assert math.isnan(rho_lower_bound(0.9, 3))


def curves(n, at_milestone, final):
    """n members' values at epoch 2 and at the end, from functions of the member's index."""
    return ({f"m{i}": {2: at_milestone(i)} for i in range(n)}, {f"m{i}": final(i) for i in range(n)})


def test_curves_whose_milestone_ranks_as_the_end_halve():
    at, final = curves(24, lambda i: 0.5 + i / 100, lambda i: 0.7 + i / 100 + (0.015 if i % 2 else 0.0))
    choice = choose_halving((2,), at, final, "max", 0.5)
    (agreement,) = choice.agreements
    assert choice.halving and agreement.members == 24 and agreement.rho > 0.95 and agreement.lower >= 0.5
    assert "after epoch 2: Spearman" in choice.reason
    assert "ranks the search's members as their end does" in choice.reason


def test_overfitting_curves_do_not_halve():
    # the fastest learners overfit: best after 2 epochs, worst at the end (a validation loss, lower is better)
    at, final = curves(24, lambda i: 1.0 - i / 50, lambda i: 0.6 + abs(i - 12) / 50)
    choice = choose_halving((2,), at, final, "min", 0.5)
    assert not choice.halving and choice.agreements[0].rho < 0.5
    assert "not shown to predict" in choice.reason


def test_an_agreement_too_weak_to_show_does_not_halve():
    # rho 0.79 over 12 members: likely agreeing, but its lower bound (0.42) is below 0.5
    values = [2, 0, 5, 1, 4, 3, 8, 11, 6, 10, 7, 9]
    at, final = curves(12, lambda i: float(values[i]), lambda i: float(i))
    choice = choose_halving((2,), at, final, "max", 0.5)
    assert choice.agreements[0].rho > 0.75 and choice.agreements[0].lower < 0.5 and not choice.halving


def test_every_milestone_must_agree_and_checking_stops_at_the_first_that_does_not():
    at = {f"m{i}": {3: float(i), 9: float(-i)} for i in range(20)}
    final = {f"m{i}": float(i) for i in range(20)}
    choice = choose_halving((3, 9), at, final, "max", 0.5)
    assert not choice.halving and [a.epoch for a in choice.agreements] == [3, 9]
    at = {f"m{i}": {3: float(-i), 9: float(i)} for i in range(20)}
    assert [a.epoch for a in choose_halving((3, 9), at, final, "max", 0.5).agreements] == [3]


def test_too_few_members_or_no_milestone_do_not_halve():
    at, final = curves(3, float, float)
    assert not choose_halving((2,), at, final, "max", 0.5).halving  # no bound over 3
    assert not choose_halving((), at, final, "max", 0.5).halving
    at, final = curves(10, float, float)
    final = {m: v for m, v in final.items() if m != "m0"} | {"m0": math.nan}  # a diverged member counts, worst
    assert choose_halving((2,), at, final, "max", 0.5).agreements[0].members == 10


def test_a_bad_halving_option_is_refused():
    with pytest.raises(ValueError, match="halving must be True, False or 'auto'"):
        TransferPolicy(1.0, 8, "acc", "max", scale=8, halving="yes")
    assert TransferPolicy(1.0, 8, "acc", "max").halving == AUTO  # the default, valid at scale 1 too


def run_search(halving, at_milestone, final, mode="max", epochs=8, scale=4):
    """A driver whose 24 search members (2 trials) at ``scale`` report epoch 2 then their final epoch; returns it and
    its first rung's first trial."""
    stages = {"escalate": False, "fallback_targets": 0} if scale > 1 else {}
    policy = TransferPolicy(1.0, 24, "acc", mode, scale=scale, halving=halving, **stages)
    d, cluster = SearchDriver(policy, MemberPool(24, 12), "acc", epochs, lambda config: 0), Cluster(slots=2)
    configs = [{"lr": i} for i in range(24)]
    draw = lambda member: configs.pop(0) if configs else Suggestion.FINISHED  # noqa: E731
    trials = [d.next_trial(f"s{i}", draw, lambda key, config: 12, cluster) for i in range(2)]
    for i, trial in enumerate(trials):
        ids = [m for m, _ in trial.members]
        index = {m: int(config["lr"]) for m, config in trial.members}
        d.on_result(f"s{i}", {m: {"acc": at_milestone(index[m]), "epoch": 2, "done": False} for m in ids}, cluster)
        d.on_result(f"s{i}", {m: {"acc": final(index[m]), "epoch": epochs, "done": True} for m in ids}, cluster,
                    seconds=100.0)
    return d, d.next_trial("r0", draw, lambda key, config: 12, cluster)


def test_the_driver_halves_the_rungs_where_the_search_curves_agree(caplog):
    with caplog.at_level(logging.INFO):
        d, rung_trial = run_search(AUTO, lambda i: i / 100, lambda i: 0.5 + i / 100)
    assert d.stage is Stage.RUNG and d.policy.halving is True and d.state.halving is True
    assert d.state.current.rung.survivors > 0 and rung_trial.halving is not None
    assert d.state.curves == {}  # not kept once decided
    assert "rung halving on: the search members' curves, after epoch 2: Spearman 1.00 over 24" in caplog.text
    assert "stopped early" in caplog.text  # the plan logged after the choice counts it
    restored = SearchDriver(TransferPolicy(1.0, 24, "acc", "max", scale=4, escalate=False, fallback_targets=0),
                            MemberPool(24, 12), "acc", 8, lambda config: 0)
    restored.restore(pickle.loads(pickle.dumps(d.state)))
    assert restored.policy.halving is True


def test_the_driver_trains_the_rungs_whole_where_the_search_overfits(caplog):
    with caplog.at_level(logging.INFO):
        d, rung_trial = run_search(AUTO, lambda i: i / 100, lambda i: 0.5 + abs(i - 12) / 100 * (-1) ** i)
    assert d.policy.halving is False and d.state.current.rung.survivors == 0 and rung_trial.halving is None
    assert "rung halving off" in caplog.text


def test_a_halving_the_user_set_is_not_second_guessed():
    overfitting = (lambda i: i / 100, lambda i: 0.5 - i / 100)
    d, rung_trial = run_search(True, *overfitting)
    assert d.policy.halving is True and rung_trial.halving is not None and d.state.curves == {}
    d, rung_trial = run_search(False, lambda i: i / 100, lambda i: i / 100)
    assert rung_trial.halving is None and d.state.halving is None


def test_a_search_too_narrow_to_show_its_rungs_overfitting_does_not_halve(caplog):
    with caplog.at_level(logging.INFO):
        d, rung_trial = run_search(AUTO, lambda i: i / 100, lambda i: 0.5 + i / 100, scale=8)  # curves that agree
    assert d.policy.halving is False and rung_trial.halving is None
    assert "rung halving off: a search at S=8 is too narrow to show whether its rungs (S=4 and finer) overfit" \
        in caplog.text


def test_an_unshrunk_search_leaves_the_choice_open_and_trains_its_target():
    d, stage_trial = run_search(AUTO, lambda i: i / 100, lambda i: 0.5 + i / 100, scale=1)
    assert d.policy.halving == AUTO and d.state.halving is None and d.state.curves == {}
    assert d.stage is Stage.TARGET and stage_trial.is_target


def test_curves_are_recorded_only_where_the_choice_reads_them():
    for scale, kept in ((4, True), (8, False)):  # at S=8 nothing is kept for a choice that would not read it
        d = SearchDriver(TransferPolicy(1.0, 24, "acc", "max", scale=scale), MemberPool(24, 12), "acc", 8,
                         lambda config: 0)
        trial = d.next_trial("s0", lambda member: {"lr": 0.1}, lambda key, config: 1, Cluster(slots=2))
        d.on_result("s0", {m: {"acc": 0.5, "epoch": 2, "done": False} for m, _ in trial.members}, Cluster(slots=2))
        assert bool(d.state.curves) is kept
    policy = TransferPolicy(1.0, 24, "acc", "max", scale=4)
    assert reads_curves(policy) and not reads_curves(TransferPolicy(1.0, 24, "acc", "max", scale=8))
    assert not reads_curves(TransferPolicy(1.0, 24, "acc", "max", scale=4, seeds=2))
    assert not reads_curves(TransferPolicy(1.0, 24, "acc", "max", scale=4, ladder=False))
