"""HydroSearcher's transfer stages: seed repeats, width ladder and top-k targets, without a cluster (scripted
results) and once on a local Ray cluster."""
import collections
import logging
import math
from types import SimpleNamespace

import pytest
from ray import tune
from ray.tune.search import Searcher

from hydro.examples.models import MLP
from hydro.trial.plan import TrialKind, plan_of
from hydro.tune import HydroSearcher, best_configuration, member_table, trainable
from schedulers.member_id import MemberId
from tests.tune.test_searcher import Scripted, member_result
from tests.tune.workload import SPACE, dead_at_full_width, spec


def finish(s, trial_id, plan, acc):
    """Report every member of ``plan`` for 2 epochs with ``acc(member)`` and complete the trial."""
    ids = [m for m, _ in plan.members]
    values = {m: acc(m) for m in ids}
    s.on_trial_result(trial_id, member_result(ids, 1, values))
    s.on_trial_complete(trial_id, member_result(ids, 2, values, done=True))


def test_seeds_ladder_and_top_k_targets(caplog):
    configs = [{"lr": 0.01 * (i + 1), "momentum": 0.0} for i in range(6)]
    inner = Scripted(configs)
    s = HydroSearcher(spec(), inner, num_samples=6, scale=8, fusion=4, ladder=True, eta=2, top_k=2, seeds=2,
                      escalate=False, fallback_targets=0)  # escalation and fallbacks: below
    s.set_search_properties("val_acc", "max", {})
    # S=8: config i scores i/10 (seed 1: + 0.02); at S=4 and S=2 the order of what is left reverses.
    quality = {8: lambda i: i / 10, 4: lambda i: 1 - i / 10, 2: lambda i: 1 - i / 10}

    def acc(member, scale):
        member = MemberId.parse(member)
        return quality[scale](int(member.config[1:])) + (0.02 if member.seed else 0.0)

    trials = {}
    while (config := s.suggest(f"t{len(trials)}")) not in (None, Searcher.FINISHED):
        trials[f"t{len(trials)}"] = plan_of(config)
    assert [sorted(m for m, _ in p.members) for p in trials.values()] == \
        [["m00000", "m00000#1", "m00001", "m00001#1"], ["m00002", "m00002#1", "m00003", "m00003#1"],
         ["m00004", "m00004#1", "m00005", "m00005#1"]]  # 4 members per trial: 2 configurations x 2 seeds
    for t, plan in trials.items():
        finish(s, t, plan, lambda m: acc(m, 8))
    # The inner searcher heard each configuration once, under its own id, with the mean of its seeds.
    assert sorted(inner.completed) == [(f"m{i:05d}", pytest.approx(i / 10 + 0.01), False) for i in range(6)]
    assert "m00000#1" not in {m for m, _ in inner.results}

    with caplog.at_level(logging.INFO, logger="hydro.tune.search.searcher"):
        rung4 = plan_of(s.suggest("r4"))
        assert s.suggest("wait") is None  # the next stage waits for this one
        assert (rung4.scale, rung4.mup, rung4.reports_objective) == (4, True, False)
        assert [m for m, _ in rung4.members] == ["m00005@4", "m00005@4#1", "m00004@4", "m00004@4#1",
                                                 "m00003@4", "m00003@4#1"]  # the best half of S=8, 2 seeds
        finish(s, "r4", rung4, lambda m: acc(m, 4))
        rung2 = plan_of(s.suggest("r2"))
        assert rung2.scale == 2 and [m for m, _ in rung2.members] == ["m00003@2", "m00003@2#1", "m00004@2",
                                                                      "m00004@2#1"]
        finish(s, "r2", rung2, lambda m: acc(m, 2))
        targets = [plan_of(s.suggest("a")), plan_of(s.suggest("b"))]
        assert s.suggest("after") is None  # every trial of the stages started: the run ends when they have
        assert [(p.kind, p.scale, p.mup, p.source["member"]) for p in targets] == \
            [(TrialKind.TARGET, 1, True, "m00003"), (TrialKind.TARGET, 1, True, "m00004")]
        assert targets[0].members[0][1] == configs[3]
        assert targets[0].source["scores"] == {"8": "0.31 ± 0.014 (n=2)", "4": "0.71 ± 0.014 (n=2)",
                                               "2": "0.71 ± 0.014 (n=2)"}
        s.on_trial_complete("a", {"val_acc": 0.5})
        s.on_trial_complete("b", {"val_acc": 0.6})  # the second best at S=2 wins at full size
        assert s.suggest("after") == Searcher.FINISHED
    assert inner.completed[-1][0] == "m00005" and len(inner.completed) == 6  # ladder members are not its trials
    report = s.transfer_report()
    assert report.startswith("val_acc of the returned configuration m00004 at each scale: S=8: 0.41 ± 0.014 (n=2), "
                             "S=4: 0.61 ± 0.014 (n=2), S=2: 0.61 ± 0.014 (n=2), full size: 0.6")
    # A reversal of 3 configurations happens by chance 1 time in 6: reported, but no alarm (too few to judge).
    assert report.endswith("S=8 vs S=4 over 3 configurations: rho -1.00")
    assert report in caplog.text and "transfer check: the rankings" not in caplog.text
    # The full-size target did worse than its own S=2 surrogate: that is warned about.
    assert "the returned configuration m00004 scored 0.6 at full size, 1.6% worse than at S=2 (0.61)" in caplog.text
    assert "2×2 seeds at S=2, 2 at full size: about" in caplog.text  # the cost, shown before the stages


