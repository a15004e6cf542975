"""SearchDriver (pure): the stage machine from the search through the ladder rungs to the targets and fallback
targets, driven with plain inputs and no Ray."""
import logging
import pickle

import pytest

from schedulers.member_ledger import EventKind
from schedulers.member_pool import MemberPool, Suggestion
from schedulers.search_driver import SearchDriver, Stage
from schedulers.transfer import TransferPolicy


class Cluster:
    def __init__(self, slots=1, request=None, lone_trial_cpus=1.0):
        self.slots, self.request, self.cpus = slots, request or {"CPU": 1.0}, lone_trial_cpus

    def trial_request(self):
        return self.request

    def trial_slots(self):
        return self.slots

    def lone_trial_cpus(self):
        return self.cpus


def driver(num_samples=4, **options):
    policy = TransferPolicy(1.0, num_samples, "acc", "max", **{"scale": 4, **options})
    return SearchDriver(policy, MemberPool(num_samples, 8), "acc", 2, lambda config: config.get("width", 0))


def suggest_from(configs):
    configs = list(configs)
    return lambda member: configs.pop(0) if configs else Suggestion.FINISHED


def report(d, trial_id, members, acc, cluster, done=True, seconds=10.0):
    return d.on_result(trial_id, {m: {"acc": acc(m), "epoch": 2 if done else 1, "done": done} for m in members},
                       cluster, seconds)


def test_search_ladder_target_and_done_with_the_inner_searchers_events():
    d, cluster = driver(ladder=True, top_k=1, seeds=2, fallback_targets=0, escalate=False), Cluster()
    configs = [{"lr": i} for i in range(4)]
    quality = {4: lambda c: c / 10, 2: lambda c: 1 - c / 10}  # the ladder reverses the search's order
    assert d.stage is Stage.SEARCH
    trial = d.next_trial("t0", suggest_from(configs), lambda key, config: 8, cluster)
    assert trial.stage is Stage.SEARCH and trial.scale == 4 and not trial.is_target
    ids = [m for m, _ in trial.members]
    assert ids == ["m00000", "m00000#1", "m00001", "m00001#1", "m00002", "m00002#1", "m00003", "m00003#1"]
    events = report(d, "t0", ids, lambda m: quality[4](int(m[1:6])), cluster, done=False)
    assert [(e.member, e.kind) for e in events] == [(f"m0000{i}", EventKind.RESULT) for i in range(4)]  # first seeds
    events = d.on_trial_complete("t0", False, cluster)
    events = report(d, "t0", ids, lambda m: quality[4](int(m[1:6])), cluster) + events
    assert sorted((e.member, e.kind) for e in events) == [(f"m0000{i}", EventKind.COMPLETE) for i in range(4)]
    assert d.stage is Stage.SEARCH and d.next_trial("r", suggest_from([]), lambda key, config: 8, cluster)

    rung = d.state.current.rung
    assert d.stage is Stage.RUNG and rung.scale == 2
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster) is None  # "r" holds the rung
    members = d.state.current.members
    assert members == ["m00003@2", "m00003@2#1", "m00002@2", "m00002@2#1"]
    assert report(d, "r", members, lambda m: quality[2](int(m[1:6])), cluster) == []  # ladder members: not the inner's
    assert d.stage is Stage.TARGET
    target = d.next_trial("target", suggest_from([]), lambda key, config: 8, cluster)
    assert target.is_target and target.members == [("m00002", {"lr": 2})] and target.scale == 1
    assert target.source["member"] == "m00002" and set(target.source["scores"]) == {"4", "2"}
    assert d.state.started and d.done() and d.stage is Stage.TARGET  # every trial started; the target trains
    d.on_target_complete("target", 0.9, cluster)
    assert d.stage is Stage.DONE and d.done() and d.policy.returned(d.state.stages) == "m00002"
    assert "acc of the returned configuration m00002 at each scale: S=4: " in d.report()


