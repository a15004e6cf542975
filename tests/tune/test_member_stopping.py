"""Per-member decisions of a real Ray ASHAScheduler fed members as pseudo-trials."""
import pytest
from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, MedianStoppingRule

from schedulers.member_stopping import MemberStopping


def result(epoch, acc):
    return {"training_iteration": epoch, "epoch": epoch, "val_acc": acc}


def test_asha_rung_rule_per_member_and_idempotent_decisions():
    stopping = MemberStopping(ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2), "val_acc", "max")
    # Rung at epoch 1: a member stops when below the median of those recorded before it.
    assert stopping.decide("a", 1, result(1, 0.4)) is False      # first at the rung: no cutoff yet
    assert stopping.decide("b", 1, result(1, 0.1)) is True       # 0.1 < 0.4
    assert stopping.decide("c", 1, result(1, 0.3)) is False      # median(0.4, 0.1) = 0.25
    assert stopping.decide("d", 1, result(1, 0.2)) is True       # median(0.4, 0.1, 0.3) = 0.3
    # A retried trial asks again: same answers, and the rung is not fed twice.
    assert stopping.decide("b", 1, result(1, 0.9)) is True
    assert stopping.decide("c", 1, result(1, 0.0)) is False
    assert stopping.decide("b", 2, result(2, 0.9)) is True        # stopped stays stopped
    assert stopping.stopped() == {"b": 1, "d": 1}
    # Rung at epoch 2 only holds members that got there.
    assert stopping.decide("a", 2, result(2, 0.5)) is False
    assert stopping.decide("c", 2, result(2, 0.45)) is True
    assert stopping.decide("a", 8, result(8, 0.9), final=True) is False


def test_median_rule_and_no_scheduler():
    median = MedianStoppingRule(time_attr="training_iteration", grace_period=1, min_samples_required=1)
    stopping = MemberStopping(median, "val_acc", "min")
    assert stopping.decide("a", 1, result(1, 1.0)) is False
    assert stopping.decide("b", 1, result(1, 3.0)) is True   # worse than the median of the others
    never = MemberStopping(None, "val_acc", "max")
    assert not any(never.decide(m, 1, result(1, v)) for m, v in [("a", 0.9), ("b", 0.0), ("c", 0.0)])


def test_refuses_schedulers_that_do_not_act_per_member():
    with pytest.raises(TypeError, match="HyperBandScheduler"):
        MemberStopping(HyperBandScheduler(), "val_acc", "max")
    with pytest.raises(ValueError, match="leave the scheduler's metric"):
        MemberStopping(ASHAScheduler(metric="loss", mode="min"), "val_acc", "max")