def test_failed_target_and_restore_mid_ladder(tmp_path):
    s = HydroSearcher(spec(), num_samples=4, scale=4, fusion=4, ladder=True, eta=2, top_k=1, seed=0)
    s.set_search_properties("val_acc", "max", SPACE)
    plan = plan_of(s.suggest("t0"))
    finish(s, "t0", plan, lambda m: int(m[1:]) / 10)
    rung = plan_of(s.suggest("r2"))
    assert rung.scale == 2 and [m for m, _ in rung.members] == ["m00003@2", "m00002@2"]
    s.save(str(tmp_path / "searcher.pkl"))
    restored = HydroSearcher(spec(), num_samples=4, scale=4, fusion=4, ladder=True, eta=2, top_k=1)
    restored.restore(str(tmp_path / "searcher.pkl"))
    finish(restored, "r2", rung, lambda m: 0.9 if m.startswith("m00002") else 0.8)
    target = plan_of(restored.suggest("target"))
    assert target.source["member"] == "m00002"
    restored.on_trial_complete("target", None, error=True)  # lost before reporting (Tune gave up on it)
    again = plan_of(restored.suggest("again"))  # its members train again in a fresh trial (lost_trial_retries=1)
    assert again.members == target.members
    restored.on_trial_complete("again", None, error=True)
    assert restored.suggest("after") == Searcher.FINISHED
    assert restored.transfer_report().startswith("val_acc of the returned configuration m00002 at each scale: "
                                                 "S=4: 0.2, S=2: 0.9")


def test_a_regressed_target_is_followed_by_fallback_targets(caplog):
    s = HydroSearcher(spec(), num_samples=4, scale=4, fusion=4, ladder=True, eta=2, fallback_targets=2, seed=0)
    s.set_search_properties("val_acc", "max", SPACE)
    with caplog.at_level(logging.INFO, logger="hydro.tune.search.searcher"):
        finish(s, "t0", plan_of(s.suggest("t0")), lambda m: int(m[1:]) / 10)  # S=4: m00003 best
        rung = plan_of(s.suggest("r2"))
        assert [m for m, _ in rung.members] == ["m00003@2", "m00002@2"]
        finish(s, "r2", rung, lambda m: 0.8 if m.startswith("m00003") else 0.7)
        assert "if the target does worse than its surrogate, up to 2 more at full size (at most" in caplog.text
        target = plan_of(s.suggest("target"))
        assert target.source["member"] == "m00003"
        assert s.suggest("wait") is None  # not finished: fallback targets may follow
        s.on_trial_complete("target", {"val_acc": 0.6})  # 25% worse than at S=2
        fallbacks = [plan_of(s.suggest("f1")), plan_of(s.suggest("f2"))]
        assert s.suggest("after") is None  # the fallback targets are training
        # the second at S=2, then the best of the rest at S=4; each with the scores it has
        assert [(p.kind, p.scale, p.source["member"], p.source["val_acc"]) for p in fallbacks] == \
            [(TrialKind.TARGET, 1, "m00002", 0.7), (TrialKind.TARGET, 1, "m00001", 0.1)]
        assert fallbacks[1].source["scores"] == {"4": "0.1"}
        assert "the target m00003 scored 0.6 at full size, 25.0% worse than at S=2 (0.8): training 2 fallback " \
               "target(s) at full size, m00002, m00001" in caplog.text
        s.on_trial_complete("f2", {"val_acc": 0.65})
        s.on_trial_complete("f1", {"val_acc": 0.75})
        assert s.suggest("after") == Searcher.FINISHED
    assert s.transfer_report() == "val_acc of the returned configuration m00002 at each scale: S=4: 0.2, S=2: 0.7, " \
                                  "full size: 0.75"  # S=2 vs full size over 2 configurations: no rho
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fallback target(s)" in warnings[0]  # the returned configuration held