def test_a_regressed_target_is_followed_by_fallback_targets(caplog):
    d, cluster = driver(ladder=False, top_k=1, fallback_targets=1, escalate=False), Cluster()
    trial = d.next_trial("t0", suggest_from([{"lr": i} for i in range(4)]), lambda key, config: 8, cluster)
    ids = [m for m, _ in trial.members]
    report(d, "t0", ids, lambda m: int(m[1:]) / 10 + 0.5, cluster)
    d.on_trial_complete("t0", False, cluster)
    target = d.next_trial("t1", suggest_from([]), lambda key, config: 8, cluster)
    assert target.stage is Stage.TARGET and target.members[0][0] == "m00003"
    with caplog.at_level(logging.WARNING, logger="schedulers.search_driver"):
        d.on_target_complete("t1", 0.1, cluster)  # far below its surrogate's 0.8
    assert d.stage is Stage.FALLBACK and "fallback target" in caplog.text
    fallback = d.next_trial("t2", suggest_from([]), lambda key, config: 8, cluster)
    assert fallback.stage is Stage.FALLBACK and fallback.members[0][0] == "m00002"
    d.on_target_complete("t2", 0.7, cluster)
    assert d.stage is Stage.DONE and d.policy.returned(d.state.stages) == "m00002"


@pytest.mark.parametrize("lone_trial_cpus, cpus", [(8.0, 4), (3.0, 3), (1.0, None)])
def test_a_lone_target_trains_on_the_idle_slots_cpus_as_far_as_the_cluster_allows_one_trial(lone_trial_cpus, cpus):
    d, cluster = driver(ladder=False, top_k=1, fallback_targets=0), Cluster(slots=4, lone_trial_cpus=lone_trial_cpus)
    suggest = suggest_from([{"lr": i} for i in range(4)])
    for t in ["t0", "t1", "t2", "t3"]:
        trial = d.next_trial(t, suggest, lambda key, config: 8, cluster)
        assert len(trial.members) == 1  # an even share per slot: one configuration per search trial
        report(d, t, [m for m, _ in trial.members], lambda m: int(m[1:]) / 10, cluster, seconds=600.0)
        d.on_trial_complete(t, False, cluster)
    target = d.next_trial("target", suggest_from([]), lambda key, config: 8, cluster)
    # 4 slots of 1 CPU: all of them where one trial may use 8 CPUs; where it may use 3, those (1: not widened)
    assert target.is_target and target.cpus == cpus and ("target" in d.state.widened) == (cpus is not None)


@pytest.mark.parametrize("gpu", [0.0, 1.0])
def test_the_state_saves_and_restores_as_plain_data_mid_stage(gpu):
    cluster = Cluster(slots=2, request={"CPU": 1.0, "GPU": gpu})
    d = driver(num_samples=6, ladder=True, eta=2, top_k=1, fallback_targets=0)
    trials = {}
    while (trial := d.next_trial(f"t{len(trials)}", suggest_from([{"lr": i} for i in range(6)][len(trials) * 3:]),
                                 lambda key, config: 8, cluster)) is not None and trial.stage is Stage.SEARCH:
        trials[f"t{len(trials)}"] = trial
    for t, trial in trials.items():
        report(d, t, [m for m, _ in trial.members], lambda m: int(m[1:]) / 10, cluster)
        d.on_trial_complete(t, False, cluster)
    first = d.next_trial("r0", suggest_from([]), lambda key, config: 8, cluster)
    assert first.stage is Stage.RUNG and d.state.slots == (1 if gpu else 2)
    restored = driver(num_samples=6, ladder=True, eta=2, top_k=1, fallback_targets=0)
    restored.restore(pickle.loads(pickle.dumps(d.state)))
    assert restored.stage is Stage.RUNG and restored.policy.slots == d.policy.slots
    assert restored.policy.next_rung(restored.state.stages) == restored.state.current.rung
    assert restored.next_trial("r1", suggest_from([]), lambda key, config: 8, cluster) == \
        d.next_trial("r1", suggest_from([]), lambda key, config: 8, cluster)


def test_a_lost_trial_renamed_keeps_its_members_and_target():
    d, cluster = driver(top_k=1, fallback_targets=0), Cluster()
    trial = d.next_trial("t0", suggest_from([{"lr": i} for i in range(4)]), lambda key, config: 8, cluster)
    d.rename_trial("t0", "t0-again")
    assert d.state.ledger.trials == {"t0-again": [m for m, _ in trial.members]} and d.state.trial_groups == {"t0-again": 0}


