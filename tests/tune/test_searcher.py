"""HydroSearcher without a cluster: grouping, per-member observations, target, save/restore, bad input."""
import dataclasses
import math
import pickle

import pytest
from ray.tune.search import Searcher

import hydro.trial.fusion as fusion_module
import hydro.tune.search.searcher as searcher_module
from hydro.trial.fusion import PredictedFusion
from hydro.tune import HydroSearcher, TuneSpec
from hydro.tune.examples import digits_mlp
from hydro.tune.search.random_search import RandomSearch
from hydro.trial.plan import TrialKind, plan_of
from schedulers.member_stopping import ASHA
from schedulers.scale_choice import AUTO_SCALES, PILOT_CONFIGS, NoScale, Pilot, ScaleChoice
from tests.tune.workload import SPACE, mlp, sgd, small_digits, spec


class Scripted(Searcher):
    """An inner searcher that suggests a fixed list and records what it is told."""

    def __init__(self, configs):
        super().__init__()
        self.configs, self.suggested, self.results, self.completed = list(configs), [], [], []

    def suggest(self, trial_id):
        if not self.configs:
            return Searcher.FINISHED
        self.suggested.append(trial_id)
        return self.configs.pop(0)

    def on_trial_result(self, trial_id, result):
        self.results.append((trial_id, result["val_acc"]))

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append((trial_id, None if result is None else result["val_acc"], error))


def member_result(members, epoch, acc, done=False):
    """A flattened trial result as Ray passes it to searchers."""
    flat = {"epoch": epoch, "val_acc": math.nan}
    for m in members:
        flat.update({f"members/{m}/val_acc": acc[m], f"members/{m}/epoch": epoch, f"members/{m}/done": done,
                     f"members/{m}/training_iteration": epoch})
    return flat


def test_groups_by_batch_size_and_architecture_and_feeds_members_back():
    configs = [{"lr": 0.1, "momentum": 0.0, "batch_size": b, "hidden": h}
               for b, h in [(32, 8), (64, 8), (32, 8), (32, 16), (64, 8), (32, 8)]]
    inner = Scripted(configs)
    s = HydroSearcher(spec(group_by=["hidden"]), inner, num_samples=6, fusion=2)
    s.set_search_properties("val_acc", "max", {})
    trials = {}
    while (config := s.suggest(f"t{len(trials)}")) not in (None, Searcher.FINISHED):
        trials[f"t{len(trials)}"] = plan_of(config)
    groups = [[(c["batch_size"], c["hidden"]) for _, c in p.members] for p in trials.values()]
    assert all(len(set(g)) == 1 for g in groups)  # one batch size and width per fused trial
    assert sorted(len(g) for g in groups) == [1, 1, 2, 2]
    assert sorted(m for p in trials.values() for m, _ in p.members) == sorted(inner.suggested)
    assert all(p.kind == TrialKind.SURROGATE and not p.reports_objective for p in trials.values())
    # Every member's result reaches the inner searcher under the member's own id, once.
    acc = {m: 0.1 * i for i, m in enumerate(sorted(inner.suggested))}
    for t, plan in trials.items():
        ids = [m for m, _ in plan.members]
        s.on_trial_result(t, member_result(ids, 1, acc))
        s.on_trial_result(t, member_result(ids, 1, acc))  # a restored trial repeats an epoch
        s.on_trial_result(t, member_result(ids, 2, acc, done=True))
        s.on_trial_result(t, member_result(ids, 2, acc, done=True))  # a retried trial repeats an epoch
        s.on_trial_complete(t, member_result(ids, 2, acc, done=True))
    assert sorted(inner.results) == sorted(acc.items())
    assert sorted(inner.completed) == sorted((m, a, False) for m, a in acc.items())
    # All members done: the target trial trains the best member's config at full size, then the run ends.
    target = plan_of(s.suggest("target"))
    best = max(acc, key=acc.get)
    assert target.kind == TrialKind.TARGET and target.scale == 1 and target.source["member"] == best
    assert target.members[0][1] == configs[sorted(inner.suggested).index(best)]
    assert s.suggest("while the target trains") is None  # it may be lost and train again
    s.on_trial_complete("target", {"val_acc": 0.9, "epoch": 2})
    assert s.suggest("after") == Searcher.FINISHED