def test_a_regressed_target_escalates_to_s_over_2_and_the_ladder_goes_on_from_there(caplog):
    s = HydroSearcher(spec(), num_samples=4, scale=8, fusion=4, ladder=True, eta=2, fallback_targets=0, seed=0,
                      probes=0)  # no probes: the first rung is the best 2, the escalation trains the other 2
    s.set_search_properties("val_acc", "max", SPACE)
    with caplog.at_level(logging.INFO, logger="hydro.tune.search.searcher"):
        finish(s, "t0", plan_of(s.suggest("t0")), lambda m: int(m[1:]) / 10)  # S=8: m00003 best
        rung = plan_of(s.suggest("r4"))
        assert "if the rankings at S=8 and S=4 disagree or the target does worse than its surrogate, all at S=4 " \
               "and the ladder again from there: up to" in caplog.text  # the cost, up front
        assert [m for m, _ in rung.members] == ["m00003@4", "m00002@4"]
        finish(s, "r4", rung, lambda m: 0.8 if m.startswith("m00003") else 0.7)
        rung = plan_of(s.suggest("r2"))
        assert [m for m, _ in rung.members] == ["m00003@2"]
        finish(s, "r2", rung, lambda m: 0.8)
        assert plan_of(s.suggest("target")).source["member"] == "m00003"
        assert s.suggest("wait") is None  # not finished: an escalation may follow
        s.on_trial_complete("target", {"val_acc": 0.6})  # 25% worse than at S=2
        escalation = plan_of(s.suggest("e4"))
        assert (escalation.kind, escalation.scale) == (TrialKind.SURROGATE, 4)
        assert [m for m, _ in escalation.members] == ["m00001@4", "m00000@4"]  # the two not trained at S=4 yet
        assert "transfer check: the target m00003 scored 0.6 at full size, 25.0% worse than at S=2 (0.8): fidelity " \
               "escalation: training the 2 other configurations at S=4" in caplog.text
        finish(s, "e4", escalation, lambda m: 0.9 if m.startswith("m00000") else 0.5)
        rung = plan_of(s.suggest("e2"))  # the ladder from S=4 over all 4: its best 2 at S=2, m00003 trained there
        assert [m for m, _ in rung.members] == ["m00000@2"]
        finish(s, "e2", rung, lambda m: 0.9)
        target = plan_of(s.suggest("target2"))
        assert (target.kind, target.source["member"]) == (TrialKind.TARGET, "m00000")
        assert s.suggest("after") is None  # escalated once, no fallback targets asked for: the target trains
        s.on_trial_complete("target2", {"val_acc": 0.91})
        assert s.suggest("after") == Searcher.FINISHED
    assert s.transfer_report() == "val_acc of the returned configuration m00000 at each scale: S=8: 0, S=4: 0.9, " \
                                  "S=2: 0.9, full size: 0.91. Transfer check (Spearman): S=8 vs S=4 over 4 " \
                                  "configurations: rho -0.20 (95% upper bound 0.90)"


@pytest.mark.parametrize("gpus, max_concurrent, search_s, trials", [
    (1, None, 60.0, [2, 2]),  # the alive node's 2 cards: 2 trials at once (the dead node's 8 do not count)
    (1, None, 4.0, [4]),      # 8 s of training as one trial: a second trial's start (5 s) would cost more
    (1, 1, 60.0, [4]),        # max_concurrent_trials=1
    (0.5, None, 60.0, [2, 2]),  # fractions of a card share it: one fused trial per card
    (None, None, 60.0, [4]),  # no trial reported its resources: one fused trial
])
def test_a_rung_is_spread_over_the_trials_the_cluster_runs_at_once(monkeypatch, gpus, max_concurrent, search_s,
                                                                    trials):
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
             {"Alive": False, "Resources": {"CPU": 16.0, "GPU": 8.0}}]
    _mock_cluster(monkeypatch, nodes)  # a GPU cluster
    s = HydroSearcher(spec(epochs=2), num_samples=8, scale=4, fusion=8, ladder=True, eta=2, top_k=1, seed=0,
                      fallback_targets=0)
    s.set_search_properties("val_acc", "max", SPACE)
    if max_concurrent is not None:
        assert s.set_max_concurrency(max_concurrent) is False  # Tune still limits the trials itself
    plan = plan_of(s.suggest("t0"))
    ids = [m for m, _ in plan.members]
    values = {m: int(m[1:]) / 10 for m in ids}
    resources = {} if gpus is None else {"trial_cpus": 1.0, "trial_gpus": gpus}
    s.on_trial_result("t0", {**member_result(ids, 1, values), **resources})
    # the rung's 4 members at S=2 train (4 / 2)² x 4 / 8 = 2 times as long as the search's trial of 8 at S=4
    s.on_trial_complete("t0", {**member_result(ids, 2, values, done=True), **resources, "time_total_s": search_s})
    rung = []
    while isinstance(config := s.suggest(f"r{len(rung)}"), dict):
        rung.append(plan_of(config))
    assert [len(p.members) for p in rung] == trials and {p.scale for p in rung} == {2}
    assert [m for p in rung for m, _ in p.members] == ["m00007@2", "m00006@2", "m00005@2", "m00004@2"]


