"""Batch-size bandit for recurring jobs: pruning rounds, then Gaussian Thompson sampling on cost.

Costs are Zeus costs in J (η·E + (1−η)·MaxPower·T of a whole run). A run either converged (reached
the target) or not (failed, or stopped early once its cost passed :attr:`BatchSizeBandit.stop_cost`).
The bandit's state is a pure function of the observations in order, so replaying stored
observations (:meth:`BatchSizeBandit.observe`) restores it across processes.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np


class BanditError(ValueError):
    """Invalid bandit configuration or observation."""


@dataclass(frozen=True)
class Observation:
    """One finished run: its batch size, cost (J) and whether it reached the target."""

    batch_size: int
    cost: float
    converged: bool


class BatchSizeBandit:
    """Chooses the batch size of each recurrence of a job.

    Phase 1 (pruning, ``pruning_rounds`` rounds): from ``default`` explore smaller batch sizes in
    descending order, then larger ones ascending; a direction stops at the first batch size that
    fails to converge. Batch sizes that converged in every round survive as arms.
    Phase 2: Gaussian Thompson sampling over the arms; :meth:`choose` returns the arm of lowest
    sampled cost. :attr:`stop_cost` = β·(minimum converged cost) is the early-stopping bound.

    The defaults are Hydro's policy; :meth:`zeus` builds the faithful Zeus baseline. Hydro differs in
    three measured ways: one pruning round instead of two (the second mostly re-pays for arms Thompson
    sampling would drop anyway); runs that did not converge are right-censored: their cost counts as
    at least the current bound instead of the (smaller) cost at which they were stopped, and runs that
    never started (huge cost) cannot blow up the statistics; and the noise variance of an arm is floored
    by the coefficient of variation pooled over all arms, so an arm seen once is not treated as certain.
    """

    def __init__(
        self,
        batch_sizes: Iterable[int],
        default: int,
        *,
        seed: int | None = None,
        beta: float = 2.0,
        pruning_rounds: int = 1,
        censor_failures: bool = True,
        pooled_noise: bool = True,
        prior_cv: float = 0.1,
    ) -> None:
        sizes = sorted({int(b) for b in batch_sizes})
        if default not in sizes:
            raise BanditError(f"default batch size {default} is not one of batch_sizes {sizes}.")
        if beta <= 1.0:
            raise BanditError(f"beta={beta} must be > 1 (the early-stop bound is beta x min cost).")
        if pruning_rounds < 1:
            raise BanditError(f"pruning_rounds={pruning_rounds} must be >= 1.")
        self.batch_sizes = sizes
        self.default = int(default)
        self.beta = float(beta)
        self.pruning_rounds = pruning_rounds
        self.censor_failures = censor_failures
        self.pooled_noise = pooled_noise
        self.prior_cv = prior_cv
        self._rng = np.random.default_rng(seed)
        self._history: list[Observation] = []
        self._pending: Counter[int] = Counter()
        self._round = 0
        self._survivors = list(sizes)
        self._round_results: dict[int, bool] = {}

    @classmethod
    def zeus(cls, batch_sizes: Iterable[int], default: int, *, seed: int | None = None, beta: float = 2.0) -> BatchSizeBandit:
        """Zeus's policy: two pruning rounds, raw costs of failed runs, flat prior, sample variance."""
        return cls(batch_sizes, default, seed=seed, beta=beta, pruning_rounds=2, censor_failures=False, pooled_noise=False)

    # ----------------------------------------------------------------- state
    @property
    def history(self) -> list[Observation]:
        """All observations in order."""
        return list(self._history)

    @property
    def pruning(self) -> bool:
        """True while the pruning rounds are not finished."""
        return self._round < self.pruning_rounds

    @property
    def arms(self) -> list[int]:
        """Batch sizes still in play (survivors of the finished pruning rounds)."""
        return list(self._survivors)

    @property
    def stop_cost(self) -> float | None:
        """Early-stopping bound β·(min cost of a converged run) in J, or None before any converged run."""
        costs = [o.cost for o in self._history if o.converged]
        return self.beta * min(costs) if costs else None

    # ----------------------------------------------------------------- pruning
    def _next_pruning_candidate(self) -> int | None:
        """Next batch size of the current pruning round, or None if the round is finished."""
        results = self._round_results
        start = self.default if self.default in self._survivors else min(
            self._survivors, key=lambda b: abs(b - self.default)
        )
        if start not in results:
            return start
        smaller = [b for b in reversed(self._survivors) if b < start]
        larger = [b for b in self._survivors if b > start]
        for direction in (smaller, larger):
            for b in direction:
                if b not in results:
                    return b
                if not results[b]:
                    break
        return None

    def _close_round_if_done(self) -> None:
        while self.pruning and self._next_pruning_candidate() is None:
            survivors = [b for b in self._survivors if self._round_results.get(b, False)]
            # If nothing converged, keep the default alone rather than an empty arm set.
            self._survivors = survivors or [self.default]
            self._round += 1
            self._round_results = {}

    # ----------------------------------------------------------------- Thompson sampling
    def _arm_values(self, arm: int) -> list[float]:
        """Costs (J) Thompson sampling fits for ``arm``; censored failures count as the bound."""
        bound = self.stop_cost
        values = []
        for o in self._history:
            if o.batch_size != arm:
                continue
            if o.converged or not self.censor_failures:
                values.append(o.cost)
            elif bound is not None:
                values.append(bound)
            elif math.isfinite(o.cost):
                values.append(o.cost)
        return values

    def _posterior(self, values: list[float], pooled_cv2: float) -> tuple[float, float]:
        """Posterior (mean, std) of an arm's mean cost under a flat prior (Zeus's formulas with
        σ̂₀⁻² = 0: σ̂² = σ̃²/n, μ̂ = mean)."""
        n = len(values)
        mean = float(np.mean(values))
        if self.pooled_noise:
            sample_var = float(np.var(values, ddof=1)) if n > 1 else 0.0
            noise_var = max(sample_var, pooled_cv2 * mean**2)
        else:
            noise_var = float(np.var(values))  # Zeus: zero variance means infinite precision
        return mean, math.sqrt(noise_var / n)

    def _pooled_cv2(self, per_arm: dict[int, list[float]]) -> float:
        ratios = [np.var(v, ddof=1) / np.mean(v) ** 2 for v in per_arm.values() if len(v) > 1 and np.mean(v) > 0]
        return float(np.mean(ratios)) if ratios else self.prior_cv**2

    def _thompson(self) -> int:
        per_arm = {a: self._arm_values(a) for a in self._survivors}
        unseen = [a for a, v in per_arm.items() if not v]
        if unseen:
            return min(unseen, key=lambda a: abs(a - self.default))
        cv2 = self._pooled_cv2(per_arm)
        samples = {}
        for arm, values in per_arm.items():
            mean, std = self._posterior(values, cv2)
            samples[arm] = self._rng.normal(mean, std) if std > 0 else mean
        return min(samples, key=samples.__getitem__)

    def _best_known(self) -> int:
        means = {
            b: float(np.mean([o.cost for o in self._history if o.batch_size == b and o.converged]))
            for b in {o.batch_size for o in self._history if o.converged}
        }
        return min(means, key=means.__getitem__) if means else self.default

    # ----------------------------------------------------------------- public API
    def choose(self) -> int:
        """Batch size for the next run. Safe with concurrent runs: while the next pruning candidate is
        already running, other callers get the best batch size known so far."""
        if self.pruning:
            candidate = self._next_pruning_candidate()
            choice = candidate if candidate is not None and not self._pending[candidate] else self._best_known()
        else:
            choice = self._thompson()
        self._pending[choice] += 1
        return choice

    def observe(self, batch_size: int, cost: float, converged: bool) -> None:
        """Record a finished (or stopped, or never started) run of ``batch_size`` with ``cost`` (J)."""
        if batch_size not in self.batch_sizes:
            raise BanditError(f"batch size {batch_size} is not one of {self.batch_sizes}.")
        if math.isnan(cost) or cost < 0:
            raise BanditError(f"cost={cost} for batch size {batch_size} must be a non-negative number (J).")
        if converged and not math.isfinite(cost):
            raise BanditError(f"a converged run of batch size {batch_size} needs a finite cost, got {cost}.")
        if self._pending[batch_size]:
            self._pending[batch_size] -= 1
        self._history.append(Observation(int(batch_size), float(cost), bool(converged)))
        if self.pruning and batch_size in self._survivors and batch_size not in self._round_results:
            self._round_results[batch_size] = bool(converged)
            self._close_round_if_done()