def test_fusion_auto_uses_plan_fusion(monkeypatch):
    chosen, real_plan_fusion = [], fusion_module.plan_fusion

    def recording_plan(*args, **kwargs):
        plan = real_plan_fusion(*args, **kwargs)
        chosen.append(plan.num_members)
        return plan

    monkeypatch.setattr(fusion_module, "plan_fusion", recording_plan)
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion="auto")
    plan = plan_of(s.suggest("t0"))
    assert len(chosen) == 1 and len(plan.members) == min(chosen[0], 4)


@pytest.mark.parametrize("cpus, candidates, members", [
    (2.0, [1, 2, 3, 6], 6),  # 12 configurations over 2 slots: counts that fill both in whole rounds, up to 6 each
    (1.0, None, 12),         # one slot: plan_fusion's ladder, up to all 12
])
def test_fusion_auto_measures_the_counts_that_fill_the_trial_slots(monkeypatch, cpus, candidates, members):
    import hydro.tune.search.searcher as searcher_module

    measured, real_plan_fusion = [], fusion_module.plan_fusion

    def recording_plan(*args, **kwargs):
        measured.append(kwargs["candidates"])
        return real_plan_fusion(*args, **kwargs)

    monkeypatch.setattr(fusion_module, "plan_fusion", recording_plan)
    monkeypatch.setattr(searcher_module.ray, "is_initialized", lambda: True)  # a mocked cluster of one node
    monkeypatch.setattr(searcher_module.ray, "nodes", lambda: [{"Alive": True, "Resources": {"CPU": cpus}}])
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=12, fusion="auto", trial_resources={"cpu": 1})
    plan = plan_of(s.suggest("t0"))
    assert measured == [candidates] and len(plan.members) <= members


def test_a_copied_searcher_keeps_its_fusion_planner_and_leaves_the_data_behind():
    """Ray pickles the searcher: a planner the user chose (here one that measures only predicted counts) stays
    that planner; the data it measured with is not pickled and is loaded again when it next plans."""
    planner = PredictedFusion(spec(), 1, spec().load_data(), max_members=4, threads=1)
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=planner)
    copied = pickle.loads(pickle.dumps(s))
    assert type(copied._planner) is PredictedFusion and copied._planner.data is None and planner.data is not None
    plan = plan_of(copied.suggest("t0"))
    assert 1 <= len(plan.members) <= 4 and copied._planner.data is not None


def test_save_restore_continues_the_search(tmp_path):
    s = HydroSearcher(spec(), RandomSearch(seed=1), num_samples=6, fusion=2)
    s.set_search_properties("val_acc", "max", SPACE)
    first = plan_of(s.suggest("t0"))
    s.save(str(tmp_path / "searcher.pkl"))
    expected = plan_of(s.suggest("t1"))
    restored = HydroSearcher(spec(), RandomSearch(seed=99), num_samples=6, fusion=2)
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert plan_of(restored.suggest("t1")).members == expected.members
    assert [m for m, _ in first.members] == ["m00000", "m00001"]


def test_scale_auto_measures_once_at_the_first_member_and_its_trials_train_at_the_choice(caplog):
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto")
    assert s.scale == "auto" and s.scale_choice is None  # nothing measured before the first trial
    with caplog.at_level("INFO", logger="hydro.trial.scale_plan"):
        plans = [plan_of(s.suggest("t0")), plan_of(s.suggest("t1"))]
    choice = s.scale_choice
    assert choice is not None and choice.scale in AUTO_SCALES and choice.scale in choice.step_s
    assert caplog.text.count("scale='auto': S=") == 1  # measured once
    assert s.scale == s.driver.policy.scale == choice.scale
    assert all(p.scale == choice.scale and p.mup for p in plans)