def test_a_stage_closes_on_its_members_last_results_before_tune_completes_its_trials():
    """Tune keeps as many idle workers as trials wait for them (one when none waits): the next stage's trials must
    be waiting when Tune completes this stage's trials, or all but one of their workers stop and new ones start."""
    s = HydroSearcher(spec(epochs=2), num_samples=8, scale=4, fusion=8, ladder=True, eta=2, top_k=1, seed=0,
                      fallback_targets=0)
    s.set_search_properties("val_acc", "max", SPACE)
    finish(s, "t0", plan_of(s.suggest("t0")), lambda m: int(m[1:]) / 10)
    rung = plan_of(s.suggest("r0"))
    ids = [m for m, _ in rung.members]
    assert rung.scale == 2 and ids == ["m00007@2", "m00006@2", "m00005@2", "m00004@2"]
    values = {m: 0.5 + int(m[1:6]) / 1000 for m in ids}  # m00007@2 best
    s.on_trial_result("r0", member_result(ids, 1, values))
    assert s.suggest("early") is None  # members still training: the stage is open
    s.on_trial_result("r0", {**member_result(ids, 2, values, done=True), "time_total_s": 30.0})
    config = s.suggest("target")
    assert isinstance(config, dict), "the target waits for Tune to complete the stage's trials"
    target = plan_of(config)
    assert target.kind == TrialKind.TARGET and target.source["member"] == "m00007"
    s.on_trial_complete("r0", {**member_result(ids, 2, values, done=True), "time_total_s": 30.0})
    assert s.suggest("again") is None  # every trial of the stages started; the completion adds none
    s.on_trial_complete("target", {"val_acc": 0.9})
    assert s.suggest("after") == Searcher.FINISHED
    state = s.driver.state
    assert list(state.targets) == ["target"] and [len(stage) for stage in state.stages] == [8, 4, 1]
    assert s.driver.policy.returned(state.stages) == "m00007"


@pytest.mark.parametrize("gpus, slots, rung", [
    (0.0, 2, ["m00005@2", "m00004@2"]),  # 3 at S=2 would train as trials of 2 and 1 members: the best 2 train
    (1.0, 1, ["m00005@2", "m00004@2", "m00003@2"]),  # GPU trials: a fused member hardly adds time, so ceil(6 / 2)
])
def test_a_rung_of_cpu_trials_leaves_out_a_last_round_of_the_trial_slots_half_full(monkeypatch, tmp_path, gpus,
                                                                                    slots, rung):
    _mock_cluster(monkeypatch, [{"Alive": True, "Resources": {"CPU": 2.0, "GPU": 2.0}}])

    def searcher():
        return HydroSearcher(spec(epochs=2), num_samples=6, scale=4, fusion=8, ladder=True, eta=2, top_k=1, seed=0,
                             fallback_targets=0)

    s = searcher()
    s.set_search_properties("val_acc", "max", SPACE)
    s.set_max_concurrency(2)
    plan = plan_of(s.suggest("t0"))  # all 6 members: no trial has reported its resources yet
    ids = [m for m, _ in plan.members]
    values = {m: int(m[1:]) / 10 for m in ids}
    resources = {"trial_cpus": 1.0, "trial_gpus": gpus}
    s.on_trial_result("t0", {**member_result(ids, 1, values), **resources})
    s.on_trial_complete("t0", {**member_result(ids, 2, values, done=True), **resources, "time_total_s": 60.0})
    trials = []
    while isinstance(config := s.suggest(f"r{len(trials)}"), dict):
        trials.append(plan_of(config))
    assert [m for p in trials for m, _ in p.members] == rung and s.driver.policy.slots == slots
    s.save(str(tmp_path / "searcher.pkl"))
    restored = searcher()
    restored.restore(str(tmp_path / "searcher.pkl"))  # replays the stages with the slots they were planned for
    driver = restored.driver
    assert driver.policy.slots == slots and driver.policy.next_rung(driver.state.stages) == driver.state.current.rung


