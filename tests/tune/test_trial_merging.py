"""The Ray side of merging fused trials (the hand-over box, the searcher's bookkeeping) on a local Ray cluster, driven
step by step as Tune would drive it: a trial that fails or passes the merge's epoch before handing over leaves the
merge, and no member is lost."""
from __future__ import annotations

import io
import uuid
from types import SimpleNamespace

import pytest
import torch

from hydro.trial.plan import TrialKind, TrialPlan, plan_of
from hydro.trial.unit import FusedTrial
from hydro.tune.placement.trial_merging import MERGED_KEY, TrialMerging, merged_state
from schedulers.member_pool import MemberPool
from schedulers.placement.cluster import GpuType
from schedulers.placement.predicted_finish import PredictedFinish
from schedulers.search_driver import SearchDriver
from schedulers.transfer import TransferPolicy
from tests.prediction.workload import grouped_sgd
from tests.tune.workload import small_digits, spec

CONFIGS = {"m0": {"lr": 0.1, "momentum": 0.9}, "m1": {"lr": 0.05, "momentum": 0.0},
           "m2": {"lr": 0.2, "momentum": 0.9}, "m3": {"lr": 0.02, "momentum": 0.9}}
TRIALS = {"a": ["m0", "m1"], "b": ["m2", "m3"]}


def run_of_two_trials():
    """A search driver whose trials a and b each train two members of one group (fusion count 2), placed on two
    GPUs of one type, and the merging of their run."""
    driver = SearchDriver(TransferPolicy(None, 4, "val_acc", "max"), MemberPool(4, 2), "val_acc", 4, lambda c: "g")
    finish = PredictedFinish({"A": GpuType("A", 1.0, 0.01)}, {"A": 2})
    for trial, members in TRIALS.items():
        driver.state.ledger.add_trial(trial, members)
        driver.state.trial_groups[trial] = "g"
        finish.choose(trial, work_per_member=0.0001, members=2, steps=40)
    driver.state.pool.fusion["g"] = 2
    merging = TrialMerging(SimpleNamespace(finish=finish), 4, f"test-merges-{uuid.uuid4().hex[:8]}")
    return driver, merging


def config_of(trial):
    plan = TrialPlan(TrialKind.SURROGATE, [(m, CONFIGS[m]) for m in TRIALS[trial]])
    return {**plan.to_config(), "hydro_gpu": "placed"}


def report(driver, merging, trial, epoch, stopped=()):
    """Trial ``trial`` reports ``epoch`` (its ``stopped`` members stop there)."""
    members = {m: {"val_acc": 0.5, "epoch": epoch, "done": m in stopped, "stopped": m in stopped}
               for m in TRIALS[trial] if m not in driver.state.ledger.finished}
    driver.on_result(trial, members, None)
    merging.on_result(trial, {"epoch": epoch, "live_members": sum(not v["done"] for v in members.values())}, driver)


def state_after(trial, epochs, keep):
    fused = FusedTrial(spec(), plan_of(config_of(trial)), small_digits())
    for _ in range(epochs):
        fused.run_epoch()
        fused.keep([fused.member_ids.index(m) for m in keep])
    buffer = io.BytesIO()
    torch.save(fused.state_dict(), buffer)
    return fused, buffer.getvalue()


@pytest.fixture
def planned(ray_cluster):
    driver, merging = run_of_two_trials()
    report(driver, merging, "a", 1, stopped={"m0"})
    assert merging.merges == []  # b has not reported the epoch yet: it might still need all its members
    report(driver, merging, "b", 1, stopped={"m2"})
    (record,) = merging.merges
    assert record.trials == ("a", "b") and record.epoch == 2  # a checks at 2 next, b at 1 (its report is now)
    return ray_cluster, driver, merging, record


def test_a_source_that_fails_before_handing_over_leaves_the_merge_and_its_members_are_not_lost(planned):
    ray, driver, merging, record = planned
    box = merging.box()
    assert not ray.get(box.due.remote("b", 1)) and ray.get(box.due.remote("a", 2))
    alone, state = state_after("a", 2, ["m1"])
    ray.get(box.hand_over.remote("a", state))
    merging.on_complete("a", config_of("a"), driver)
    driver.on_trial_complete("a", False, None)
    assert driver.state.ledger.trials[record.placeholder] == ["m1"] and "m1" not in driver.state.ledger.finished
    assert merging.next_config("c", driver) is None  # b neither handed over nor left yet
    merging.on_complete("b", config_of("b"), driver)  # b's own code failed before epoch 2
    driver.on_trial_complete("b", True, None)
    assert "m3" in driver.state.ledger.failed  # its trial's failure, as without the merge
    config = merging.next_config("c", driver)
    assert plan_of(config).member_ids == ["m1"] and config[MERGED_KEY] == (merging.box_name, record.id)
    assert "hydro_gpu" not in config  # placed again as the trial it now is
    assert record.trial == "c" and record.left == ["b"] and driver.state.ledger.trials["c"] == ["m1"]
    assert driver.state.trial_groups["c"] == "g" and not merging.pending()
    merged = merged_state(config)
    assert merged["member_ids"] == ["m1"] and merged["epoch"] == 2
    for key, value in merged["members"][0]["modules"][0].items():
        assert torch.equal(value, alone.state_dict()["members"][0]["modules"][0][key]), key