def test_a_search_whose_members_stopped_early_still_spreads_the_first_rung_over_the_slots():
    d, cluster = driver(num_samples=8, ladder=True, escalate=False, fallback_targets=0), Cluster(slots=2)
    trials = [d.next_trial(f"s{i}", suggest_from([{"lr": i} for i in range(8)][4 * i:4 * i + 4]),
                           lambda key, config: 8, cluster) for i in range(2)]
    for i, trial in enumerate(trials):  # per-member stopping: most members stopped after their first epoch
        d.on_result(f"s{i}", {m: {"acc": int(m[1:]) / 10, "epoch": 2 if m.endswith(("3", "7")) else 1, "done": True}
                              for m, _ in trial.members}, cluster, seconds=400.0)
    # 800 s over 10 member-epochs at S=4: the rung of 2 at S=2 would train 2 × 2 epochs × 320 s in one slot
    assert d._rung_seconds(2, 2) == pytest.approx(800 / 10 * 4 * 2 * 2)
    first = d.next_trial("r0", suggest_from([]), lambda key, config: 8, cluster)
    second = d.next_trial("r1", suggest_from([]), lambda key, config: 8, cluster)
    assert first.stage is second.stage is Stage.RUNG and len(first.members) == len(second.members) == 1


@pytest.mark.parametrize("search_trials, rung_trials", [(2, 2), (1, 1)])
def test_a_rung_spreads_onto_the_runs_warm_workers_when_that_saves_more_than_their_set_up(search_trials, rung_trials):
    d, cluster = driver(num_samples=8, ladder=True, escalate=False, fallback_targets=0), Cluster(slots=search_trials)
    configs = [{"lr": i} for i in range(8)]
    for i in range(search_trials):
        trial = d.next_trial(f"s{i}", suggest_from(configs[8 // search_trials * i:8 // search_trials * (i + 1)]),
                             lambda key, config: 8, cluster)
        report(d, f"s{i}", [m for m, _ in trial.members], lambda m: int(m[1:]) / 10, cluster,
               seconds=6.0 / search_trials)  # 3/8 s per member-epoch
        d.on_trial_complete(f"s{i}", False, cluster)
    cluster.slots = 2  # (a second node joined after a search of one trial: one warm worker)
    # the rung's 2 configurations at S=2 train 2 × 2 epochs × (4/2)² × 3/8 s = 6 s in one slot: spread over 2 slots
    # they save 3 s, more than a warm worker's set-up (1 s) but less than a fresh worker's start (5 s)
    assert d._rung_seconds(2, 2) == pytest.approx(6.0)
    rung = []
    while (trial := d.next_trial(f"r{len(rung)}", suggest_from([]), lambda key, config: 8, cluster)) is not None:
        rung.append(trial)
    assert [t.stage for t in rung] == [Stage.RUNG] * rung_trials
    assert sum(len(t.members) for t in rung) == 2


def test_rungs_train_and_group_the_configurations_as_the_search_trained_them():
    policy = TransferPolicy(1.0, 4, "acc", "max", scale=4, ladder=True, top_k=4, seeds=1, fallback_targets=0,
                            escalate=False)
    d = SearchDriver(policy, MemberPool(4, 8), "acc", 2, lambda config: config.get("batch_size"))
    cluster = Cluster()
    trial = d.next_trial("t0", suggest_from([{"lr": i} for i in range(4)]), lambda key, config: 8, cluster)
    # a trial scheduler set each search member's batch size (as hydro tune --energy's bandit does per trial)
    d.trained_with([(m, {**config, "batch_size": 16 if m < "m00002" else 32}) for m, config in trial.members])
    d.trained_with([("m00000@2", {"lr": 0, "batch_size": 64})])  # not a search member: ignored
    report(d, "t0", [m for m, _ in trial.members], lambda m: int(m[1:6]) / 10, cluster)
    d.on_trial_complete("t0", False, cluster)
    first = d.next_trial("r", suggest_from([]), lambda key, config: 8, cluster)
    assert d.stage is Stage.RUNG
    trials = [first.members, *d.state.current.waiting]
    batches = sorted(sorted({c["batch_size"] for _, c in members}) for members in trials)
    assert batches == [[16], [32]]  # one fused trial per batch size, each as its members trained
    assert sorted(m for members in trials for m, _ in members) == sorted(
        f"{c}@2" for c in d.state.current.rung.configs)


def _to_the_last_rung(cluster, top_k=2):
    """A driver whose search (6 configurations at S=4, in 2 trials) finished and whose one rung (S=2, before the
    targets) has started its trials; returns it and the rung's trials' member ids (top_k=2: 3 configurations, in
    trials of 2 and 1; top_k=1: 2 configurations, in trials of 1)."""
    d = driver(num_samples=6, ladder=True, eta=2, top_k=top_k, fallback_targets=0, escalate=False, probes=0)
    suggest = suggest_from([{"lr": i} for i in range(6)])
    for t in ("t0", "t1"):
        trial = d.next_trial(t, suggest, lambda key, config: 8, cluster)
        assert trial.stage is Stage.SEARCH and len(trial.members) == 3  # an even share of each of the 2 slots
        report(d, t, [m for m, _ in trial.members], lambda m: int(m[1:]) / 10, cluster, seconds=600.0)
        d.on_trial_complete(t, False, cluster)
    rung = [d.next_trial(r, suggest, lambda key, config: 8, cluster) for r in ("r0", "r1")]
    assert [t.stage for t in rung] == [Stage.RUNG] * 2 and d.state.current.rung.scale == 2
    assert [len(t.members) for t in rung] == ([2, 1] if top_k == 2 else [1, 1])
    return d, [[m for m, _ in t.members] for t in rung]


def _targets(d, cluster, values, early):
    """Close the rung (``r0`` first; ``values``: the rung's member -> acc), asking for a trial in between when
    ``early``, and finish every target (config index / 10). Returns the target trials started by trial id."""
    started = {}
    (r0, r1) = [[m for m in ids] for ids in d.state.ledger.trials.values()][-2:]
    report(d, "r0", r0, values.get, cluster)
    if early and (trial := d.next_trial("early", suggest_from([]), lambda key, config: 8, cluster)) is not None:
        started["early"] = trial
    report(d, "r1", r1, values.get, cluster)
    while (trial := d.next_trial(f"target{len(started)}", suggest_from([]), lambda key, config: 8, cluster)):
        started[f"target{len(started)}"] = trial
    for trial_id, trial in started.items():
        d.on_target_complete(trial_id, int(trial.members[0][0][1:]) / 10, cluster)
    return started


def config_of(member):
    return member.split("@")[0]


@pytest.mark.parametrize("straggler", [0.9, 0.1])  # the straggler's score: first or last in the rung
def test_a_target_the_stragglers_cannot_change_starts_beside_them_and_the_run_returns_what_waiting_returns(straggler):
    cluster = Cluster(slots=2, lone_trial_cpus=8.0)  # a lone target is widened to both slots' CPUs
    runs = {}
    for early in (False, True):
        d, (r0, r1) = _to_the_last_rung(cluster)
        assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster) is None  # both slots hold the rung
        values = {r0[0]: 0.5, r0[1]: 0.7, r1[0]: straggler}
        runs[early] = d, _targets(d, cluster, values, early)
    (waited, waited_trials), (d, trials) = runs[False], runs[True]
    # top_k=2 of 3: r0's best ranks in the top 2 whatever the one configuration left scores, so it starts beside r1
    assert trials["early"].members[0][0] == config_of(r0[1]) and trials["early"].cpus is None  # the slot's CPUs
    chosen = {config_of(r0[1]), config_of(r1[0]) if straggler > 0.5 else config_of(r0[0])}
    assert {t.members[0][0] for t in waited_trials.values()} == {t.members[0][0] for t in trials.values()} == chosen
    assert len(trials) == 2  # the early target is not started again
    assert d.stage is Stage.DONE and d.done() and waited.stage is Stage.DONE
    assert d.state.stages == waited.state.stages and d.policy.returned(d.state.stages) == \
        waited.policy.returned(waited.state.stages)
    assert d.report() == waited.report()


def test_no_early_target_while_a_straggler_can_change_it_or_without_an_idle_slot():
    cluster = Cluster(slots=2)
    d, (r0, r1) = _to_the_last_rung(cluster, top_k=1)
    report(d, "r0", r0, lambda m: 0.9, cluster)
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster) is None  # r1 can still finish first
    report(d, "r1", r1, lambda m: 0.1, cluster)
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster).members[0][0] == config_of(r0[0])
    d, (r0, r1) = _to_the_last_rung(cluster)
    report(d, "r0", r0, lambda m: 0.5, cluster, done=False)  # r0 reports but none of its members finished
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster) is None
    report(d, "r0", r0, lambda m: 0.5, cluster)
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, Cluster(slots=1)) is None  # r1 holds the slot
    assert d.next_trial("x", suggest_from([]), lambda key, config: 8, cluster).is_target  # a second slot: it starts