def _mock_cluster(monkeypatch, nodes: list[dict]) -> None:
    """The searcher's Ray cluster as ``nodes`` (none runs here), its job started without a runtime env."""
    import hydro.tune.search.searcher as searcher_module

    monkeypatch.setattr(searcher_module.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(searcher_module.ray, "nodes", lambda: nodes)
    monkeypatch.setattr(searcher_module.ray, "get_runtime_context", lambda: SimpleNamespace(runtime_env={}))


def test_a_searcher_saved_before_the_search_driver_restores_mid_rung(monkeypatch, tmp_path):
    """A checkpoint whose state held the members and the stages itself (a ``TransferState``) goes on as saved."""
    import pickle

    import hydro.tune.search.searcher as searcher_module

    _mock_cluster(monkeypatch, [{"Alive": True, "Resources": {"CPU": 2.0}}])

    def searcher():
        s = HydroSearcher(spec(epochs=2), num_samples=6, scale=4, fusion=8, ladder=True, eta=2, top_k=1, seed=0,
                          seeds=2, fallback_targets=0)
        s.set_search_properties("val_acc", "max", SPACE)
        s.set_max_concurrency(2)
        return s

    def finish(s, trial_id, plan):
        ids = [m for m, _ in plan.members]
        values = {m: MemberId.parse(m).seed / 100 + int(m[1:6]) / 10 for m in ids}
        s.on_trial_result(trial_id, {**member_result(ids, 1, values), "trial_cpus": 1.0})
        s.on_trial_complete(trial_id, {**member_result(ids, 2, values, done=True), "time_total_s": 60.0})

    def rest(s):
        trials = []
        while isinstance(config := s.suggest(f"n{len(trials)}"), dict):
            trials.append(plan_of(config))
            if trials[-1].kind == TrialKind.TARGET:
                s.on_trial_complete(f"n{len(trials) - 1}", {"val_acc": 0.9})
            else:
                finish(s, f"n{len(trials) - 1}", trials[-1])
        return [(p.kind, p.scale, p.member_ids, p.source.get("member")) for p in trials], s.transfer_report()

    s = searcher()
    for trial_id in ("t0", "t1"):
        finish(s, trial_id, plan_of(s.suggest(trial_id)))
    r0 = plan_of(s.suggest("r0"))
    assert r0.scale == 2 and s.driver.state.current.waiting  # the first trial of the rung started
    s.save(str(tmp_path / "new.pkl"))
    with open(tmp_path / "new.pkl", "rb") as f:
        saved = pickle.load(f)
    driver, transfer = saved.pop("driver"), searcher_module.TransferState()  # the state as it was laid out before
    current = driver.current
    transfer.__dict__.update(stages=driver.stages, rung=current.rung, members=current.members,
                             waiting=current.waiting, targets=driver.targets, target_values=driver.target_values,
                             forwarded=driver.forwarded, started=driver.started, cpus=current.cpus,
                             widened=driver.widened, slots=driver.slots)
    saved["state"].__dict__.update(pool=driver.pool, ledger=driver.ledger, trial_groups=driver.trial_groups,
                                   trial_seconds=driver.trial_seconds, transfer=transfer)
    with open(tmp_path / "old.pkl", "wb") as f:
        pickle.dump(saved, f)
    restored = searcher()
    restored.restore(str(tmp_path / "old.pkl"))
    finish(s, "r0", r0)
    finish(restored, "r0", r0)
    expected = rest(s)
    assert expected[0][-1][0] == TrialKind.TARGET and rest(restored) == expected


@pytest.mark.parametrize("gpus, max_concurrent, search_s, rung_cpus, target_cpus", [
    (0, 2, 60.0, [None, None], 2),  # 2 slots of 1 CPU: the rung fills them; the lone target trains on both slots' CPUs
    (0, None, 60.0, [4, 4, 4, 4], 15),  # the node's 16 slots: the rung's 4 trials on 4 CPUs each, the target on 15
                                       # (a core left to Ray's processes)
    (0, 2, 0.2, [None], None),  # a target of 0.4 s: a second CPU would save less than a new trial's start costs
    (0, 1, 60.0, [None], None),  # max_concurrent_trials=1: no slot idle
    (1, None, 60.0, [None, None], None),  # GPU trials: their GPU does the work
])
def test_a_stage_that_leaves_trial_slots_idle_trains_on_their_cpus(monkeypatch, gpus, max_concurrent, search_s,
                                                                   rung_cpus, target_cpus):
    nodes = [{"Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 64.0}}]
    _mock_cluster(monkeypatch, nodes)
    s = HydroSearcher(spec(epochs=2), num_samples=8, scale=4, fusion=8, ladder=True, eta=2, top_k=1, seed=0,
                      fallback_targets=0)
    s.set_search_properties("val_acc", "max", SPACE)
    if max_concurrent is not None:
        s.set_max_concurrency(max_concurrent)
    plan = plan_of(s.suggest("t0"))
    assert plan.cpus is None  # the search: the trainable's request
    ids = [m for m, _ in plan.members]
    values = {m: int(m[1:]) / 10 for m in ids}
    resources = {"trial_cpus": 1.0, "trial_gpus": float(gpus)}
    s.on_trial_result("t0", {**member_result(ids, 1, values), **resources})
    # the search's 8 members at S=4 for 2 epochs: the target trains (4 / 1)² / 8 = 2 times as long
    s.on_trial_complete("t0", {**member_result(ids, 2, values, done=True), **resources, "time_total_s": search_s})
    rung = []
    while isinstance(config := s.suggest(f"r{len(rung)}"), dict):
        rung.append(plan_of(config))
    assert [p.cpus for p in rung] == rung_cpus
    for i, p in enumerate(rung):
        finish(s, f"r{i}", p, lambda m: 0.5)  # (scripted: no time reported, the target's estimate is the search's)
    target = plan_of(s.suggest("target"))
    assert target.kind == TrialKind.TARGET and target.cpus == target_cpus
    s.on_trial_result("target", {"val_acc": 0.5, "trial_cpus": float(target_cpus or 1), "trial_gpus": float(gpus)})
    assert s.state.trial_request == {"CPU": 1.0, "GPU": float(gpus)}  # a widened trial's resources are no slot's


def test_fit_spreads_the_search_over_the_trials_the_cluster_runs_at_once(ray_cluster, tmp_path):
    from hydro.tune.run import fit

    results, searcher = fit(spec(epochs=1), SPACE, num_samples=4, fusion=4, transfer_fraction=None, seed=0,
                            storage_path=str(tmp_path), name="slots", verbose=0)
    assert not results.errors and len(searcher.member_results()) == 4
    # fusion=4 asks for one trial of 4; the 2-CPU cluster runs 2 trials of 1 CPU at once: 2 of 2
    assert sorted(len(r.config["hydro"].members) for r in results) == [2, 2]
    assert {(r.metrics["trial_cpus"], r.metrics["trial_gpus"]) for r in results} == {(1.0, 0.0)}


def test_a_plain_tuner_without_a_param_space_spreads_the_search_over_the_trial_slots(ray_cluster, tmp_path):
    workload = spec(epochs=1)
    configs = [{"lr": 0.01 * (i + 1), "momentum": 0.9} for i in range(4)]  # the inner searcher holds the space
    searcher = HydroSearcher(workload, Scripted(configs), num_samples=4, fusion=4, transfer_fraction=None)
    results = tune.Tuner(
        trainable(workload), tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1),
        run_config=tune.RunConfig(name="no_space", storage_path=str(tmp_path), verbose=0)).fit()
    assert not results.errors
    # no trial_resources and Tune never calls set_search_properties: the trainable's request is learned at the
    # first suggestion, and the 2-CPU cluster's 2 slots each get a trial of 2
    assert sorted(len(plan_of(r.config).members) for r in results) == [2, 2]


@pytest.mark.parametrize("lone_trial_cpus, target", [(1.0, (None, 1.0, 1)), (2.0, (2, 2.0, 2))])
def test_every_trial_trains_with_the_torch_threads_of_the_cpus_ray_granted_it(ray_cluster, tmp_path, monkeypatch,
                                                                              lone_trial_cpus, target):
    import hydro.tune.search.searcher as searcher_module
    import schedulers.search_driver as driver_module
    from hydro.tune.run import fit

    monkeypatch.setattr(driver_module, "TRIAL_OVERHEAD_S", 0.0)  # this tiny target is worth widening at any cost
    # a lone trial may use at most the node's CPUs less one where workers spin-wait in OpenMP (the fixture's cluster
    # does not set passive waits): the 2-CPU node widens nothing; where it may use 2, the lone target is widened to
    # the 2 CPUs of both slots
    monkeypatch.setattr(searcher_module._RayCluster, "lone_trial_cpus", lambda self: lone_trial_cpus)

    results, _ = fit(spec(epochs=1), SPACE, num_samples=4, fusion=4, scale=2, seed=0, storage_path=str(tmp_path),
                     name=f"wide_target_{lone_trial_cpus:g}", verbose=0)
    assert not results.errors
    cpus = sorted((plan_of(r.config).kind.value, plan_of(r.config).cpus, r.metrics["trial_cpus"],
                   r.metrics["torch_threads"]) for r in results)
    # the search as 2 trials of 1 CPU on the 2-CPU cluster, then the target alone: a widened one asks Ray for its CPUs
    # and trains on them as torch threads, never on more threads than Ray granted it
    assert cpus == [("surrogate", None, 1.0, 1), ("surrogate", None, 1.0, 1), ("target", *target)]


def test_the_stages_of_a_run_reuse_warm_workers_with_the_same_results(ray_cluster, tmp_path, monkeypatch):
    import schedulers.search_driver as driver_module

    monkeypatch.setattr(driver_module, "TRIAL_OVERHEAD_S", 0.0)  # the rung spreads over both slots
    workload = spec(epochs=2, model=lambda config: MLP((64, 64, 64, 10)))
    runs = {}
    for reuse in (True, False):
        searcher = HydroSearcher(workload, num_samples=8, fusion=8, scale=4, seed=0, ladder=True, eta=2, top_k=1,
                                 fallback_targets=0)
        runs[reuse] = tune.Tuner(
            trainable(workload), param_space=SPACE,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max",
                                        reuse_actors=reuse),
            run_config=tune.RunConfig(name=f"reuse_{reuse}", storage_path=str(tmp_path), verbose=0)).fit()
        assert not runs[reuse].errors
    warm, cold = ([(plan_of(r.config), r.metrics) for r in runs[reuse]] for reuse in (True, False))
    assert {plan.kind for plan, _ in warm} == {TrialKind.SURROGATE, TrialKind.TARGET}
    assert not any(plan.cpus for plan, _ in warm)  # the 2-CPU node: no stage is widened (a core stays Ray's)
    # every stage in the 2 trial slots' warm workers (search, rung, target); without reuse, a process per trial (how
    # many trials a rung takes depends on its measured time)
    assert len({m["worker_pid"] for _, m in warm}) <= 2 < len(warm)
    assert len({m["worker_pid"] for _, m in cold}) == len(cold)
    # a later trial at a scale its worker built before takes the worker's surrogate template
    seen = collections.defaultdict(set)
    for plan, m in sorted(warm, key=lambda t: t[1]["trial_started_at"]):
        if plan.scale > 1 and plan.scale in seen[m["worker_pid"]]:
            assert m["cached_templates"] >= 1
        seen[m["worker_pid"]].add(plan.scale)
    assert any(m["cached_templates"] for _, m in warm)
    values = {reuse: member_table(runs[reuse], workload)[["member", "kind", "val_acc", "train_loss"]]
              .sort_values(["kind", "member"]).to_numpy().tolist() for reuse in runs}
    assert len(values[True]) == 8 + 4 + 1 and values[True] == values[False]  # the same results, bit for bit
    best = {reuse: best_configuration(runs[reuse], workload) for reuse in runs}
    assert [best[True][k] for k in ("config", "value", "kind")] == [best[False][k] for k in ("config", "value", "kind")]


def test_bad_transfer_settings_are_rejected_before_the_run():
    with pytest.raises(ValueError, match="top_k must be an int >= 1"):
        HydroSearcher(spec(), num_samples=4, top_k=0)


def test_a_regressed_target_gets_fallback_targets_on_a_local_cluster(ray_cluster, tmp_path):
    workload = spec(epochs=2, model=dead_at_full_width)
    searcher = HydroSearcher(workload, num_samples=4, fusion=4, scale=4, seed=0, ladder=True, eta=2,
                             fallback_targets=2)
    space = {"lr": tune.loguniform(0.05, 0.5), "momentum": 0.9}  # every surrogate learns
    results = tune.Tuner(
        trainable(workload), param_space=space,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max"),
        run_config=tune.RunConfig(name="fallback", storage_path=str(tmp_path), verbose=0)).fit()
    assert not results.errors
    table = member_table(results, workload)
    targets = table[table["kind"] == "target"]
    stages = searcher.driver.state.stages
    assert [len(s) for s in stages] == [4, 2, 1, 2]  # search, S=2, the target, 2 fallback targets
    target, = stages[2]
    trained = [plan_of(r.config).source["member"] for r in results if plan_of(r.config).kind == TrialKind.TARGET]
    assert sorted(trained) == sorted([target, *stages[3]]) and len(targets) == 3
    assert searcher.driver.policy.regression(stages[:3]).config == target  # a chance-level full-size model
    best = best_configuration(results, workload)
    assert best["kind"] == "target" and best["value"] == pytest.approx(targets["val_acc"].max())
    assert best["source"]["member"] == searcher.driver.policy.returned(stages)


def test_ladder_seeds_and_top_k_on_a_local_cluster(ray_cluster, tmp_path):
    workload = spec(epochs=2, model=lambda config: MLP((64, 64, 64, 10)))
    searcher = HydroSearcher(workload, num_samples=4, fusion=8, scale=4, seed=0, ladder=True, eta=2, top_k=2,
                             seeds=2, fallback_targets=0)  # fallback targets: the test below
    results = tune.Tuner(
        trainable(workload), param_space=SPACE,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max",
                                    reuse_actors=True),
        run_config=tune.RunConfig(name="ladder", storage_path=str(tmp_path), verbose=0)).fit()
    assert not results.errors
    table = member_table(results, workload)
    members = collections.Counter()
    for r in results:
        members[r.config["hydro"].kind, r.config["hydro"].scale] += len(r.config["hydro"].members)
    # the search (4 configurations x 2 seeds at S=4), the ladder's S=2 (top 2 x 2 seeds), 2 full-size targets (how
    # many trials a stage takes depends on its measured time: test_a_rung_is_spread_over_the_trials_...)
    assert members == {("surrogate", 4): 8, ("surrogate", 2): 4, ("target", 1): 2}
    assert sum(r.config["hydro"].kind == "target" for r in results) == 2
    assert len(table) == 8 + 4 + 2 and table["val_acc"].notna().all()
    best = best_configuration(results, workload)
    targets = table[table["kind"] == "target"]
    assert best["kind"] == "target" and best["value"] == pytest.approx(targets["val_acc"].max())
    assert set(best["source"]["scores"]) == {"4", "2"}
    report = searcher.transfer_report()
    assert f"full size: {best['value']:.4g}" in report and "S=4: " in report and "S=2: " in report
    assert math.isfinite(best["value"])
    for r in results:  # the rung (S=2) evaluates only its last epoch; its first still reports the training loss
        plan, rows = r.config["hydro"], r.metrics_dataframe.sort_values("epoch")
        if plan.kind == "surrogate":
            for member in plan.member_ids:
                first, last = rows.iloc[0], rows.iloc[-1]
                assert math.isfinite(first[f"members/{member}/train_loss"])
                assert math.isnan(first[f"members/{member}/val_acc"]) == (plan.scale == 2)
                assert math.isfinite(last[f"members/{member}/val_acc"])


