"""Convergence model (Optimus): a member's loss curve ``l(k) = 1/(β0·k + β1) + β2`` fitted online by
non-negative least squares, predicting its value at a later epoch and the epochs to reach a target, with an
uncertainty.

For a fixed floor ``β2`` below every observed value the model is linear: ``1/(l - β2) = β0·k + β1`` with
``β0, β1 >= 0``, solved exactly as a 2-variable NNLS (weights ``(l - β2)²`` so that residuals are those of ``l``
to first order). ``β2`` is searched on a grid below the lowest value (refined once around the best), keeping the
fit of least squared error in ``l``.

The uncertainty of a prediction has two parts, added in quadrature. *Noise*: a residual bootstrap (the curve
refitted on the fitted values plus resampled residuals; standard deviation over the refits). *Model error*,
which dominates beyond the observed epochs (with 3 points the fit is exact and the bootstrap says nothing): the
improvement the curve extrapolates from the last observed epoch is taken to be off by a relative standard
deviation ``model_error``, measured on the curve's own history by backtests (fits on its earlier prefixes
predicting its latest value) and shrunk toward a prior (:data:`PRIOR_MODEL_ERROR`, worth
:data:`PRIOR_WEIGHT` backtests) so that it is defined from 3 points on.

Curves are *loss-like* (lower is better); a metric to maximise is fitted as its negative.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_GRID = 48  # floor candidates per search
_REACH = 20.0  # the floor is searched down to min(l) - _REACH x (range of l)
_REFINEMENTS = 3  # finer grids around the best floor
_BACKTESTS = 5  # prefixes (the latest ones) whose fit predicts the latest value
_MAX_RATIO = 3.0  # a backtest's relative error counts at most about this much (a flat prefix predicts ~0)
# Relative error of an extrapolated improvement before any backtest, worth PRIOR_WEIGHT backtests: calibrated on
# the bundled examples' curves (benchmarks/convergence_prediction.py, seed 0: ±2σ holds 96% of final values with
# 0.7, 93% with 0.5, 65% with the bootstrap alone; 192 predictions of training/validation loss and the metric)
# and checked on seed 1's curves: 92% (bootstrap alone: 49%).
PRIOR_MODEL_ERROR = 0.7
PRIOR_WEIGHT = 2.0


@dataclass(frozen=True)
class Prediction:
    """A predicted quantity: ``value`` (the fit's), ``std`` (bootstrap refits combined with the model error on the
    extrapolated improvement; 0 without)."""

    value: float
    std: float

    def bound(self, z: float) -> tuple[float, float]:
        """``value ∓ z·std``: (low, high)."""
        return self.value - z * self.std, self.value + z * self.std


@dataclass(frozen=True)
class ConvergenceFit:
    """``l(k) = 1/(beta0·k + beta1) + beta2`` fitted on ``points`` epochs up to ``last_epoch`` (``rmse`` in units
    of ``l``), the bootstrap refits' coefficients ``samples`` (each ``(beta0, beta1, beta2)``) and
    ``model_error``: the relative standard deviation of an extrapolated improvement (module docstring)."""

    beta0: float
    beta1: float
    beta2: float
    rmse: float
    points: int
    samples: tuple[tuple[float, float, float], ...] = ()
    last_epoch: float = 0.0
    model_error: float = 0.0

    def value(self, epoch: float) -> Prediction:
        """Predicted ``l`` at ``epoch``."""
        fitted = _curve(self.beta0, self.beta1, self.beta2, epoch)
        improvement = self._at_last() - fitted if epoch > self.last_epoch else 0.0
        noise = _std([_curve(*s, epoch) for s in self.samples])
        return Prediction(fitted, math.hypot(noise, self.model_error * improvement))

    def epochs_to(self, target: float) -> Prediction:
        """Epochs until ``l <= target`` (``inf`` when the curve's floor ``beta2`` is not below ``target``). The
        model-error part is half the spread between the epochs at which the extrapolated improvement, scaled by
        ``1 ± model_error``, reaches ``target``."""
        fitted = _epochs_to(self.beta0, self.beta1, self.beta2, target)
        refits = [_epochs_to(*s, target) for s in self.samples]
        noise = _std(refits) if all(math.isfinite(r) for r in refits) else math.inf
        needed = self._at_last() - target
        if needed <= 0 or not self.model_error:
            return Prediction(fitted, noise)
        fast = _epochs_to(self.beta0, self.beta1, self.beta2, self._at_last() - needed / (1 + self.model_error))
        slow = (_epochs_to(self.beta0, self.beta1, self.beta2, self._at_last() - needed / (1 - self.model_error))
                if self.model_error < 1 else math.inf)
        return Prediction(fitted, math.hypot(noise, (slow - fast) / 2) if math.isfinite(slow) else math.inf)

    def remaining_seconds(self, epoch: int, target: float, seconds_per_epoch: float) -> Prediction:
        """Seconds from ``epoch`` until ``l <= target`` at ``seconds_per_epoch`` (e.g. steps per epoch times the
        step-time model's prediction)."""
        reach = self.epochs_to(target)
        return Prediction(max(0.0, reach.value - epoch) * seconds_per_epoch, reach.std * seconds_per_epoch)

    def _at_last(self) -> float:
        return _curve(self.beta0, self.beta1, self.beta2, self.last_epoch)


def fit_curve(epochs: Sequence[float], values: Sequence[float], *, bootstrap: int = 20, seed: int = 0,
              floor: float | None = None) -> ConvergenceFit:
    """Fit the Optimus curve to ``values`` (loss-like, finite) at ``epochs`` (>= 3 points, increasing).

    ``floor``: lowest allowed ``beta2`` (Optimus: 0 for a loss; ``None``: unbounded, for e.g. a negated
    accuracy). ``bootstrap``: residual-bootstrap refits for the noise part of the uncertainty (0: none); the
    model-error part comes from backtests on the latest ``_BACKTESTS`` prefixes of >= 3 points: the fit on epochs
    ``k[:j]`` predicts the improvement from ``k[j-1]`` to the last epoch; its error relative to the predicted
    improvement (bounded at about ``_MAX_RATIO``, so a flat prefix cannot make it infinite) is one sample;
    ``model_error`` is the root mean square of the samples and :data:`PRIOR_WEIGHT` copies of
    :data:`PRIOR_MODEL_ERROR`."""
    k = np.asarray(epochs, dtype=float)
    l = np.asarray(values, dtype=float)
    if k.shape != l.shape or len(k) < 3:
        raise ValueError(f"fit_curve: needs >= 3 (epoch, value) pairs of equal length, got {len(k)} epochs and "
                         f"{len(l)} values")
    if not np.all(np.isfinite(l)) or not np.all(np.diff(k) > 0):
        raise ValueError("fit_curve: values must be finite and epochs strictly increasing")
    beta = _fit(k, l, floor)
    fitted = _curve(*beta, k)
    residuals = l - fitted
    rmse = float(np.sqrt(np.mean(residuals ** 2)))
    rng = np.random.default_rng(seed)
    samples = tuple(_fit(k, fitted + rng.choice(residuals, len(k)), floor) for _ in range(bootstrap)) if rmse else ()
    return ConvergenceFit(*beta, rmse, len(k), samples, float(k[-1]), _model_error(k, l, floor))


def _model_error(k: np.ndarray, l: np.ndarray, floor: float | None) -> float:
    """Relative standard deviation of an extrapolated improvement: backtests shrunk toward the prior."""
    squares = []
    for j in range(max(3, len(k) - _BACKTESTS), len(k)):
        beta = _fit(k[:j], l[:j], floor)
        start = _curve(*beta, k[j - 1])
        predicted, observed = _curve(*beta, k[-1]) - start, l[-1] - start
        scale = max(abs(predicted), abs(observed) / _MAX_RATIO)
        squares.append(((observed - predicted) / scale) ** 2 if scale else 0.0)
    return math.sqrt((PRIOR_WEIGHT * PRIOR_MODEL_ERROR ** 2 + sum(squares)) / (PRIOR_WEIGHT + len(squares)))


def _fit(k: np.ndarray, l: np.ndarray, floor: float | None) -> tuple[float, float, float]:
    low, spread = float(l.min()), float(np.ptp(l)) or abs(float(l.min())) or 1.0
    offsets = np.geomspace(1e-4 * spread, _REACH * spread, _GRID)
    floors = low - offsets
    if floor is not None:
        floors = np.unique(np.clip(floors, floor, None))
        floors = floors[floors < low] if np.any(floors < low) else np.array([low - 1e-9 * spread])
    best = _best_on_grid(k, l, floors)
    for _ in range(_REFINEMENTS):
        i = int(np.argmin(np.abs(floors - best[2])))
        lo, hi = floors[max(i - 1, 0)], floors[min(i + 1, len(floors) - 1)]
        floors = np.linspace(min(lo, hi), max(lo, hi), _GRID)
        best = min(best, _best_on_grid(k, l, floors), key=lambda b: float(np.sum((_curve(*b, k) - l) ** 2)))
    return best


def _best_on_grid(k: np.ndarray, l: np.ndarray, floors: np.ndarray) -> tuple[float, float, float]:
    """For each floor, the exact 2-variable weighted NNLS of ``1/(l - floor) = b0·k + b1``; the floor whose
    curve has the least squared error in ``l``."""
    gap = l[None, :] - floors[:, None]  # [G, n] > 0
    z, w = 1.0 / gap, gap ** 2
    sw, swk, swkk = w.sum(1), (w * k).sum(1), (w * k * k).sum(1)
    swz, swkz = (w * z).sum(1), (w * k * z).sum(1)
    det = sw * swkk - swk ** 2
    b0 = (sw * swkz - swk * swz) / det
    b1 = (swkk * swz - swk * swkz) / det
    only_b1 = b0 < 0  # active set: b0 = 0 -> b1 is the weighted mean
    only_b0 = b1 < 0  # b1 = 0 -> b0 through the origin
    b0, b1 = np.where(only_b1, 0.0, b0), np.where(only_b1, swz / sw, b1)
    b0, b1 = np.where(only_b0 & ~only_b1, swkz / swkk, b0), np.where(only_b0 & ~only_b1, 0.0, b1)
    denominator = b0[:, None] * k[None, :] + b1[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sse = np.sum((1.0 / denominator + floors[:, None] - l[None, :]) ** 2, axis=1)
    sse = np.where(np.isfinite(sse), sse, np.inf)
    g = int(np.argmin(sse))
    return float(b0[g]), float(b1[g]), float(floors[g])


def _curve(beta0: float, beta1: float, beta2: float, epoch):
    return 1.0 / (beta0 * epoch + beta1) + beta2


def _epochs_to(beta0: float, beta1: float, beta2: float, target: float) -> float:
    if target <= beta2 or beta0 <= 0:
        return 0.0 if _curve(beta0, beta1, beta2, 0.0) <= target else math.inf
    return max(0.0, (1.0 / (target - beta2) - beta1) / beta0)


def _std(values: Sequence[float]) -> float:
    return float(np.std(values)) if len(values) > 1 else 0.0
