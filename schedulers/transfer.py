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
- *fidelity escalation*: when the first rung's ranking disagrees with the search's (:class:`Disagreement`; by
  default the first rung also trains a few configurations from below its cut, *probes*, and one of them ranking
  where the next rung keeps it, clearly ahead of the best one left out, is the disagreement) or the target
  regresses, every configuration is ranked again at S/2 (those not trained there yet train at S/2, once) and the
  ladder goes on from that ranking, down to new full-size targets: a surrogate scale too coarse for the workload
  is replaced by the next finer one;
- *rung halving*: a ladder rung need not train all its configurations to the end: inside each of its trials,
  successive halving over epochs (:class:`~schedulers.rung_halving.RungHalving`) stops all but the ones the next
  stage needs (``survivors``) at milestone epochs; those that stopped rank below those that went on
  (:attr:`Score.reached`);
- *fallback targets*: when the target still regresses, the next ``fallback_targets`` configurations in ladder
  order (the finest surrogate scale's ranking, then the next coarser scale's for the ones it did not reach, ...)
  train at full size too, once, and the best full-size one on validation is returned.

Scales are width divisors (1 = full size). Stages are the search (at S) and the stages after it, each a
:class:`Rung` at one scale; decisions take the scores of the finished stages, in order, and are replayed from
them (the policy keeps no state). The stages at one scale count as one: their scores are merged (the full-size
targets, escalated targets and fallback targets are one scale), and a configuration trains at most once at each
scale.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import Enum

from schedulers.rung_halving import fraction as halving_fraction

FULL_SIZE = 1
AUTO = "auto"  # the value of an option (the search's scale, rung halving) a user lets Hydro choose
# The finest S/2 an escalation ranks every configuration at: that costs (2/S)² of a full-size search of them (1/16
# at S=8, 1/4 at S=4; docs/design/transfer.md).
MIN_ESCALATION_SCALE = 4
# The TransferPolicy options that shape the stages after a shrunk search (``seeds`` repeats the search's members too).
STAGE_OPTIONS = ("ladder", "halving", "eta", "top_k", "min_agreement", "max_target_drop", "escalate", "disagreement", "probes",
                 "probe_margin", "fallback_targets")


@dataclass(frozen=True)
class Score:
    """A configuration's score at one scale: ``mean`` of its seeds' finite final values, ``spread`` their
    sample standard deviation (0 for one seed), ``count`` the seeds it averages; ``reached``: the epoch they were
    measured after (0: not recorded; the rungs record it, as their halving stops members at different epochs). At
    one scale a higher ``reached`` ranks first."""

    mean: float
    spread: float
    count: int
    reached: int = 0

    @classmethod
    def of(cls, values: Iterable[float], reached: int = 0) -> Score | None:
        """The score of one configuration's seed values (non-finite ones ignored) measured after epoch
        ``reached``; ``None`` if none is finite."""
        finite = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
        if not finite:
            return None
        mean = sum(finite) / len(finite)
        spread = math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)) if len(finite) > 1 else 0.0
        return cls(mean, spread, len(finite), reached)

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.spread:.2g} (n={self.count})" if self.count > 1 else f"{self.mean:.4g}"


def scores_of(values: Iterable[tuple[str, float]], reached: Mapping[str, int] | None = None) -> dict[str, Score]:
    """Scores of ``(config id, final value)`` pairs, one per seed, grouped by config (first-seen order), each
    measured after epoch ``reached[config]`` (default 0); configurations without a finite value are left out."""
    grouped: dict[str, list[float]] = {}
    for config, value in values:
        grouped.setdefault(config, []).append(value)
    return {c: score for c, v in grouped.items() if (score := Score.of(v, (reached or {}).get(c, 0))) is not None}


Stages = Sequence[Mapping[str, Score]]  # config id -> score of each finished stage, the search's first