def test_the_target_starts_beside_the_last_rungs_straggler_with_the_same_returned_configuration(
        ray_cluster, tmp_path, monkeypatch):
    import schedulers.search_driver as driver_module
    from hydro.tune import accuracy
    from hydro.tune.run import fit, prepare
    from tests.tune.workload import Sleeping, StartTogether

    # evaluation takes 2 s per member: the last rung's 3 configurations at S=2 in trials of 2 and 1 end 2 s apart, the
    # one of 1 first (its target starts on its warm worker at once); with top_k=3 all 3 train at full size, so its
    # configuration starts its target beside the other. The search's 2 trials start training together (their workers
    # may start seconds apart), so the rung's 2 trials start together on the freed workers.
    monkeypatch.setattr(driver_module, "TRIAL_OVERHEAD_S", 0.0)
    model = lambda config: MLP((64, 64, 64, 10))  # noqa: E731
    # the workload checked once, without the sleeping metric (fit's own check would sleep through 3 evaluations a run)
    data = prepare(spec(epochs=1, model=model), SPACE, scale=4)
    runs = {}
    for early in (True, False):
        if not early:
            monkeypatch.setattr(driver_module, "early_targets", lambda *args: [])
        (tmp_path / f"started_{early}").mkdir()
        workload = spec(epochs=1, model=model, loss=StartTogether(str(tmp_path / f"started_{early}")),
                        metrics={"val_acc": accuracy, "slow": Sleeping(2.0)})
        results, searcher = fit(workload, SPACE, num_samples=6, fusion=6, scale=4, seed=0, ladder=True, eta=2,
                                top_k=3, fallback_targets=0, escalate=False, probes=0, storage_path=str(tmp_path),
                                name=f"early_{early}", verbose=0, data=data)
        assert not results.errors
        trials = [(plan_of(r.config), r.metrics) for r in results]
        rung = sorted(((len(plan.members), m) for plan, m in trials if plan.scale == 2), key=lambda t: t[0])
        targets = [m for plan, m in trials if plan.kind == TrialKind.TARGET]
        assert [n for n, _ in rung] == [1, 2] and len(targets) == 3
        (_, one), (_, two) = rung
        if early and (one["trial_started_at"] > two["reported_at"] or two["trial_started_at"] > one["reported_at"]):
            pytest.skip("the rung's trials ran one after the other: the loaded machine started no second worker in "
                        "time, so there was no straggler to overlap")
        overlap = min(t["trial_started_at"] for t in targets) < two["reported_at"]
        runs[early] = overlap, searcher.driver.state.stages, best_configuration(results, workload)["config"]
    (overlap, stages, returned), (overlap_waiting, stages_waiting, returned_waiting) = runs[True], runs[False]
    assert overlap and not overlap_waiting  # a target trained while the rung's trial of 2 still did
    assert stages == stages_waiting and returned == returned_waiting  # every stage's scores, the target's included


