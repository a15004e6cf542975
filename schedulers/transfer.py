"""What a Hydro search trains after its surrogates, to hand back a configuration that holds at full size
(plain Python).

The surrogates' best hyperparameters transfer to the full-size model (µP), but a narrow surrogate can prefer a
different validation optimum and single-seed scores are noisy. Remedies, all decided here:

- *seed repeats*: a configuration is trained ``seeds`` times in one fused trial (members differ in their
  initialisation); its score at a scale is the mean with a spread (:class:`Score`);
- *width ladder*: successive halving along width: the best ``1/eta`` of the configurations at scale S are
  trained again at S/2, the best of those at S/4, ... (scales above 1), then the top ``top_k`` at full size;
- *top-k targets*: the ``top_k`` best configurations of the last surrogate scale train at full size and the
  best of them on validation is returned;
- *transfer check*: Spearman rank agreement between consecutive scales over the configurations trained at both
  (:class:`TransferCheck`), low when confidently below ``min_agreement``; and the returned configuration's
  full-size score against its score at the finest surrogate scale (:class:`TargetRegression`): a full-size model
  that does worse than its own surrogate is the sign of a choice that did not transfer;
- *fallback targets*: when the target regresses, the next ``fallback_targets`` configurations in ladder order
  (the finest surrogate stage's ranking, then the next coarser stage's for the ones it eliminated, ...) train
  at full size too, once, and the best full-size one on validation is returned.

Scales are width divisors (1 = full size). Stages are the search (at S) and the stages after it (ladder rungs,
then full size, then the fallback targets, also full size); decisions take the scores of the finished stages,
in order. The full-size stages count as one scale: the fallback targets join the targets.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FULL_SIZE = 1


@dataclass(frozen=True)
class Score:
    """A configuration's score at one scale: ``mean`` of its seeds' finite final values, ``spread`` their
    sample standard deviation (0 for one seed), ``count`` the seeds it averages."""

    mean: float
    spread: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Score | None:
        """The score of one configuration's seed values (non-finite ones ignored); ``None`` if none is finite."""
        finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if not finite:
            return None
        mean = sum(finite) / len(finite)
        spread = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)) if len(finite) > 1 else 0.0
        return cls(mean, spread, len(finite))

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.spread:.2g} (n={self.count})" if self.count > 1 else f"{self.mean:.4g}"


def scores_of(values: Iterable[tuple[str, float]]) -> dict[str, Score]:
    """Scores of ``(config id, final value)`` pairs, one per seed, grouped by config (first-seen order);
    configurations without a finite value are left out."""
    grouped: dict[str, list[float]] = {}
    for config, value in values:
        grouped.setdefault(config, []).append(value)
    return {c: score for c, v in grouped.items() if (score := Score.of(v)) is not None}


Stages = Sequence[Mapping[str, Score]]  # config id -> score of each finished stage, the search's first


@dataclass(frozen=True)
class Rung:
    """A stage to train: ``configs`` (ids, best first) at width ÷ ``scale``, each ``seeds`` times."""

    scale: int
    configs: list[str]
    seeds: int


@dataclass(frozen=True)
class TransferCheck:
    """Rank agreement (Spearman ``rho``) of the ``configs`` trained at both ``coarse`` and ``fine`` scales, and
    ``upper``, the one-sided 95% upper confidence bound of ``rho`` (Fisher z with Bonett & Wright's standard
    error for Spearman, ``sqrt((1 + rho²/2) / (n - 3))``). ``low``: even ``upper`` is below the policy's
    ``min_agreement``, so the disagreement is not just the noise of few configurations (the top configurations
    of a ladder are close, and 6 of them rank at random more often than not). ``rho`` is NaN with fewer than 3
    configurations, ``upper`` with fewer than 4; NaN is never low."""

    coarse: int
    fine: int
    configs: int
    rho: float
    upper: float
    low: bool


@dataclass(frozen=True)
class TargetRegression:
    """The returned ``config`` scored ``full_size`` at full size, worse than its ``surrogate`` score at width ÷
    ``scale`` by ``drop`` (a fraction of the surrogate score)."""

    config: str
    scale: int
    surrogate: float
    full_size: float
    drop: float


ONE_SIDED_95 = 1.6449  # standard normal quantile


def rho_upper_bound(rho: float, n: int) -> float:
    """One-sided 95% upper confidence bound of a Spearman ``rho`` over ``n`` pairs (NaN if ``n < 4``)."""
    if n < 4 or not math.isfinite(rho):
        return math.nan
    clipped = max(-0.9999, min(0.9999, rho))  # atanh(±1) is infinite
    error = math.sqrt((1 + rho * rho / 2) / (n - 3))
    return math.tanh(math.atanh(clipped) + ONE_SIDED_95 * error)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation of paired values (ties get average ranks); NaN if fewer than 2 pairs or a
    side is constant."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} values against {len(b)}")
    ra, rb = _ranks(a), _ranks(b)
    n = len(ra)
    if n < 2:
        return math.nan
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var > 0 else math.nan


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