def test_a_trial_past_the_merge_epoch_leaves_it_and_a_merge_nobody_handed_over_to_is_dropped(planned):
    ray, driver, merging, record = planned
    box = merging.box()
    assert not ray.get(box.due.remote("a", 3))  # a's report of epoch 2 came too late: it trained on
    assert not ray.get(box.due.remote("b", 3))
    assert ray.get(box.status.remote(record.id)) == ([], ["a", "b"])
    assert merging.next_config("c", driver) is None and record.dropped and not merging.pending()
    assert driver.state.ledger.trials == TRIALS  # their members never left their trials


def test_merging_pickles_without_its_box(planned):
    import pickle

    _, _, merging, _ = planned
    merging.box()
    copied = pickle.loads(pickle.dumps(merging))
    assert copied._box is None and copied.merges == merging.merges


def test_members_handed_over_to_a_merge_that_had_not_started_train_again_after_a_restore(planned):
    import pickle

    ray, driver, merging, record = planned
    box = merging.box()
    assert ray.get(box.due.remote("a", 2))
    ray.get(box.hand_over.remote("a", state_after("a", 2, ["m1"])[1]))
    merging.on_complete("a", config_of("a"), driver)
    restored = pickle.loads(pickle.dumps(merging))  # the searcher's checkpoint; the box is gone with the session
    ((entry, config),) = restored.restart_pending()
    assert entry == record.placeholder and plan_of(config).member_ids == ["m1"] and MERGED_KEY not in config
    assert not restored.pending() and restored.restart_pending() == []


def test_a_trial_hands_over_its_exact_state_when_due_and_one_whose_state_does_not_merge_leaves(planned, monkeypatch):
    import hydro.tune.placement.trial_merging as trial_merging

    ray, driver, merging, record = planned
    configs = {t: merging.trial_config(config_of(t)) for t in TRIALS}
    trials = {"a": state_after("a", 1, ["m1"])[0], "b": state_after("b", 1, ["m3"])[0]}
    for trial_id, fused in trials.items():
        monkeypatch.setattr(trial_merging.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: trial_id))
        assert not trial_merging.hand_over_if_due(configs[trial_id], fused)  # epoch 1: not due yet
        fused.run_epoch()
    monkeypatch.setattr(trial_merging.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "a"))
    assert trial_merging.hand_over_if_due(configs["a"], trials["a"])
    monkeypatch.setattr(trial_merging.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: "b"))
    assert not trial_merging.hand_over_if_due(configs["b"], trials["b"], refused="its energy does not merge")
    assert ray.get(merging.box().status.remote(record.id)) == (["a"], ["b"])
    for trial_id in TRIALS:
        merging.on_complete(trial_id, configs[trial_id], driver)
    merged = merged_state(merging.next_config("c", driver))
    assert merged["member_ids"] == ["m1"] and merged["epoch"] == 2
    expected = trials["a"].state_dict()["members"][0]
    for key, value in merged["members"][0]["modules"][0].items():
        assert torch.equal(value, expected["modules"][0][key]), key
    for index, state in merged["members"][0]["optimizers"][0]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(expected["optimizers"][0]["state"][index][key]))


def test_a_trial_whose_state_does_not_merge_with_those_handed_over_leaves_the_merge(planned, monkeypatch):
    """The box takes a state only if it merges with those handed over before (here: the trials' optimizers group
    parameters differently); a trial it refuses trains on alone, and the merged trial starts from the others."""
    import hydro.tune.placement.trial_merging as trial_merging

    ray, driver, merging, record = planned
    configs = {t: merging.trial_config(config_of(t)) for t in TRIALS}
    workload = spec(optimizer=grouped_sgd)
    trials = {}
    for trial_id, groups in (("a", True), ("b", False)):
        plan = TrialPlan(TrialKind.SURROGATE, [(m, {**CONFIGS[m], "groups": groups}) for m in TRIALS[trial_id]])
        trials[trial_id] = fused = FusedTrial(workload, plan, small_digits())
        fused.run_epoch()
        fused.keep([fused.member_ids.index(m) for m in TRIALS[trial_id][1:]])  # m0 and m2 stopped at epoch 1
        fused.run_epoch()
    for trial_id, handed in (("a", True), ("b", False)):
        monkeypatch.setattr(trial_merging.tune, "get_context", lambda: SimpleNamespace(get_trial_id=lambda: trial_id))
        assert trial_merging.hand_over_if_due(configs[trial_id], trials[trial_id]) is handed
    assert ray.get(merging.box().status.remote(record.id)) == (["a"], ["b"])
    for trial_id in TRIALS:
        merging.on_complete(trial_id, configs[trial_id], driver)
    assert record.left == ["b"] and driver.state.ledger.trials["b"] == TRIALS["b"]  # b's members stay in b
    merged = merged_state(merging.next_config("c", driver))
    assert merged["member_ids"] == ["m1"] and merged["epoch"] == 2
