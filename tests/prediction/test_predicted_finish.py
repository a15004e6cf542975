"""Per-trial GPU-type choice by predicted finish (pure decision), and the cluster's GPU types as Ray lists them."""
import pickle

import pytest

from schedulers.placement.cluster import GpuType
from schedulers.placement.predicted_finish import PredictedFinish

TYPES = {"fast": GpuType("fast", 4.0, 0.0), "slow": GpuType("slow", 1.0, 0.0)}


def book(fast=1, slow=1):
    return PredictedFinish(TYPES, {"fast": fast, "slow": slow})


def test_a_trial_goes_where_it_finishes_first_counting_the_trials_given_before():
    placer = book()
    first = placer.choose("t1", work_per_member=1.0, members=4, steps=10)  # 10 s on fast, 40 s on slow
    assert first.gpu == "fast" and first.finish_s == {"fast": 10.0, "slow": 40.0}
    second = placer.choose("t2", 1.0, 4, 10)  # fast: after t1 (10 s) + 10 s = 20 s < 40 s on the free slow GPU
    assert second.gpu == "fast" and second.finish_s == {"fast": 20.0, "slow": 40.0}
    third = placer.choose("t3", 1.0, 4, 10)  # fast: 30 s < 40
    assert third.gpu == "fast"
    fourth = placer.choose("t4", 1.0, 4, 10)  # 40 s on both: the shorter run
    assert fourth.gpu == "fast" and fourth.finish_s == {"fast": 40.0, "slow": 40.0}
    fifth = placer.choose("t5", 1.0, 4, 10)  # fast: 40 s + 10 = 50 s > 40 s on slow
    assert fifth.gpu == "slow" and fifth.finish_s["fast"] == 50.0


def test_overhead_dominated_trials_gain_little_from_the_fast_type():
    placer = book()
    placer.choose("target", 1.0, 1, 100, overhead_s=0.0)  # 25 s on fast
    small = placer.choose("small", 0.01, 1, 100, overhead_s=0.1)  # 10.25 s on fast after 25 s; 11 s on slow
    assert small.gpu == "slow"


def test_progress_moves_the_release_and_measured_step_times_correct_the_type():
    placer = book()
    placer.choose("t1", 1.0, 4, 10)
    placer.progress("t1", done=5, members=2)  # 5 steps left at 2 members: 2.5 s on fast
    assert placer.choose("t2", 1.0, 4, 10).finish_s["fast"] == pytest.approx(12.5)
    # the fast type measured 4x slower than predicted (as fast as slow): its correction becomes 4
    placer.progress("t1", done=6, members=2, seconds_per_step=2.0)  # predicted 0.5 s/step at 2 members
    assert placer.correction("fast") == pytest.approx(4.0)
    assert placer.correction("slow") == pytest.approx(4.0)  # no measurement of its own: the median over all
    placer.end("t1"), placer.end("t2")
    placer.progress("gone", done=1, members=1, seconds_per_step=1.0)  # an ended trial: nothing changes
    assert placer.correction("fast") == pytest.approx(4.0)


def test_a_type_measured_as_fast_as_another_gets_trials_once_measured():
    placer = book()
    assert placer.choose("t1", 1.0, 1, 10).gpu == "fast"
    placer.progress("t1", done=1, members=1, seconds_per_step=1.0)  # fast measured at 1 s/step, predicted 0.25
    # slow, not measured yet, keeps its assumed speed relative to fast: 4 s/step
    assert [placer.choose(f"t{i}", 1.0, 1, 10).gpu for i in (2, 3, 4, 5)] == ["fast", "fast", "fast", "slow"]
    placer.progress("t5", done=1, members=1, seconds_per_step=1.0)  # slow measured: as fast as fast
    assert placer.correction("slow") == pytest.approx(1.0)
    sixth = placer.choose("t6", 1.0, 1, 10)  # fast: 9 + 30 s queued + 10; slow: 9 s left of t5 + 10
    assert sixth.gpu == "slow" and sixth.finish_s == pytest.approx({"fast": 49.0, "slow": 19.0})


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="count >= 1"):
        PredictedFinish(TYPES, {"fast": 1})
    with pytest.raises(ValueError, match="steps >= 1"):
        book().choose("t", 1.0, 1, 0)


