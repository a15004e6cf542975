"""Optimus convergence model and the ConvergenceStopping member rule."""
import math

import numpy as np
import pytest

from schedulers.member_stopping import ConvergenceStopping, MemberStopping
from schedulers.prediction.convergence import PRIOR_MODEL_ERROR, PRIOR_WEIGHT, fit_curve


def curve(b0, b1, b2, epochs):
    return [1 / (b0 * k + b1) + b2 for k in epochs]


def test_noiseless_curve_is_recovered_and_extrapolated():
    epochs = range(1, 7)
    fit = fit_curve(epochs, curve(0.3, 0.5, 0.2, epochs), floor=0.0)
    assert (fit.beta0, fit.beta1, fit.beta2) == pytest.approx((0.3, 0.5, 0.2), rel=1e-3)
    assert fit.value(40).value == pytest.approx(curve(0.3, 0.5, 0.2, [40])[0], rel=1e-4)
    target = curve(0.3, 0.5, 0.2, [25])[0]
    assert fit.epochs_to(target).value == pytest.approx(25, rel=1e-2)
    assert fit.remaining_seconds(10, target, 2.0).value == pytest.approx(30, rel=1e-2)
    assert fit.epochs_to(0.19).value == math.inf  # below the floor: never


def test_noisy_curve_prediction_has_an_uncertainty_that_covers_the_truth():
    rng = np.random.default_rng(0)
    epochs = np.arange(1, 11)
    truth = curve(0.2, 0.4, 0.5, [30])[0]
    covered = 0
    for trial in range(20):
        noisy = np.array(curve(0.2, 0.4, 0.5, epochs)) + rng.normal(0, 0.01, len(epochs))
        prediction = fit_curve(epochs, noisy, seed=trial).value(30)
        assert prediction.std > 0
        low, high = prediction.bound(3)
        covered += low <= truth <= high
    assert covered >= 16


def test_model_error_is_measured_by_backtests_and_covers_a_misspecified_curve():
    epochs = np.arange(1, 9)
    # three points: the fit is exact, the bootstrap says nothing; beyond them the prior model error applies
    exact = fit_curve(epochs[:3], curve(0.3, 0.5, 0.2, epochs[:3]), floor=0.0)
    assert exact.model_error == pytest.approx(PRIOR_MODEL_ERROR)
    assert exact.value(2).std < 1e-6  # within the observed epochs: noise only
    improvement = exact.value(3).value - exact.value(30).value
    assert exact.value(30).std == pytest.approx(PRIOR_MODEL_ERROR * improvement, rel=1e-3)
    # eight points of an Optimus curve: five exact backtests (error 0) shrink it
    optimus = fit_curve(epochs, curve(0.3, 0.5, 0.2, epochs), floor=0.0)
    assert optimus.model_error == pytest.approx(PRIOR_MODEL_ERROR * math.sqrt(PRIOR_WEIGHT / (PRIOR_WEIGHT + 5)),
                                                abs=1e-3)
    # an exponential curve is not Optimus's: the backtests see the misses, and ±2σ still covers epoch 30
    decay = [0.3 + 2 * math.exp(-0.25 * k) for k in range(1, 31)]
    fit = fit_curve(epochs, decay[:8], floor=0.0)
    assert fit.model_error > optimus.model_error
    low, high = fit.value(30).bound(2)
    assert low <= decay[-1] <= high and not fit.value(30).bound(0.1)[0] <= decay[-1] <= fit.value(30).bound(0.1)[1]
    # epochs to a target: the spread of the improvement scaled by 1 ± model_error
    reach = fit.epochs_to(0.5)
    assert math.isfinite(reach.std) and reach.std > 0 and fit.epochs_to(fit.value(40).value).value > reach.value


def test_negated_accuracy_fits_without_a_floor():
    epochs = range(1, 6)
    accuracy = [0.95 - 0.5 / (0.4 * k + 1) for k in epochs]
    fit = fit_curve(epochs, [-a for a in accuracy], floor=None)
    assert -fit.value(30).value == pytest.approx(0.95 - 0.5 / 13, abs=1e-3)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=">= 3"):
        fit_curve([1, 2], [1.0, 0.5])
    with pytest.raises(ValueError, match="finite"):
        fit_curve([1, 2, 3], [1.0, math.nan, 0.5])
    with pytest.raises(ValueError, match="grace_period"):
        ConvergenceStopping(max_t=10, grace_period=2)


def test_stops_a_member_whose_predicted_final_loss_cannot_beat_the_best():
    rule = MemberStopping(ConvergenceStopping(max_t=30, grace_period=3), mode="min")
    good, bad = curve(0.3, 0.5, 0.1, range(1, 31)), curve(0.3, 0.5, 0.8, range(1, 31))
    stopped = {}
    for epoch in range(1, 31):
        for member, losses in (("good", good), ("bad", bad)):
            if member not in stopped and rule.decide(member, epoch, losses[epoch - 1], final=epoch == 30):
                stopped[member] = epoch
    # bad's floor (0.8) is above good's loss from epoch 3 on (0.1 + 1/1.4), but at epoch 3 its extrapolated
    # improvement (0.61) is uncertain by the prior model error (0.7 of it): stopped once backtests on its exact
    # curve have shrunk that (epoch 6 of 30)
    assert stopped == {"bad": 6}
    predicted, std = rule.rule.predictions["bad"]
    assert -predicted == pytest.approx(bad[-1], rel=1e-3)


def test_diverged_member_stops_and_max_t_stops_everyone():
    rule = ConvergenceStopping(max_t=5)
    assert not rule.on_result("a", 1, -math.inf)  # nothing finite to beat yet
    assert not rule.on_result("b", 1, -1.0)
    assert rule.on_result("a", 2, -math.inf)
    assert rule.on_result("b", 5, -0.5)