@dataclass
class TransferPolicy:
    """``fraction``: share of the ``num_samples`` search members that must have finished before the transfer
    stages start (``None``: no stages, no target); ranked by their final ``metric`` in ``mode``. ``scale``: the
    search's surrogate scale S. ``ladder``: train the best ``1/eta`` at S/2, S/4, ... before full size.
    ``top_k``: configurations trained at full size. ``seeds``: repeats of each configuration in surrogate
    stages. ``min_agreement``: a transfer check whose Spearman rho is confidently below this is low.
    ``max_target_drop``: a full-size score worse than the same configuration's finest surrogate score by more
    than this fraction is a :class:`TargetRegression`. ``fallback_targets``: on a regression of the returned
    target, the next configurations in ladder order trained at full size (at most this many, once). An unshrunk
    search (``scale`` 1) has nothing to transfer: its one stage re-trains its best configuration at full size.

    Defaults (the ladder, one full-size target, one seed, 2 fallback targets) are what won
    ``benchmarks/transfer_fidelity.py``: the ladder as good as top-2 or seed repeats on its workloads, for less;
    the fallback targets, which cost only when a target regresses, never made a result worse there and made
    three regressed runs better (by 1.0–1.3 points on the overfitting MLP at S=8; on the CNN at S=4 without the
    ladder from 7.3 points short of stock's best to 0.7 better)."""

    fraction: float | None
    num_samples: int
    metric: str
    mode: str
    scale: int = 1
    ladder: bool = True
    eta: int = 3
    top_k: int = 1
    seeds: int = 1
    min_agreement: float = 0.5
    max_target_drop: float = 0.01
    fallback_targets: int = 2

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"transfer_fraction must be in (0, 1] or None, got {self.fraction}")
        for name, low in (("scale", 1), ("top_k", 1), ("seeds", 1), ("eta", 2), ("fallback_targets", 0)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < low:
                raise ValueError(f"TransferPolicy: {name} must be an int >= {low}, got {getattr(self, name)!r}")
        if not self.max_target_drop >= 0:
            raise ValueError(f"TransferPolicy: max_target_drop must be >= 0, got {self.max_target_drop!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"TransferPolicy: mode must be 'min' or 'max', got {self.mode!r}")
        if not isinstance(self.ladder, bool):
            raise ValueError(f"TransferPolicy: ladder must be True or False, got {self.ladder!r}")
        if not -1 <= self.min_agreement <= 1:
            raise ValueError(f"TransferPolicy: min_agreement is a Spearman rho, in [-1, 1]; got {self.min_agreement!r}")

    # --- when the stages start ----------------------------------------------------------------------------

    def due(self, finished: Mapping[str, dict | None], nothing_left: bool) -> bool:
        """Whether the transfer stages should start now, given the finished search members' results;
        ``nothing_left``: no member is left to draw and none is still training."""
        if self.fraction is None:
            return False
        enough = len(finished) >= math.ceil(self.fraction * self.num_samples)
        return (enough or nothing_left) and self.best(finished) is not None

    def best(self, finished: Mapping[str, dict | None]) -> str | None:
        """The finished member with the best finite final value (first one on ties), or ``None``."""
        ranked = self.ranking({m: score for m, r in finished.items()
                               if (score := Score.of([(r or {}).get(self.metric, math.nan)])) is not None})
        return ranked[0] if ranked else None

    # --- what they train -----------------------------------------------------------------------------------

    def scales(self) -> list[int]:
        """The scale of every planned stage: the search's S, then S/2, S/4, ... (above 1) with the ladder, then 1
        (the fallback targets, when they train, are one more full-size stage)."""
        rungs, scale = [self.scale], self.scale // 2
        while self.ladder and scale > FULL_SIZE:
            rungs.append(scale)
            scale //= 2
        return [*rungs, FULL_SIZE]

    def schedule(self, candidates: int) -> list[tuple[int, int, int]]:
        """``(scale, configurations, seeds)`` of each planned stage after the search, for ``candidates`` scored
        configurations."""
        stages, count = [], candidates
        for scale in self.scales()[1:]:
            top_k = self.top_k if self.scale > FULL_SIZE else 1
            count = min(count, top_k if scale == FULL_SIZE else max(top_k, math.ceil(count / self.eta)))
            stages.append((scale, count, self.seeds if scale > FULL_SIZE else 1))
        return stages

    def fallbacks(self, candidates: int) -> int:
        """The most fallback targets a search of ``candidates`` scored configurations can train (none unshrunk)."""
        return 0 if self.scale == FULL_SIZE else min(self.fallback_targets, candidates - self.schedule(candidates)[-1][1])

    def cost(self, candidates: int) -> float:
        """Estimated cost of the planned stages after the search in full-size trainings, taking a member's compute
        as proportional to width² (dense layers): the sum over stages of configurations × seeds ÷ scale²; the
        fallback targets, if they train, add one each (:meth:`fallbacks`)."""
        return sum(count * seeds / scale ** 2 for scale, count, seeds in self.schedule(candidates))

    def describe(self, candidates: int) -> str:
        """The stages after the search and their cost, the most the fallback targets can add included, to show
        before they run."""
        stages = ", ".join(f"{count}" + (f"×{seeds} seeds" if seeds > 1 else "")
                           + (" at full size" if scale == FULL_SIZE else f" at S={scale}")
                           for scale, count, seeds in self.schedule(candidates))
        cost, fallbacks = self.cost(candidates), self.fallbacks(candidates)
        return f"{stages}: about {cost:.2f} full-size trainings (compute ∝ width²)" + (
            f"; if the target does worse than its surrogate, up to {fallbacks} more at full size (at most "
            f"{cost + fallbacks:.2f})" if fallbacks else "")

    def next_rung(self, stages: Stages) -> Rung | None:
        """The next stage to train, from the scores of the finished ones (``stages[0]``: the search's): the planned
        stages in turn, then the fallback targets if the returned target regressed (:meth:`regression`);
        ``None`` when there is none left or the last stage has no score."""
        planned = self.scales()
        if not stages or not stages[-1]:
            return None
        if len(stages) < len(planned):
            scale, count, seeds = self.schedule(len(stages[0]))[len(stages) - 1]
            return Rung(scale, self.ranking(stages[-1])[:count], seeds)
        if len(stages) > len(planned) or self.fallbacks(len(stages[0])) == 0 or self.regression(stages) is None:
            return None
        trained = self.next_rung(stages[:-1]).configs  # the targets, failed ones included
        fallback = [c for c in self.ladder_order(stages) if c not in trained][:self.fallback_targets]
        return Rung(FULL_SIZE, fallback, 1) if fallback else None

    def final(self, stages: Stages) -> bool:
        """Whether the stage :meth:`next_rung` returns after ``stages`` is the last that can train (no fallback
        targets can follow it)."""
        return len(stages) >= len(self.scales()) - (1 if self.fallbacks(len(stages[0])) == 0 else 0)

    def ladder_order(self, stages: Stages) -> list[str]:
        """The surrogate-scored configurations, best first: by the finest surrogate stage each reached, then by
        its score there."""
        order: list[str] = []
        for scores in reversed(stages[:len(self.scales()) - 1]):
            order += [c for c in self.ranking(scores) if c not in order]
        return order

    def ranking(self, scores: Mapping[str, Score]) -> list[str]:
        """Config ids by mean score, best first (ties keep their order)."""
        sign = -1.0 if self.mode == "max" else 1.0
        return sorted(scores, key=lambda c: sign * scores[c].mean)

    def by_scale(self, stages: Stages) -> list[tuple[int, dict[str, Score]]]:
        """The scores at each scale trained so far, coarse to fine: the stages with their scales, the full-size
        ones (targets, fallback targets) merged into one."""
        planned = self.scales()
        out = [(scale, dict(scores)) for scale, scores in zip(planned[:-1], stages)]
        if len(stages) >= len(planned):
            out.append((FULL_SIZE, {c: s for scores in stages[len(planned) - 1:] for c, s in scores.items()}))
        return out

    def returned(self, stages: Stages) -> str | None:
        """The configuration the run returns: the best at the finest scale with a score (at full size: the best
        of the targets and fallback targets)."""
        scored = [scores for _, scores in self.by_scale(stages) if scores]
        return self.ranking(scored[-1])[0] if scored else None

    def checks(self, stages: Stages) -> list[TransferCheck]:
        """Rank agreement of every pair of consecutive scales, coarse to fine."""
        out, pairs = [], self.by_scale(stages)
        for (coarse, a), (fine, b) in zip(pairs, pairs[1:]):
            common = [c for c in b if c in a]
            rho = spearman([a[c].mean for c in common], [b[c].mean for c in common]) if len(common) >= 3 else math.nan
            upper = rho_upper_bound(rho, len(common))
            out.append(TransferCheck(coarse, fine, len(common), rho, upper,
                                     math.isfinite(upper) and upper < self.min_agreement))
        return out

    def regression(self, stages: Stages) -> TargetRegression | None:
        """The returned configuration's full-size score if it is worse than its finest surrogate score by more
        than ``max_target_drop`` (relative), else ``None``."""
        config = self.returned(stages)
        trail = self.trail(stages, config) if config is not None else []
        if len(trail) < 2 or trail[-1][0] != FULL_SIZE:
            return None
        (scale, surrogate), (_, full) = trail[-2], trail[-1]
        worse = surrogate.mean - full.mean if self.mode == "max" else full.mean - surrogate.mean
        drop = worse / abs(surrogate.mean) if surrogate.mean else math.copysign(math.inf, worse)
        if not drop > self.max_target_drop:
            return None
        return TargetRegression(config, scale, surrogate.mean, full.mean, drop)

    def trail(self, stages: Stages, config: str) -> list[tuple[int, Score]]:
        """``config``'s score at each scale it was trained at, coarse to fine."""
        return [(scale, scores[config]) for scale, scores in self.by_scale(stages) if config in scores]