class Disagreement(Enum):
    """When the first rung's transfer check (the search at S against S/2) is a disagreement that escalates.

    - ``PROBE`` (the default): one of the ``probes`` configurations from below the first rung's cut at S (every
      other rank: with 16 configurations and a cut of 6, the 7th, 9th and 11th), trained in the first rung, ranks at
      S/2 among those the next rung keeps, ahead of the best configuration left out by more than ``probe_margin``;
      or the check over the first rung and its probes is low as ``CONFIDENT`` says.
    - ``LIKELY``: rho is below ``min_agreement`` over at least 4 configurations.
    - ``CONFIDENT``: rho's one-sided 95% upper bound is below ``min_agreement`` (the transfer warning's rule).

    Why ``PROBE`` is the default: ``docs/design/transfer.md``.
    """

    PROBE = "probe"
    LIKELY = "likely"
    CONFIDENT = "confident"


class RungKind(Enum):
    """What a rung is for."""

    LADDER = "ladder"
    ESCALATION = "escalation"
    FALLBACK = "fallback"


@dataclass(frozen=True)
class Rung:
    """A stage to train: ``configs`` (ids, best first) at width ÷ ``scale``, each ``seeds`` times; ``survivors``:
    with rung halving, the configurations the stage must train to the end (0: all of them). ``kind``:
    :attr:`RungKind.LADDER` (a planned stage: ladder rung or full-size targets, also after an escalation),
    :attr:`RungKind.ESCALATION` (the configurations not yet trained at S/2, to rank all of them there) or
    :attr:`RungKind.FALLBACK` (fallback targets); ``why``: what caused an escalation or fallback, for the log."""

    scale: int
    configs: list[str]
    seeds: int
    kind: RungKind = RungKind.LADDER
    why: str = ""
    survivors: int = 0


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
    return _rho_bound(rho, n, 1)


def rho_lower_bound(rho: float, n: int) -> float:
    """One-sided 95% lower confidence bound of a Spearman ``rho`` over ``n`` pairs (NaN if ``n < 4``)."""
    return _rho_bound(rho, n, -1)


def _rho_bound(rho: float, n: int, side: int) -> float:
    """The one-sided 95% bound of ``rho`` over ``n`` pairs above it (``side`` 1) or below it (-1)."""
    if n < 4 or not math.isfinite(rho):
        return math.nan
    clipped = max(-0.9999, min(0.9999, rho))  # atanh(±1) is infinite
    error = math.sqrt((1 + rho * rho / 2) / (n - 3))
    return math.tanh(math.atanh(clipped) + side * ONE_SIDED_95 * error)


def rank_check(coarse: int, a: Sequence, fine: int, b: Sequence, min_agreement: float) -> TransferCheck:
    """The :class:`TransferCheck` of paired values (any ordered values, the same order on both sides) of the same
    configurations at ``coarse`` (``a``) and ``fine`` (``b``), low against ``min_agreement``."""
    rho = spearman(a, b) if len(a) >= 3 else math.nan
    upper = rho_upper_bound(rho, len(a))
    return TransferCheck(coarse, fine, len(a), rho, upper, math.isfinite(upper) and upper < min_agreement)


def spearman(a: Sequence, b: Sequence) -> float:
    """Spearman rank correlation of paired values (any ordered values: numbers, or tuples compared in order; ties
    get average ranks); NaN if fewer than 2 pairs or a side is constant."""
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


