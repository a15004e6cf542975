"""Rung halving (pure): successive halving over epochs inside a width-ladder rung's trials, its cost in the plan,
how a rung's scores rank members stopped at different epochs, and the driver's rung trials that carry it."""
import math
import pickle

import pytest

from schedulers.member_pool import MemberPool, Suggestion
from schedulers.rung_halving import RungHalving, fraction
from schedulers.search_driver import SearchDriver, Stage
from schedulers.transfer import RungKind, Score, TransferPolicy, scores_of


def test_a_rung_trial_cuts_by_eta_at_its_milestones_down_to_its_survivors():
    assert RungHalving.plan(11, 3, epochs=8, eta=3) == RungHalving((2,), (4,))
    assert RungHalving.plan(30, 2, epochs=27, eta=3) == RungHalving((3, 9), (10, 4))
    assert RungHalving.plan(30, 8, epochs=27, eta=3) == RungHalving((3, 9), (10, 8))  # never below the survivors
    assert RungHalving.plan(3, 3, epochs=8, eta=3) is None  # nobody would stop
    assert RungHalving.plan(11, 3, epochs=2, eta=3) is None  # no milestone below the last epoch
    with pytest.raises(ValueError, match="non-increasing"):
        RungHalving((2, 4), (3, 5))


def test_which_members_go_on_at_which_epoch():
    halving = RungHalving((2, 5), (3, 1))
    scores = {"a": 0.1, "b": 0.4, "c": -math.inf, "d": 0.4, "e": 0.3}
    assert halving.stops(1, scores) == set()  # not a milestone
    assert halving.stops(2, scores) == {"a", "c"}  # the best 3; ties keep their order, a diverged one is the worst
    assert halving.stops(5, {"b": 0.2, "d": 0.5, "e": 0.1}) == {"b", "e"}
    assert [e for e in range(1, 9) if halving.evaluates(e, 8)] == [2, 5, 8]


def test_a_rung_trial_costs_its_member_epochs():
    halving = RungHalving((2,), (4,))
    assert halving.member_epochs(11, 8) == 11 * 2 + 4 * 6
    assert fraction(11, 3, 8, 3) == pytest.approx(46 / 88)
    assert fraction(3, 3, 8, 3) == 1.0


def policy(**options):
    return TransferPolicy(0.75, 24, "val_loss", "min", **{"scale": 8, "slots": 2, "epochs": 8, "halving": True,
                                                          **options})


def test_the_plan_counts_the_halving_in_its_cost_and_says_so():
    halving, full = policy(), policy(halving=False)
    assert halving.schedule(24) == full.schedule(24) == [(4, 11, 1), (2, 2, 1), (1, 1, 1)]
    # the first rung keeps the 2 the next rung trains and one more (the probes' lead); S=2 keeps the target
    expected = 11 / 16 * fraction(11, 3, 8, 3) + 2 / 4 * fraction(2, 1, 8, 3) + 1
    assert halving.cost(24) == pytest.approx(expected) and full.cost(24) == pytest.approx(11 / 16 + 2 / 4 + 1)
    assert halving.cost(24) < full.cost(24) and halving.escalation_cost(24) < full.escalation_cost(24)
    assert "11 at S=4 (3 of them probes from below the cut), all but 3 stopped early" in halving.describe(24)
    assert "stopped early" not in full.describe(24)
    assert policy(epochs=2).cost(24) == full.cost(24)  # too few epochs for a milestone
    assert policy(seeds=2).cost(24) == policy(seeds=2, halving=False).cost(24)  # seeds average whole trainings


def test_members_stopped_at_a_milestone_rank_below_those_that_went_on():
    p = policy()
    rung = scores_of([("a", 0.9), ("b", 0.5), ("c", 0.6), ("d", 0.4)], reached={"a": 8, "b": 2, "c": 8, "d": 2})
    assert rung["b"] == Score(0.5, 0.0, 1, 2)
    assert p.ranking(rung) == ["c", "a", "d", "b"]  # a (0.9 after 8 epochs) ahead of d (0.4 after 2)
    search = {c: Score(v, 0.0, 1) for c, v in {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}.items()}
    check = p._check(8, search, 4, rung)  # ranked by reach then score: c a d b against a b c d
    assert check.rho == pytest.approx(0.0)  # by the means alone (d b c a) it would be -0.8


