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
    assert placement.slots["llm/1"].trial == "x"  # still leaving it
    assert placement.promote(TrialNeeds("x", 32 * MiB, rung=3)) is None  # already has its dedicated slot
    placement.vacate("llm/1")
    assert placement.slots["llm/1"].trial is None


def test_job_end_hands_back_its_trials_and_too_large_trials_are_refused(placement):
    placement.place(TrialNeeds("a", 32 * MiB))
    placement.place(TrialNeeds("b", 32 * MiB))
    assert sorted(placement.remove_job("llm")) == ["a", "b"]
    assert set(placement.slots) == {"gpu-7"}
    with pytest.raises(TrialTooLarge, match=r"needs 10240.0 MiB; the largest slot can spare 8192.0 MiB"):
        placement.place(TrialNeeds("huge", 10240 * MiB))


def test_the_placement_service_hands_back_checkpoints_of_ended_jobs_and_drops_lost_hosts():
    from hydro.tune.bubbles.service import PlacementService

    service = PlacementService(promote_rung=2)
    service.register_pipeline("llm", [0.2, 0.3], [64 * MiB, 64 * MiB], ["host/0", "host/1"])
    service.add_dedicated("gpu-7", 512 * MiB, "host/gpu-7")
    assert service.place("a", MiB) == {"slot": "llm/1", "host": "host/1", "mode": "gated"}
    assert service.place("b", MiB)["slot"] == "llm/0"
    # b is promoted while still running in its bubble: its old slot stays taken until it has left.
    assert service.promote("b", rung=2) == ["gpu-7"] and service.assignment("b")["mode"] == "dedicated"
    assert service.place("c", MiB) is None
    service.left("llm/0")
    assert service.place("c", MiB)["slot"] == "llm/0"
    service.job_ending("llm")  # no new placements on the ending job; its trials wait for the hand-back
    assert service.assignment("a") is None and service.place("d", MiB) is None
    service.job_ended("llm", {"llm/1": {"completed_steps": 7}, "llm/0": None})
    assert service.assignment("a") == {"evicted": {"completed_steps": 7}}
    assert service.assignment("c") == {"evicted": None}  # nothing handed back: it uses its last report
    service.release("b")
    assert service.place("a", MiB)["slot"] == "gpu-7"  # placed again: moved to the free dedicated slot
    service.slot_lost("gpu-7")  # its host died
    assert service.assignment("a") == {"evicted": None} and service.slots() == []