def _ranks(values: Sequence) -> list[float]:
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
    """What a search trains after its surrogates and which configuration it returns; stateless: every decision is
    replayed from the scores of the finished stages.

    Args:
        fraction: share of the ``num_samples`` search members that must have finished before the stages start, in
            (0, 1]; ``None``: no stages and no full-size target.
        num_samples: the search's members.
        metric: the reported metric the configurations are ranked by.
        mode: ``"min"`` or ``"max"``.
        scale: the search's surrogate width divisor S (1: full size).
        ladder: train the best ``1/eta`` again at S/2, S/4, ... (scales above 1) before full size; ``False``: the
            search's best configurations go to full size directly.
        halving: successive halving over epochs inside each ladder rung's trials, by ``eta``, down to the
            configurations the next stage trains (the first rung: one more, to measure a probe's lead); only with
            one seed and ``epochs`` enough for a milestone (``epochs // eta >= 1``); escalations train in full.
            :data:`AUTO` (the default): the search driver decides when the search has finished, from the search
            members' scores at the milestones against their final ones (:mod:`schedulers.halving_choice`): where
            training overfits, a milestone's ranking does not predict the end's. Until then the plan is the one
            without halving.
        eta: each rung keeps the best ``1/eta`` of the configurations before it (int >= 2).
        top_k: configurations trained at full size; the best on validation is returned (int >= 1).
        seeds: trainings of each configuration in the surrogate stages; its score is their mean (int >= 1).
        min_agreement: a transfer check whose Spearman rho has a one-sided 95% upper bound below this is low
            (in [-1, 1]).
        max_target_drop: a full-size score worse than the same configuration's finest surrogate score by more than
            this fraction of it is a :class:`TargetRegression` (>= 0; ``math.inf`` turns the check off).
        escalate: fidelity escalation, once, when the first rung disagrees (``disagreement``) or the target
            regresses; only where S/2 >= :data:`MIN_ESCALATION_SCALE` (S >= 8).
        disagreement: what makes the first rung disagree (:class:`Disagreement`).
        probes: with :attr:`Disagreement.PROBE`, configurations from below the first rung's cut at S (every other
            rank) that the first rung trains too; each costs ``seeds`` ÷ (S/2)² full-size trainings (int >= 0).
        probe_margin: a probe S/2 ranks among those the next rung keeps is promoted only when it leads the best
            configuration S/2 leaves out by more than this fraction (>= 0).
        fallback_targets: on a regression of the returned target that escalation did not cure, at most this many
            more configurations, the next in ladder order, train at full size, once (int >= 0).
        slots: trials of a rung that train at once where a trial's time grows with its members (CPU trials; set by
            the searcher); a rung leaves out the configurations of a last round of the slots that would be at most
            half full, unless it would then keep no more than ``top_k`` (int >= 1).
        epochs: the epochs a member trains (set by the searcher; rung halving's milestones are fractions of it).

    With ``scale`` 1 there is nothing to transfer: the one stage re-trains the best configuration at full size,
    with no regression check.

    Raises:
        ValueError: an option of the wrong type or out of its range; or an option other than ``seeds`` set away
            from its default where it cannot act (``scale`` 1 or ``fraction`` ``None``).

    Why the defaults are what they are: ``docs/design/transfer.md``.
    """

    fraction: float | None
    num_samples: int
    metric: str
    mode: str
    scale: int = 1
    ladder: bool = True
    halving: bool | str = AUTO
    eta: int = 3
    top_k: int = 1
    seeds: int = 1
    min_agreement: float = 0.5
    max_target_drop: float = 0.01
    escalate: bool = True
    disagreement: Disagreement = Disagreement.PROBE
    probes: int = 3
    probe_margin: float = 0.01
    fallback_targets: int = 2
    slots: int = 1
    epochs: int = 1

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"transfer_fraction must be in (0, 1] or None, got {self.fraction}")
        for name, low in (("scale", 1), ("top_k", 1), ("seeds", 1), ("eta", 2), ("fallback_targets", 0), ("probes", 0),
                          ("slots", 1), ("epochs", 1)):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < low:
                raise ValueError(f"TransferPolicy: {name} must be an int >= {low}, got {getattr(self, name)!r}")
        for name in ("max_target_drop", "probe_margin"):
            value = getattr(self, name)  # inf turns the check off
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"TransferPolicy: {name} must be >= 0, got {value!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"TransferPolicy: mode must be 'min' or 'max', got {self.mode!r}")
        for name in ("ladder", "halving", "escalate"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "halving" and value == AUTO):
                choices = "True, False or 'auto'" if name == "halving" else "True or False"
                raise ValueError(f"TransferPolicy: {name} must be {choices}, got {value!r}")
        if not isinstance(self.disagreement, Disagreement):
            choices = ", ".join(f"Disagreement.{d.name}" for d in Disagreement)
            raise ValueError(f"TransferPolicy: disagreement must be a schedulers.transfer.Disagreement ({choices}), "
                             f"got {self.disagreement!r}")
        if not -1 <= self.min_agreement <= 1:
            raise ValueError(f"TransferPolicy: min_agreement is a Spearman rho, in [-1, 1]; got {self.min_agreement!r}")
        self._refuse_unused_options()

    def _refuse_unused_options(self) -> None:
        """Raise ``ValueError`` for options set away from their defaults that cannot act: every option but
        ``seeds`` shapes what trains after a shrunk search, so none acts unshrunk (``scale`` 1) or without stages."""
        unused = [f"{f.name}={_shown(getattr(self, f.name))}" for f in fields(self)
                  if f.name in STAGE_OPTIONS and getattr(self, f.name) != f.default]
        if not unused or (self.scale > FULL_SIZE and self.fraction is not None):
            return
        why, fix = (("transfer_fraction is None: no stage trains after the search", "give a transfer_fraction")
                    if self.fraction is None else
                    ("scale is 1: the search trains full-size models and only its best configuration trains again",
                     "shrink the search (scale > 1; hydro tune --scale)"))
        raise ValueError(f"TransferPolicy: {', '.join(unused)} cannot act, {why}; these options shape the stages "
                         f"after a shrunk search: leave them at their defaults, or {fix}")

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

    # --- the plan and its cost -----------------------------------------------------------------------------

    def scales(self) -> list[int]:
        """The scale of every planned stage: the search's S, then S/2, S/4, ... (above 1) with the ladder, then 1
        (an escalation, the fallback targets, when they train, are more stages)."""
        return [self.scale, *(scale for scale, _, _ in self.schedule(1))]

    def schedule(self, candidates: int) -> list[tuple[int, int, int]]:
        """``(scale, configurations, seeds)`` of each planned stage after the search, for ``candidates`` scored
        configurations."""
        return self._plan(self.scale, candidates)

    def _plan(self, base: int, candidates: int) -> list[tuple[int, int, int]]:
        """The stages after a ranking of ``candidates`` configurations at scale ``base``: the ladder's, its first
        rung widened by the probes when they train (:meth:`probing`)."""
        stages = self._ladder(base, candidates)
        if base == self.scale:
            scale, count, seeds = stages[0]
            stages[0] = (scale, count + len(self._probe_ranks(candidates)), seeds)
        return stages

    def _ladder(self, base: int, candidates: int) -> list[tuple[int, int, int]]:
        """The ladder's stages after a ranking of ``candidates`` configurations at scale ``base``."""
        stages, count, scale = [], candidates, base // 2
        top_k = self.top_k if self.scale > FULL_SIZE else 1
        while self.ladder and scale > FULL_SIZE:
            count = self._whole_rounds(min(count, max(top_k, math.ceil(count / self.eta))), top_k)
            stages.append((scale, count, self.seeds))
            scale //= 2
        return [*stages, (FULL_SIZE, min(count, top_k), 1)]

    def _whole_rounds(self, count: int, top_k: int) -> int:
        """A rung's ``count`` less the configurations of a last round of the ``slots`` that is at most half full
        (the rest's members × ``seeds`` fill whole rounds), unless the rung would then keep no more than the
        ``top_k`` after it (it would choose nothing); never more configurations."""
        step = self.slots // math.gcd(self.slots, self.seeds)  # configurations per whole round of the slots
        whole = count // step * step
        return whole if step > 1 and 2 * (count - whole) <= step and whole > top_k else count

    def _probe_ranks(self, candidates: int) -> range:
        """The ranks (0: best) at S of the first rung's probes among ``candidates`` configurations: every other one
        below its cut, ``probes`` of them, so that they reach twice as far below it as the next ones would; none
        unless :meth:`probing`."""
        if not self.probing():
            return range(0)
        cut = self._ladder(self.scale, candidates)[0][1]
        return range(cut, candidates, 2)[:self.probes]

    def _probes(self, ranked: Sequence[str]) -> list[str]:
        """The probes of a search whose configurations rank ``ranked`` (best first)."""
        return [ranked[i] for i in self._probe_ranks(len(ranked))]

    def probing(self) -> bool:
        """Whether the first rung trains probes: :attr:`Disagreement.PROBE` with ``probes``, a ladder, and an
        escalation they could cause."""
        return (self.disagreement is Disagreement.PROBE and self.probes > 0 and self.ladder
                and self.can_escalate())

    def fallbacks(self, candidates: int) -> int:
        """The most fallback targets a search of ``candidates`` scored configurations can train (none unshrunk)."""
        return 0 if self.scale == FULL_SIZE else min(self.fallback_targets, candidates - self.schedule(candidates)[-1][1])

    def can_escalate(self) -> bool:
        """Whether this policy escalates when asked to: ``escalate`` and S/2 >= :data:`MIN_ESCALATION_SCALE`."""
        return self.escalate and self.scale // 2 >= MIN_ESCALATION_SCALE

    def cost(self, candidates: int) -> float:
        """Estimated cost of the planned stages after the search in full-size trainings, taking a member's compute
        as proportional to width² (dense layers): the sum over stages of configurations × seeds ÷ scale², times the
        share of their member-epochs a rung's halving trains (:func:`~schedulers.rung_halving.fraction`); an
        escalation and the fallback targets, if they train, add :meth:`escalation_cost` and one each."""
        return self._stages_cost(self.schedule(candidates), self.probing())

    def _stages_cost(self, stages: Sequence[tuple[int, int, int]], probing: bool) -> float:
        """Full-size trainings of planned ``stages`` (``probing``: the first is the first rung, with probes)."""
        total = 0.0
        for i, (scale, count, seeds) in enumerate(stages):
            survivors = self.survivors(stages, i, probing)
            share = halving_fraction(count, survivors, self.epochs, self.eta) if survivors else 1.0
            total += count * seeds / scale ** 2 * share
        return total

    def survivors(self, stages: Sequence[tuple[int, int, int]], i: int, probing: bool) -> int:
        """How many configurations of planned stage ``i`` of ``stages`` must train to the end with rung halving:
        those the next stage trains (one more for the first rung, ``probing``, so that a probe's lead over the best
        one left out is measured at the same epoch); 0: the stage does not halve."""
        scale, _, seeds = stages[i]
        if (self.halving is not True or seeds > 1 or scale == FULL_SIZE or self.epochs // self.eta < 1
                or i + 1 >= len(stages)):
            return 0
        return stages[i + 1][1] + (1 if i == 0 and probing else 0)

    def escalation_cost(self, candidates: int) -> float:
        """The most an escalation adds (0 if it cannot happen): the configurations not in the first rung at S/2,
        then the ladder from S/2 over all ``candidates`` (counted in full: configurations it keeps that trained
        there already cost nothing again)."""
        if not self.can_escalate():
            return 0.0
        first = self.schedule(candidates)[0]
        trained = first[1] if first[0] == self.scale // 2 else 0
        escalation = (candidates - trained) * self.seeds / (self.scale // 2) ** 2  # trains in full
        return escalation + self._stages_cost(self._plan(self.scale // 2, candidates), False)

    def describe(self, candidates: int) -> str:
        """The stages after the search and their cost, the most an escalation and the fallback targets can add
        included, to show before they run."""
        planned, probes = self.schedule(candidates), len(self._probe_ranks(candidates))
        stages = ", ".join(f"{count}" + (f"×{seeds} seeds" if seeds > 1 else "")
                           + (" at full size" if scale == FULL_SIZE else f" at S={scale}")
                           + (f" ({probes} of them probes from below the cut)" if i == 0 and probes else "")
                           + (f", all but {survivors} stopped early" if (survivors := min(count, self.survivors(
                               planned, i, self.probing()))) and survivors < count else "")
                           for i, (scale, count, seeds) in enumerate(planned))
        cost, escalation, fallbacks = self.cost(candidates), self.escalation_cost(candidates), self.fallbacks(candidates)
        text = f"{stages}: about {cost:.2f} full-size trainings (compute ∝ width²)"
        if escalation:
            text += (f"; if the rankings at S={self.scale} and S={self.scale // 2} disagree or the target does worse "
                     f"than its surrogate, all at S={self.scale // 2} and the ladder again from there: up to "
                     f"{escalation:.2f} more")
        if fallbacks:
            text += f"; if the target {'still does worse' if escalation else 'does worse than its surrogate'}, up to " \
                    f"{fallbacks} more at full size"
        return text + (f" (at most {cost + escalation + fallbacks:.2f})" if escalation or fallbacks else "")

    # --- what they train -----------------------------------------------------------------------------------

    def next_rung(self, stages: Stages) -> Rung | None:
        """The next stage to train, from the scores of the finished ones (``stages[0]``: the search's): the
        ladder's stages in turn (from S, or from S/2 after an escalation), an escalation when the first rung's
        check is low or the target regressed, then the fallback targets if the target still regressed; ``None``
        when there is none left or the last stage has no score."""
        return self._next(stages, self.rungs(stages))

    def rungs(self, stages: Stages) -> list[Rung]:
        """The rung each finished stage after the search trained (the decisions replayed from the scores)."""
        rungs: list[Rung] = []
        for end in range(1, len(stages)):
            rung = self._next(stages[:end], rungs)
            if rung is None:
                raise ValueError(f"TransferPolicy: stage {end} follows stages after which nothing was to train")
            rungs.append(rung)
        return rungs

    def _next(self, stages: Stages, rungs: list[Rung]) -> Rung | None:
        if not stages or not stages[-1]:
            return None
        merged, tried = self._merged(stages, rungs), self._tried(rungs)
        escalated = any(r.kind == RungKind.ESCALATION for r in rungs)
        base = self.scale // 2 if escalated else self.scale

        def at(scale: int) -> Mapping[str, Score]:  # the search's scores at S (S=1: apart from the targets')
            return stages[0] if scale == self.scale else merged.get(scale, {})

        previous, plan = base, self._plan(base, len(at(base)))
        for i, (scale, count, seeds) in enumerate(plan):
            ranked = self.ranking(at(previous))
            probes = self._probes(ranked) if previous == self.scale else []  # the first rung's (after the search)
            new = [c for c in [*ranked[:count - len(probes)], *probes] if c not in tried.get(scale, ())]
            if new:  # past the first rung (S/2), unless its ranking disagreed with the search's
                past_first = not escalated and scale < self.scale // 2
                rung = Rung(scale, new, seeds, survivors=min(len(new), self.survivors(plan, i, base == self.scale
                                                                                      and self.probing())))
                return (past_first and self._disagreement(stages, at(self.scale // 2), tried)) or rung
            previous = scale
        scales = self._by_scale(stages, rungs)
        regression = self._regression(scales)
        if regression is None:
            return None
        why = (f"the target {regression.config} scored {regression.full_size:.4g} at full size, "
               f"{100 * regression.drop:.1f}% worse than at S={regression.scale} ({regression.surrogate:.4g})")
        if not escalated and self.can_escalate() and (escalation := self._escalation(stages, tried, why)) is not None:
            return escalation
        if any(r.kind == RungKind.FALLBACK for r in rungs) or self.fallbacks(len(stages[0])) == 0:
            return None
        fallback = [c for c in self._ladder_order(scales, self.ranking)
                    if c not in tried.get(FULL_SIZE, ())][:self.fallback_targets]
        return Rung(FULL_SIZE, fallback, 1, RungKind.FALLBACK, why) if fallback else None

    def _disagreement(self, stages: Stages, first: Mapping[str, Score], tried: Mapping[int, set[str]]) -> Rung | None:
        """An escalation if the check of the search against the ``first`` rung (S/2) disagrees (see
        :class:`Disagreement`), else ``None``."""
        if not self.can_escalate():
            return None
        check = self._check(self.scale, stages[0], self.scale // 2, first)
        why = (f"the rankings at S={check.coarse} and S={check.fine} disagree (Spearman {check.rho:.2f} over "
               f"{check.configs} configurations, 95% upper bound {check.upper:.2f})")
        if self.disagreement is Disagreement.LIKELY:
            disagrees = check.configs >= 4 and check.rho < self.min_agreement
        else:
            disagrees = check.low
            if not disagrees and self.probing():  # a probe that S/2 promotes
                cut, keep = (count for _, count, _ in self._ladder(self.scale, len(stages[0]))[:2])
                at_s, at_half = self.ranking(stages[0]), self.ranking(first)
                leads = {c: self._lead(first[c].mean, left_out) for c in self._probes(at_s) if c in at_half[:keep]
                         and (left_out := self._best_left_out(first, at_half[keep:], first[c].reached)) is not None}
                promoted = [c for c, lead in leads.items() if lead > self.probe_margin]
                disagrees = bool(promoted)
                why = (f"the cut at S={self.scale} dropped what S={self.scale // 2} promotes: " + "; ".join(
                    f"{c} ranked {at_s.index(c) + 1} at S={self.scale} (cut: {cut}) and ranks {at_half.index(c) + 1} "
                    f"at S={self.scale // 2} (kept: {keep}), {100 * leads[c]:.1f}% ahead of the best left out"
                    for c in promoted))
        return self._escalation(stages, tried, why) if disagrees else None

    @staticmethod
    def _best_left_out(scores: Mapping[str, Score], left_out: Sequence[str], reached: int) -> float | None:
        """The mean of the first of ``left_out`` (ranked, best first) measured after epoch ``reached`` (a halving
        rung stops most of them earlier: they compare with a probe only where both were measured), or ``None``."""
        return next((scores[c].mean for c in left_out if scores[c].reached == reached), None)

    def _escalation(self, stages: Stages, tried: Mapping[int, set[str]], why: str) -> Rung | None:
        """The configurations of the search not yet trained at S/2, to train there (``None`` if there is none)."""
        configs = [c for c in self.ranking(stages[0]) if c not in tried.get(self.scale // 2, ())]
        return Rung(self.scale // 2, configs, self.seeds, RungKind.ESCALATION, why) if configs else None

    @staticmethod
    def _merged(stages: Stages, rungs: Sequence[Rung]) -> dict[int, dict[str, Score]]:
        """The scores of the stages after the search, merged by scale."""
        merged: dict[int, dict[str, Score]] = {}
        for rung, scores in zip(rungs, stages[1:]):
            merged.setdefault(rung.scale, {}).update(scores)
        return merged

    @staticmethod
    def _tried(rungs: Sequence[Rung]) -> dict[int, set[str]]:
        """The configurations each stage after the search trained, failed ones included, by scale."""
        tried: dict[int, set[str]] = {}
        for rung in rungs:
            tried.setdefault(rung.scale, set()).update(rung.configs)
        return tried

    def final(self, stages: Stages) -> bool:
        """Whether the stage :meth:`next_rung` returns after ``stages`` is the last that can train (no escalation
        and no fallback targets can follow it)."""
        rung = self.next_rung(stages)
        if rung is None or rung.scale != FULL_SIZE:
            return rung is None
        kinds = {r.kind for r in self.rungs(stages)} | {rung.kind}
        escalation_left = self.can_escalate() and RungKind.ESCALATION not in kinds
        fallback_left = self.fallbacks(len(stages[0])) > 0 and RungKind.FALLBACK not in kinds
        return not escalation_left and not fallback_left

    def ladder_order(self, stages: Stages) -> list[str]:
        """The surrogate-scored configurations, best first: by the finest surrogate scale each reached, then by
        its score there."""
        return self._ladder_order(self.by_scale(stages), self.ranking)

    @staticmethod
    def _ladder_order(scales: list[tuple[int, dict[str, Score]]], ranking) -> list[str]:
        order: list[str] = []
        for _, scores in reversed([scales[0], *(pair for pair in scales[1:] if pair[0] > FULL_SIZE)]):
            order += [c for c in ranking(scores) if c not in order]
        return order

    def ranking(self, scores: Mapping[str, Score]) -> list[str]:
        """Config ids best first: by the epoch their score was measured after (furthest first: a halving rung's
        members that went on were ahead of those it stopped where they were last together), then by mean score
        (ties keep their order)."""
        return sorted(scores, key=lambda c: self._key(scores[c]))

    def _key(self, score: Score) -> tuple[int, float]:
        """Sort key of a score, best first."""
        return -score.reached, (-score.mean if self.mode == "max" else score.mean)

    def by_scale(self, stages: Stages) -> list[tuple[int, dict[str, Score]]]:
        """The scores at each scale trained so far, coarse to fine: the search's, then the later stages' merged by
        scale (the full-size ones, targets and fallback targets, into one)."""
        return self._by_scale(stages, self.rungs(stages))

    def _by_scale(self, stages: Stages, rungs: Sequence[Rung]) -> list[tuple[int, dict[str, Score]]]:
        merged = self._merged(stages, rungs)
        return [(self.scale, dict(stages[0])), *((scale, merged[scale]) for scale in sorted(merged, reverse=True))]

    def returned(self, stages: Stages) -> str | None:
        """The configuration the run returns: the best at the finest scale with a score (at full size: the best
        of the targets, escalated targets and fallback targets)."""
        return self._returned(self.by_scale(stages))

    def _returned(self, scales: list[tuple[int, dict[str, Score]]]) -> str | None:
        scored = [scores for _, scores in scales if scores]
        return self.ranking(scored[-1])[0] if scored else None

    def checks(self, stages: Stages) -> list[TransferCheck]:
        """Rank agreement of every pair of consecutive scales, coarse to fine."""
        pairs = self.by_scale(stages)
        return [self._check(coarse, a, fine, b) for (coarse, a), (fine, b) in zip(pairs, pairs[1:])]

    def _check(self, coarse: int, a: Mapping[str, Score], fine: int, b: Mapping[str, Score]) -> TransferCheck:
        """The transfer check of the configurations scored both at ``coarse`` (``a``) and at ``fine`` (``b``)."""
        common = [c for c in b if c in a]
        return rank_check(coarse, [self._key(a[c]) for c in common], fine, [self._key(b[c]) for c in common],
                          self.min_agreement)

    def regression(self, stages: Stages) -> TargetRegression | None:
        """The returned configuration's full-size score if it is worse than its finest surrogate score by more
        than ``max_target_drop`` (relative), else ``None``."""
        return self._regression(self.by_scale(stages))

    def _regression(self, scales: list[tuple[int, dict[str, Score]]]) -> TargetRegression | None:
        config = self._returned(scales)
        trail = [(scale, scores[config]) for scale, scores in scales if config in scores]
        if len(trail) < 2 or trail[-1][0] != FULL_SIZE or trail[-2][0] == FULL_SIZE:  # unshrunk: a re-run
            return None
        (scale, surrogate), (_, full) = trail[-2], trail[-1]
        drop = -self._lead(full.mean, surrogate.mean)
        if not drop > self.max_target_drop:
            return None
        return TargetRegression(config, scale, surrogate.mean, full.mean, drop)

    def _lead(self, value: float, over: float) -> float:
        """How much better ``value`` is than ``over`` in ``mode``, as a fraction of ``over`` (negative: worse;
        ±inf when ``over`` is 0)."""
        better = value - over if self.mode == "max" else over - value
        return better / abs(over) if over else math.copysign(math.inf, better)

    def trail(self, stages: Stages, config: str) -> list[tuple[int, Score]]:
        """``config``'s score at each scale it was trained at, coarse to fine."""
        return [(scale, scores[config]) for scale, scores in self.by_scale(stages) if config in scores]


def _shown(value: object) -> str:
    """``value`` as the Python that sets it (an enum member as ``Class.NAME``)."""
    return f"{type(value).__name__}.{value.name}" if isinstance(value, Enum) else repr(value)