def test_scale_auto_is_kept_across_save_and_restore_without_measuring_again(tmp_path, monkeypatch):
    import hydro.tune.search.searcher as searcher_module

    s = HydroSearcher(spec(), RandomSearch(seed=1), num_samples=6, fusion=2, scale="auto")
    s.set_search_properties("val_acc", "max", SPACE)
    s.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"))  # as fit does, before Ray starts
    chosen = s.scale
    s.save(str(tmp_path / "searcher.pkl"))

    def measure_again(*args, **kwargs):
        raise AssertionError("a restored search measured its scale again")

    monkeypatch.setattr(searcher_module, "measured_scale", measure_again)
    restored = HydroSearcher(spec(), RandomSearch(seed=99), num_samples=6, fusion=2, scale="auto")
    restored.restore(str(tmp_path / "searcher.pkl"))
    assert restored.scale == restored.driver.policy.scale == chosen
    assert plan_of(restored.suggest("t0")).scale == chosen


def test_scale_auto_pilots_a_coarse_choice_on_configurations_of_the_param_space(caplog, monkeypatch):
    import hydro.tune.search.searcher as searcher_module

    measured = searcher_module.measured_scale  # a compute-bound model's step times choose S=8: forced here
    monkeypatch.setattr(searcher_module, "measured_scale",
                        lambda *args, **kwargs: dataclasses.replace(measured(*args, **kwargs), scale=8))
    digits, space = digits_mlp(epochs=3, hidden=128)  # wide enough for S=8
    s = HydroSearcher(digits, RandomSearch(seed=1), num_samples=PILOT_CONFIGS, fusion=2, scale="auto")
    s.set_search_properties("val_acc", "max", space)
    with caplog.at_level("INFO", logger="hydro.trial.scale_plan"):
        chosen = s.choose_scale(RandomSearch(space, seed=0).suggest("x"))
    pilot = Pilot.plan(8, PILOT_CONFIGS, digits.epochs)
    assert f"S=8 from step times; {pilot.describe()}" in caplog.text  # its cost, before it trains
    assert chosen in (8, 4) and f"{pilot.describe()}: Spearman" in s.scale_choice.reason
    assert s.driver.policy.scale == chosen
    no_space = HydroSearcher(digits, RandomSearch(seed=1), num_samples=PILOT_CONFIGS, fusion=2, scale="auto")
    assert no_space.choose_scale(RandomSearch(space, seed=0).suggest("x")) == 8  # no space to draw the pilot from
    assert "pilot" not in no_space.scale_choice.reason


@pytest.mark.parametrize("scale", [0, 2.0, True, "Auto", None])
def test_a_scale_that_is_neither_a_width_divisor_nor_auto_is_refused(scale):
    with pytest.raises(ValueError, match=r"HydroSearcher: scale must be an int >= 1 .* or 'auto' \(measured\), got"):
        HydroSearcher(spec(), num_samples=4, scale=scale)


def test_metric_not_reported_is_named_with_the_reported_keys():
    s = HydroSearcher(spec(), num_samples=2, fusion=2)
    with pytest.raises(ValueError, match=r"'accuracy'.*\['train_loss', 'val_loss', 'val_acc'\]"):
        s.set_search_properties("accuracy", "max", SPACE)
    with pytest.raises(ValueError, match=r"'acc' is not reported.*\['train_loss', 'val_loss'\]"):
        TuneSpec(model=mlp, data=small_digits, loss=None, optimizer=sgd, metric="acc")