@pytest.mark.parametrize("space, halves", [(SPACE, None), ({"lr": tune.loguniform(1e-4, 3e-2), "momentum": 0.0}, True)])
def test_the_rungs_halve_as_the_search_members_reported_curves_decide(ray_cluster, tmp_path, caplog, space, halves):
    """``halving="auto"`` (the default) on a local cluster: the decision equals the pure choice recomputed from what
    the search members reported to Tune, and the rung's trials halve exactly when it says so (learning rates alone
    rank after epoch 1 as after 4: halving; ``None``: either)."""
    from schedulers.halving_choice import choose_halving
    from schedulers.rung_halving import milestones

    workload = spec(epochs=4, model=lambda config: MLP((64, 64, 64, 10)))
    searcher = HydroSearcher(workload, num_samples=12, fusion=12, scale=4, seed=0, ladder=True, eta=2,
                             fallback_targets=0)
    with caplog.at_level(logging.INFO, logger="hydro"):
        results = tune.Tuner(
            trainable(workload), param_space=space,
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, metric="val_acc", mode="max",
                                        reuse_actors=True),
            run_config=tune.RunConfig(name="halving", storage_path=str(tmp_path), verbose=0)).fit()
    assert not results.errors
    curves, final = {}, {}
    for r in results:
        plan = plan_of(r.config)
        if plan.kind == TrialKind.SURROGATE and plan.scale == 4:  # the search's trials: every epoch reported
            rows = r.metrics_dataframe.set_index("epoch")
            for member in plan.member_ids:
                curves[member] = {e: rows.loc[e, f"members/{member}/val_acc"] for e in milestones(4, 2)}
                final[member] = rows.loc[4, f"members/{member}/val_acc"]
    choice = choose_halving(milestones(4, 2), curves, final, "max", 0.5)
    assert halves in (None, choice.halving), choice.reason
    assert len(final) == 12 and searcher.driver.state.halving is choice.halving is searcher.driver.policy.halving
    assert f"rung halving {'on' if choice.halving else 'off'}: {choice.reason}" in caplog.text
    rung = [r for r in results if plan_of(r.config).scale == 2]
    assert rung and all((plan_of(r.config).halving is not None) == choice.halving for r in rung)
    table = member_table(results, workload)
    stopped = table[(table["kind"] == "surrogate") & table["member"].str.endswith("@2") & (table["epochs"] < 4)]
    # 6 configurations at S=2 down to the target's 1: each trial keeps its share to the end
    expected = sum(len(plan_of(r.config).members) - plan_of(r.config).halving.keep[-1] for r in rung
                   if choice.halving)
    assert len(stopped) == expected and (expected > 0) == choice.halving
