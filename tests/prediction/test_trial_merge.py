"""When fused trials' survivors merge into one trial (pure rule), the predicted finishes it compares, and the
member ledger's hand-over."""
import pytest

from schedulers.member_ledger import MemberLedger
from schedulers.placement.cluster import GpuType
from schedulers.placement.predicted_finish import PredictedFinish
from schedulers.placement.trial_merge import (MergeCandidate, MergeRule, finish_alone_s, merged_finish_s,
                                              park_members)


def candidate(trial, members, epoch=1, key="g", reporting=False, finish_s=10.0):
    return MergeCandidate(trial, key, members, epoch, reporting, finish_s)


def flat(chosen, members, epoch):
    """A merged trial as fast as its trials (overhead-bound steps)."""
    return 10.0


def test_trials_of_one_group_whose_survivors_fit_one_trial_merge():
    merges = MergeRule().plan([candidate("a", 1, reporting=True), candidate("b", 2), candidate("c", 1, key="h")],
                              limit=lambda key: 4, epochs=5, merged_finish_s=flat)
    (merge,) = merges  # c is alone in its group
    assert merge.trials == ("a", "b") and merge.members == 3
    assert merge.epoch == 2  # b has checked at 1 already (its report was processed before), a checks at 1 now
    assert merge.finish_s == 10.0 and merge.alone_s == 10.0


def test_the_reporting_trial_checks_at_its_reported_epoch():
    (merge,) = MergeRule().plan([candidate("a", 1, epoch=3, reporting=True), candidate("b", 1, epoch=2)],
                                lambda key: 2, 5, flat)
    assert merge.epoch == 3
    (merge,) = MergeRule().plan([candidate("a", 1, epoch=3), candidate("b", 1, epoch=2)], lambda key: 2, 5, flat)
    assert merge.epoch == 4


def test_members_beyond_the_fusion_count_do_not_merge_and_the_fewest_go_first():
    candidates = [candidate("a", 3), candidate("b", 2), candidate("c", 2), candidate("d", 1)]
    merges = MergeRule().plan(candidates, lambda key: 4, 5, flat)
    assert [m.trials for m in merges] == [("d", "b")]  # d+b+c = 5 > 4: c stays; a+c = 5 > 4
    assert MergeRule().plan([candidate("a", 3), candidate("b", 2)], lambda key: 4, 5, flat) == []


def test_several_merges_in_one_group():
    candidates = [candidate(t, 1) for t in "abcd"]
    merges = MergeRule().plan(candidates, lambda key: 2, 5, flat)
    assert [m.trials for m in merges] == [("a", "b"), ("c", "d")]


def test_no_merge_at_or_after_the_last_epoch_or_without_survivors():
    assert MergeRule().plan([candidate("a", 1, epoch=4), candidate("b", 1, epoch=4)], lambda key: 2, 5, flat) == []
    assert MergeRule().plan([candidate("a", 0), candidate("b", 1)], lambda key: 2, 5, flat) == []


def test_a_merge_predicted_to_finish_later_waits_unless_within_the_slack_or_the_stage_ends_later():
    later = lambda chosen, members, epoch: 11.0  # noqa: E731
    pair = [candidate("a", 1), candidate("b", 1)]
    assert MergeRule().plan(pair, lambda key: 2, 5, later) == []  # 10% later: beyond the default 5%
    assert MergeRule().plan(pair, lambda key: 2, 5, lambda chosen, members, epoch: 10.4)  # 4% later: merges
    assert MergeRule(slack=0).plan(pair, lambda key: 2, 5, lambda chosen, members, epoch: 10.4) == []
    assert MergeRule(slack=0.1).plan(pair, lambda key: 2, 5, later)[0].trials == ("a", "b")
    (merge,) = MergeRule().plan(pair, lambda key: 2, 5, later, horizon_s=12.0)  # another trial ends at 12 s
    assert merge.alone_s == 12.0


def test_the_largest_paying_subset_merges():
    def finish(chosen, members, epoch):
        return 10.0 if members <= 2 else 20.0

    (merge,) = MergeRule().plan([candidate(t, 1) for t in "abc"], lambda key: 3, 5, finish)
    assert merge.trials == ("a", "b")


def test_slack_is_checked():
    with pytest.raises(ValueError, match="slack must be >= 0"):
        MergeRule(slack=-0.1)


def test_predicted_finishes_alone_and_merged():
    finish = PredictedFinish({"fast": GpuType("fast", 2.0, 0.0), "slow": GpuType("slow", 1.0, 0.0)},
                             {"fast": 1, "slow": 1})
    finish.choose("a", work_per_member=1.0, members=2, steps=40, overhead_s=1.0)  # fast: 2 s a step
    finish.choose("b", work_per_member=1.0, members=2, steps=40, overhead_s=1.0)  # slow: 3 s a step
    assert (finish.trials["a"].gpu, finish.trials["b"].gpu) == ("fast", "slow")
    finish.progress("a", done=10, members=1)  # 1.5 s a step now
    finish.progress("b", done=8, members=1)  # 2 s a step now
    assert finish_alone_s(finish, "a") == 30 * 1.5 and finish_alone_s(finish, "b") == 32 * 2.0
    assert finish_alone_s(finish, "b", members=2) == 32 * 3.0
    # 4 epochs of 10 steps; merged at epoch 2: b reaches it in 12 steps (24 s), then 20 steps of 2 members on the
    # fast type (2 s each)
    assert merged_finish_s(finish, ["a", "b"], members=2, epoch=2, epochs=4) == 24.0 + 40.0


def test_handed_over_members_wait_in_the_ledger_for_the_merged_trial():
    ledger = MemberLedger()
    ledger.add_trial("a", ["m0", "m1"])
    ledger.add_trial("b", ["m2", "m3"])
    ledger.observe({"m0": {"epoch": 1, "done": True}, "m1": {"epoch": 1}, "m2": {"epoch": 1, "done": True},
                    "m3": {"epoch": 1}})
    assert park_members(ledger.trials, ledger.finished, "a", "merge:0") == ["m1"]
    assert park_members(ledger.trials, ledger.finished, "b", "merge:0") == ["m3"]
    assert ledger.trials == {"a": ["m0"], "b": ["m2"], "merge:0": ["m1", "m3"]}
    assert ledger.trial_complete("a", error=False) == [] and ledger.running()  # parked members still run