def test_a_trial_holding_fewer_members_than_planned_is_not_taken_for_one_out_of_memory(caplog):
    configs = [{"lr": 0.1 * (i + 1), "momentum": 0.0} for i in range(5)]
    s = HydroSearcher(spec(), Scripted(configs), num_samples=5, fusion=2, transfer_fraction=None)
    s.set_search_properties("val_acc", "max", {})
    trials = {t: plan_of(s.suggest(t)) for t in ("t0", "t1", "t2")}
    assert [len(p.members) for p in trials.values()] == [2, 2, 1]  # the last holds the one left
    (key,) = set(s.driver.state.trial_groups.values())
    ids = [m for m, _ in trials["t2"].members]
    with caplog.at_level("WARNING", logger="hydro.tune.search.searcher"):
        s.on_trial_result("t2", {**member_result(ids, 1, {ids[0]: 0.5}), "max_fusion": 1})  # fused its one member
        assert s.driver.state.pool.fusion[key] == 2 and "ran out of memory" not in caplog.text
        ids = [m for m, _ in trials["t0"].members]  # two members, trained one at a time: out of memory
        s.on_trial_result("t0", {**member_result(ids, 1, dict.fromkeys(ids, 0.5)), "max_fusion": 1})
    assert s.driver.state.pool.fusion[key] == 1
    assert "ran out of memory at 2 fused members: its later trials get 1" in caplog.text


def test_a_lost_trial_trains_again_in_a_fresh_trial_with_the_same_plan_then_fails_for_good():
    inner = Scripted([{"lr": 0.1, "momentum": 0.0}, {"lr": 0.2, "momentum": 0.0}])
    s = HydroSearcher(spec(epochs=2), inner, num_samples=2, fusion=2, transfer_fraction=None, lost_trial_retries=1)
    first = s.suggest("t0")
    ids = plan_of(first).member_ids
    s.on_trial_result("t0", member_result(ids, 1, {m: 0.5 for m in ids}))
    s.on_trial_complete("t0", error=True)  # Tune gave up on it: its worker was lost more often than max_failures
    again = s.suggest("t1")
    assert again == first and not inner.completed  # the same members and configuration; nothing failed yet
    s.on_trial_complete("t1", error=True)  # lost again: no fresh trial left, its members fail
    assert sorted(inner.completed) == sorted((m, 0.5, True) for m in ids)
    assert s.suggest("t2") == Searcher.FINISHED


@pytest.mark.parametrize("scale, scheduler, warned", [
    (4, ASHA(max_t=3, grace_period=1, reduction_factor=2), True),  # no escalation below S=8: nothing checks it
    (2, ASHA(max_t=3, grace_period=1, reduction_factor=2), True),
    (8, ASHA(max_t=3, grace_period=1, reduction_factor=2), False),  # the first rung's check can escalate
    (4, None, False),  # every search member trains every epoch
    (1, ASHA(max_t=3, grace_period=1, reduction_factor=2), False),  # no surrogates: stock's early stopping as is
])
def test_early_stopping_without_a_transfer_check_after_the_search_is_warned_once_the_scale_is_known(
        caplog, scale, scheduler, warned):
    with caplog.at_level("WARNING", logger="hydro.tune.search.searcher"):
        HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale=scale, scheduler=scheduler)
    assert ("no transfer check follows the search" in caplog.text) is warned
    if warned:
        assert f"at S={scale} no transfer check follows the search (escalation needs S >= 8)" in caplog.text
        assert "leave scheduler unset" in caplog.text


def test_early_stopping_at_s8_without_escalation_is_warned_and_auto_then_chooses_as_without(caplog, monkeypatch):
    asha = ASHA(max_t=3, grace_period=1, reduction_factor=2)
    with caplog.at_level("WARNING", logger="hydro.tune.search.searcher"):
        HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale=8, scheduler=asha,
                      escalate=False)
    assert "at S=8 no transfer check follows the search (escalate=False)" in caplog.text
    asked = []
    monkeypatch.setattr(searcher_module, "measured_scale",
                        lambda *args, scales=AUTO_SCALES: asked.append(tuple(scales)) or ScaleChoice(4, {4: 1.0}))
    monkeypatch.setattr(searcher_module, "piloted_scale", lambda spec, choice, *args: choice)
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto", scheduler=asha,
                      escalate=False)
    assert s.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"), SPACE) == 4 and asked == [AUTO_SCALES]


