"""Per-member stopping rules in plain Python (schedulers.member_stopping): ASHA rungs, median rule, idempotent
decisions, and diverged members counted as the worst."""
import math

import pytest

from schedulers.member_stopping import ASHA, MedianStopping, MemberStopping, percentile


def test_asha_rung_rule_per_member_and_idempotent_decisions():
    stopping = MemberStopping(ASHA(max_t=8, grace_period=1, reduction_factor=2), "max")
    # Rung at epoch 1: a member stops when below the median of those recorded before it.
    assert stopping.decide("a", 1, 0.4) is False      # first at the rung: no cutoff yet
    assert stopping.decide("b", 1, 0.1) is True       # 0.1 < 0.4
    assert stopping.decide("c", 1, 0.3) is False      # median(0.4, 0.1) = 0.25
    assert stopping.decide("d", 1, 0.2) is True       # median(0.4, 0.1, 0.3) = 0.3
    # A retried trial asks again: same answers, and the rung is not fed twice.
    assert stopping.decide("b", 1, 0.9) is True
    assert stopping.decide("c", 1, 0.0) is False
    assert stopping.decide("b", 2, 0.9) is True        # stopped stays stopped
    assert stopping.stopped() == {"b": 1, "d": 1}
    # Rung at epoch 2 only holds members that got there.
    assert stopping.decide("a", 2, 0.5) is False
    assert stopping.decide("c", 2, 0.45) is True
    assert stopping.decide("a", 8, 0.9, final=True) is False


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_diverged_member_is_the_worst_and_stops_at_its_rung(mode, bad):
    stopping = MemberStopping(ASHA(max_t=8, grace_period=1, reduction_factor=2), mode)
    healthy = [0.5, 0.7] if mode == "max" else [1.5, 1.2]
    assert not stopping.decide("a", 1, healthy[0]) and not stopping.decide("b", 1, healthy[1])
    assert stopping.decide("nan", 1, bad) is True   # NaN < cutoff is false in Ray's ASHA: it never stopped
    median = MemberStopping(MedianStopping(grace_period=1, min_samples_required=1), mode)
    median.decide("a", 1, healthy[0])
    assert median.decide("nan", 1, bad) is True


def test_median_rule():
    stopping = MemberStopping(MedianStopping(grace_period=1, min_samples_required=1), "min")
    assert stopping.decide("a", 1, 1.0) is False
    assert stopping.decide("b", 1, 3.0) is True   # worse than the median of the others
    assert stopping.decide("c", 1, 0.5) is False
    never = MemberStopping(None, "max")
    assert not any(never.decide(m, 1, v) for m, v in [("a", 0.9), ("b", 0.0), ("c", 0.0)])


def test_percentile_matches_numpy_and_treats_minus_inf_as_lowest():
    np = pytest.importorskip("numpy")
    values = [0.3, -1.0, 2.5, 0.7, 0.7]
    for q in (0, 25, 50, 66.6, 75, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([-math.inf, 1.0], 50) == -math.inf and percentile([-math.inf, 1.0], 100) == 1.0


def test_bad_rule_settings_are_refused():
    with pytest.raises(ValueError, match="grace_period"):
        ASHA(max_t=2, grace_period=3)
    with pytest.raises(ValueError, match="reduction_factor"):
        ASHA(reduction_factor=1)
    with pytest.raises(ValueError, match="mode"):
        MemberStopping(None, "maximize")