def test_cluster_gpu_types_declared_before_detected():
    pytest.importorskip("ray")
    from hydro.tune.placement.gpu_types import DETECTED_PREFIX, RESOURCE_PREFIX, cluster_gpu_types, prior_type

    declared = [{"Alive": True, "Resources": {"CPU": 2, RESOURCE_PREFIX + "A100": 2}},
                {"Alive": True, "Resources": {"CPU": 2, RESOURCE_PREFIX + "V100": 1, RESOURCE_PREFIX + "A100": 1}},
                {"Alive": False, "Resources": {RESOURCE_PREFIX + "H100": 8}}]
    types = cluster_gpu_types(declared)
    assert {gpu: n for gpu, (n, _) in types.items()} == {"A100": 3, "V100": 1}
    assert dict(types["A100"][1].resources) == {RESOURCE_PREFIX + "A100": 1.0}
    detected = [{"Alive": True, "Resources": {"CPU": 8, "GPU": 4, DETECTED_PREFIX + "H100": 1}}]
    ((gpu, (count, request)),) = cluster_gpu_types(detected).items()
    assert (gpu, count, dict(request.resources)) == ("H100", 4, {"GPU": 1.0, DETECTED_PREFIX + "H100": 0.001})
    assert cluster_gpu_types([{"Alive": True, "Resources": {"CPU": 2}}]) == {}
    assert prior_type("a100").rate == 2.2 and prior_type("mystery").rate == 1.0


def test_a_measured_step_is_compared_with_the_members_that_trained_it():
    placer = book()
    placer.choose("t1", 1.0, 4, 10)  # 4 members: 1 s a step on fast
    placer.progress("t1", done=1, members=1, seconds_per_step=1.0)  # 4 trained that step; 3 stopped after it
    assert placer.correction("fast") == pytest.approx(1.0)
    assert placer.choose("t2", 1.0, 4, 10).finish_s["fast"] == pytest.approx(9 * 0.25 + 10)  # t1 goes on with 1


def test_two_mixes_of_overhead_and_work_measured_fit_both_parts_of_a_type():
    true = GpuType("fast", 4.0, 0.05)  # what the type really does: 50 ms per step plus work / 4
    placer = PredictedFinish({"fast": GpuType("fast", 1.0, 0.01), "slow": TYPES["slow"]}, {"fast": 2, "slow": 1})
    for key, work in (("surrogate", 0.01), ("target", 2.0)):  # overhead-bound, then compute-bound
        placer.choose(key, work, 1, 10)
        placer.move(key, "fast")
        placer.progress(key, done=1, members=1, seconds_per_step=true.step_seconds(work))
    assert placer.corrections("fast") == pytest.approx((5.0, 0.25))  # 50 ms / 10 ms, (1/4) / 1
    middle = placer.choose("middle", 0.5, 1, 10)
    assert middle.step_s["fast"] == pytest.approx(true.step_seconds(0.5))  # one factor could fit only one of them
    assert placer.corrections("slow") == pytest.approx((placer.correction("slow"),) * 2)  # nothing measured there


def test_a_placement_pickled_before_the_fit_was_kept_restores():
    placer = book()
    placer.choose("t1", 1.0, 4, 10)
    placer.progress("t1", done=1, members=4, seconds_per_step=2.0)
    old = pickle.loads(pickle.dumps(placer))
    for name in ("samples", "_fits"):  # as an older version pickled it
        del old.__dict__[name]
    restored = pickle.loads(pickle.dumps(old))
    assert restored.samples == {} and restored.corrections("fast") == pytest.approx((2.0, 2.0))