def test_a_probe_leads_only_the_best_left_out_measured_at_its_epoch():
    p = policy(probe_margin=0.0)
    first = {"kept": Score(0.30, 0.0, 1, 8), "probe": Score(0.40, 0.0, 1, 8), "out": Score(0.45, 0.0, 1, 8),
             "early": Score(0.20, 0.0, 1, 2)}
    assert p._best_left_out(first, ["out", "early"], 8) == 0.45
    assert p._best_left_out(first, ["early"], 8) is None  # stopped at a milestone: not compared with a final score


def test_ladder_rungs_halve_and_escalations_train_in_full():
    p = policy()
    search = {f"c{i:02d}": Score(i / 100, 0.0, 1) for i in range(24)}
    first = p.next_rung([search])
    assert first.scale == 4 and len(first.configs) == 11 and first.survivors == 3 and first.kind is RungKind.LADDER
    assert policy(halving=False).next_rung([search]).survivors == 0
    escalation = p._escalation([search], {4: set(first.configs)}, "why")
    assert escalation.kind is RungKind.ESCALATION and escalation.survivors == 0


class Cluster:
    def trial_request(self):
        return {"CPU": 1.0}

    def trial_slots(self):
        return 2

    def lone_trial_cpus(self):
        return 1.0


def test_the_driver_gives_each_rung_trial_its_share_of_the_survivors_and_records_the_epochs_reached():
    policy = TransferPolicy(1.0, 12, "acc", "max", scale=4, ladder=True, halving=True, escalate=False,
                            fallback_targets=0)
    d, cluster = SearchDriver(policy, MemberPool(12, 6), "acc", 8, lambda config: 0), Cluster()
    configs = [{"lr": i} for i in range(12)]
    draw = lambda member: configs.pop(0) if configs else Suggestion.FINISHED  # noqa: E731
    search = [d.next_trial(f"s{i}", draw, lambda key, config: 6, cluster) for i in range(2)]
    for trial in search:
        ids = [m for m, _ in trial.members]
        d.on_result(f"s{search.index(trial)}", {m: {"acc": int(m[1:]) / 100, "epoch": 8, "done": True} for m in ids},
                    cluster, seconds=1000.0)  # long trials: the rung spreads over both slots
    rung_trial = d.next_trial("r0", draw, lambda key, config: 6, cluster)
    rung = d.state.current.rung
    assert d.stage is Stage.RUNG and rung.scale == 2 and len(rung.configs) == 4 and rung.survivors == 1
    second = d.next_trial("r1", draw, lambda key, config: 6, cluster)
    assert [len(t.members) for t in (rung_trial, second)] == [2, 2]
    assert rung_trial.halving == second.halving == RungHalving((2,), (1,))  # ceil(1 × 2/4) each
    assert rung_trial.stage is Stage.RUNG and d.next_trial("r2", draw, lambda key, config: 6, cluster) is None
    results = {}
    for trial in (rung_trial, second):
        (kept, _), (stopped, _) = trial.members
        results[kept] = {"acc": 0.5, "epoch": 8, "done": True}
        results[stopped] = {"acc": 0.9, "epoch": 2, "done": True}  # better, but after 2 epochs: ranks below
    d.on_result("r0", {m: results[m] for m, _ in rung_trial.members}, cluster)
    d.on_result("r1", {m: results[m] for m, _ in second.members}, cluster)
    scores = d.state.stages[1]
    assert sorted(s.reached for s in scores.values()) == [2, 2, 8, 8]
    assert d.stage is Stage.TARGET
    target = d.state.current.rung.configs
    assert scores[target[0]].reached == 8
    restored = SearchDriver(policy, MemberPool(12, 6), "acc", 8, lambda config: 0)
    restored.restore(pickle.loads(pickle.dumps(d.state)))
    assert restored.policy.ranking(restored.state.stages[1]) == d.policy.ranking(scores)
