"""Placement of fused trials into bubble slots and dedicated slots."""
import pytest

from schedulers.bubbles import BubblePlacement, Slot, TrialNeeds, TrialTooLarge

MiB = 2**20


@pytest.fixture
def placement():
    p = BubblePlacement(promote_rung=2)
    p.register_pipeline("llm", stage_bubble_fractions=[0.15, 0.35], stage_free_bytes=[512 * MiB, 64 * MiB])
    p.add_slot(Slot("gpu-7", dedicated=True, free_bytes=8192 * MiB))
    return p


def test_early_trials_fill_the_most_idle_fitting_bubble_first(placement):
    assert placement.place(TrialNeeds("a", 32 * MiB)).name == "llm/1"  # 35% idle
    assert placement.place(TrialNeeds("b", 32 * MiB)).name == "llm/0"
    assert placement.place(TrialNeeds("c", 32 * MiB)).name == "gpu-7"  # bubbles full: dedicated
    assert placement.place(TrialNeeds("d", 32 * MiB)) is None  # everything busy: wait
    placement.release("a")
    assert placement.place(TrialNeeds("d", 128 * MiB)) is None  # llm/1 frees, but only 64 MiB there


def test_late_stage_trials_go_to_dedicated_slots_and_get_promoted(placement):
    assert placement.place(TrialNeeds("best", 32 * MiB, rung=2)).name == "gpu-7"
    placement.release("best")
    early = TrialNeeds("x", 32 * MiB)
    assert placement.place(early).name == "llm/1"
    assert placement.promote(TrialNeeds("x", 32 * MiB, rung=1)) is None  # not late yet
    assert placement.promote(TrialNeeds("x", 32 * MiB, rung=2)).name == "gpu-7"
    assert placement.slots["llm/1"].trial is None


def test_job_end_hands_back_its_trials_and_too_large_trials_are_refused(placement):
    placement.place(TrialNeeds("a", 32 * MiB))
    placement.place(TrialNeeds("b", 32 * MiB))
    assert sorted(placement.remove_job("llm")) == ["a", "b"]
    assert set(placement.slots) == {"gpu-7"}
    with pytest.raises(TrialTooLarge, match=r"needs 10240.0 MiB; the largest slot can spare 8192.0 MiB"):
        placement.place(TrialNeeds("huge", 10240 * MiB))
