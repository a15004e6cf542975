"""Trial slots: how many trials train at once on separate compute, and members split evenly over trials."""
import pytest

from schedulers.trial_slots import rung_trials, split_evenly, trial_slots, whole_round_counts

TWO_CPUS = [{"CPU": 2.0, "memory": 8e9}]
GPU_NODES = [{"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0, "GPU": 4.0}]


@pytest.mark.parametrize("nodes, request_, max_concurrent, slots", [
    (TWO_CPUS, {"CPU": 1, "GPU": 0}, None, 2),          # the 2-core machine, Tune's default trial
    (TWO_CPUS, {"CPU": 1, "GPU": 0}, 1, 1),             # max_concurrent_trials=1
    (TWO_CPUS, {"CPU": 1, "GPU": 0}, 8, 2),             # a limit above the cluster's room changes nothing
    (TWO_CPUS, {"CPU": 0.5}, None, 4),                  # fractions of a CPU: as many trials as fit
    (TWO_CPUS, {"CPU": 3}, None, 1),                    # no node fits one: still 1 (the trial waits for one)
    (GPU_NODES, {"CPU": 1, "GPU": 1}, None, 6),         # one per card, per node
    (GPU_NODES, {"CPU": 1, "GPU": 2}, None, 3),         # 1 + 2 pairs of cards
    (GPU_NODES, {"CPU": 8, "GPU": 1}, None, 4),         # CPUs bound it: 2 per node
    (GPU_NODES, {"CPU": 1, "GPU": 0.5}, None, 6),       # fractions pack per card: one slot per card, per node
    ([{"CPU": 64.0, "GPU": 8.0}], {"CPU": 1, "GPU": 0.25}, None, 8),  # an 8-GPU node runs 8 cards' worth
    ([{"CPU": 4.0, "GPU": 8.0}], {"CPU": 1, "GPU": 0.5}, None, 4),    # ... as far as its CPUs fit a trial per card
    (GPU_NODES, {"CPU": 1, "GPU": 1}, 4, 4),
    (TWO_CPUS, {"CPU": 1, "GPU": 1}, None, 1),          # GPU trials on a CPU-only cluster: none fits
])
def test_trial_slots_count_trials_on_separate_compute(nodes, request_, max_concurrent, slots):
    assert trial_slots(nodes, request_, max_concurrent) == slots


@pytest.mark.parametrize("count, parts, lengths", [
    (25, 2, [13, 12]), (8, 2, [4, 4]), (7, 3, [3, 2, 2]), (3, 5, [1, 1, 1]), (4, 1, [4]), (0, 2, [])])
def test_split_evenly_keeps_order_and_balances_lengths(count, parts, lengths):
    items = [f"m{i}" for i in range(count)]
    split = split_evenly(items, parts)
    assert [len(p) for p in split] == lengths
    assert [m for p in split for m in p] == items


@pytest.mark.parametrize("work_s, slots, trials", [
    (40.0, 2, 2),    # 20 s saved for a 5 s start
    (8.0, 2, 1),     # 4 s saved: not worth another trial
    (8.0, 4, 4),     # 6 s saved over 4 slots
    (None, 2, 1),    # nothing measured yet
    (1e6, 1, 1),
])
def test_a_rung_is_spread_only_when_that_saves_more_than_a_trial_start(work_s, slots, trials):
    assert rung_trials(work_s, slots, overhead_s=5.0) == trials


def _rounds(members: int, per_trial: int, slots: int) -> int:
    return -(-(-(-members // per_trial)) // slots)


@pytest.mark.parametrize("slots", [2, 3, 8])
@pytest.mark.parametrize("members", [1, 3, 7, 24, 25, 64, 100])
def test_whole_round_counts_are_the_fewest_members_per_trial_for_their_rounds(members, slots):
    counts = whole_round_counts(members, slots)
    share = -(-members // slots)
    assert counts[0] == 1 and counts[-1] == share and counts == sorted(set(counts))
    for count in counts:  # one member fewer per trial needs another round
        assert count == 1 or _rounds(members, count - 1, slots) > _rounds(members, count, slots)
    assert [_rounds(members, c, slots) for c in counts] == sorted({_rounds(members, c, slots) for c in counts},
                                                                   reverse=True)


def test_whole_round_counts_skip_counts_that_idle_a_slot():
    assert whole_round_counts(24, 2) == [1, 2, 3, 6, 12]  # 8 per trial: 3 trials, one alone in a second round
    assert whole_round_counts(24, 1) is None