def test_scale_auto_with_early_stopping_searches_where_the_transfer_check_can_escalate(caplog, monkeypatch):
    """Per-member early stopping ranks the configurations it stops by their early epochs: ``scale="auto"`` then
    measures only the scales whose first rung can escalate (S=8) and skips the pilot, which could move the search to
    S=4, where nothing would check that ranking."""
    asked, piloted = [], []

    def measured(*args, scales=AUTO_SCALES):
        asked.append(tuple(scales))
        return ScaleChoice(scales[0], {scales[0]: 1.0})

    monkeypatch.setattr(searcher_module, "measured_scale", measured)
    monkeypatch.setattr(searcher_module, "piloted_scale", lambda spec, choice, *args: piloted.append(choice) or choice)
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto",
                      scheduler=ASHA(max_t=3, grace_period=1, reduction_factor=2))
    with caplog.at_level("INFO", logger="hydro.tune.search.searcher"):
        assert s.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"), SPACE) == 8
    assert asked == [(8,)] and piloted == [] and "S=8 without a pilot" in caplog.text
    assert "no transfer check follows the search" not in caplog.text
    plain = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto")
    assert plain.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"), SPACE) == 8
    assert asked[1:] == [AUTO_SCALES] and len(piloted) == 1  # without early stopping: every scale, then the pilot


def test_scale_auto_with_early_stopping_on_a_model_too_small_for_s8_chooses_as_without_and_warns(caplog, monkeypatch):
    asked = []

    def measured(*args, scales=AUTO_SCALES):
        asked.append(tuple(scales))
        if 8 in scales and len(scales) == 1:
            raise NoScale("cannot be shrunk to S=8")
        return ScaleChoice(4, {4: 1.0}, skipped={8: "too narrow"})

    monkeypatch.setattr(searcher_module, "measured_scale", measured)
    monkeypatch.setattr(searcher_module, "piloted_scale", lambda spec, choice, *args: choice)
    s = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto",
                      scheduler=ASHA(max_t=3, grace_period=1, reduction_factor=2))
    with caplog.at_level("WARNING", logger="hydro.tune.search.searcher"):
        assert s.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"), SPACE) == 4
    assert asked == [(8,), AUTO_SCALES]
    assert caplog.text.count("no transfer check follows the search") == 1 and "at S=4 " in caplog.text


def test_scale_auto_with_early_stopping_measures_s8_alone_on_a_real_model(caplog):
    wide, space = digits_mlp(epochs=3, hidden=64)
    s = HydroSearcher(wide, RandomSearch(space, seed=0), num_samples=4, fusion=2, scale="auto",
                      scheduler=ASHA(max_t=3, grace_period=1, reduction_factor=2))
    # choose_scale, not suggest: suggest would start the run's stopping service, and Ray with it, in this process
    with caplog.at_level("INFO"):
        assert s.choose_scale(RandomSearch(space, seed=0).suggest("x"), space) == 8
    assert s.scale_choice.scale == 8 and set(s.scale_choice.step_s) == {8}  # S=4 and S=2 not even timed
    assert "S=8 without a pilot" in caplog.text and "configurations at S=8 and S=4" not in caplog.text  # no pilot
    # the test workload's MLP is too narrow for S=8: chosen as without early stopping, and warned
    narrow = HydroSearcher(spec(), RandomSearch(SPACE, seed=0), num_samples=4, fusion=2, scale="auto",
                           scheduler=ASHA(max_t=3, grace_period=1, reduction_factor=2))
    narrow.choose_scale(RandomSearch(SPACE, seed=0).suggest("x"), SPACE)
    assert narrow.scale < 8 and 8 in narrow.scale_choice.skipped and "no transfer check follows" in caplog.text
