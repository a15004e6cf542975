"""Which width divisor S a search's surrogates train at when the user lets Hydro choose (``scale="auto"``), from
measured step times (plain Python).

Narrower surrogates rank configurations less faithfully, while on a small model a narrower surrogate barely trains
faster: its step is mostly fixed cost (kernel launches, the optimizer's loop, Python), not the width² work that
shrinking removes. So the choice is the *finest* scale whose fused training step costs at most ``max_cost`` times the
coarsest one's. The measurements behind the constants: ``docs/design/scale-choice.md``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from schedulers.member_stopping import score
from schedulers.transfer import AUTO, MIN_ESCALATION_SCALE, rank_check

AUTO_SCALES = (8, 4, 2)  # the candidates, coarse to fine
# A finer scale's step may cost up to this many times the coarsest's. A step takes fixed cost + work ∝ width²:
# halving the width from S=8 multiplies the step by 4 - 3f, f the fixed share of the S=8 step, so S=4 within 2.5x
# means at least half of the S=8 step is fixed cost.
MAX_COST = 2.5
# Rounds of timings: the second times the scales of the first again, in the same order, and each keeps its faster
# timing, so a stretch of load (other processes on shared cores) slows one timing of a scale, not its ratio to the
# others.
ROUNDS = 2


@dataclass(frozen=True)
class ScaleChoice:
    """``scale``: the chosen S; ``step_s``: seconds per fused training step measured at each candidate scale
    (coarse to fine, as far as measuring went); ``skipped``: candidate scales the model cannot be shrunk to,
    with why; ``reason``: the choice in words, for the log."""

    scale: int
    step_s: dict[int, float]
    skipped: dict[int, str] = field(default_factory=dict)
    reason: str = ""


def checked_scale(scale: int | str) -> int:
    """The scale to check a search's options at before it is known: ``scale``, or with :data:`AUTO` the
    coarsest candidate (every candidate is shrunk, so the options valid there are valid at the choice)."""
    return AUTO_SCALES[0] if scale == AUTO else scale


class CannotShrink(ValueError):
    """Raised by a step-time measurement: the model cannot be shrunk to that scale (the scale is skipped)."""


class NoScale(ValueError):
    """No candidate scale could be measured (the model cannot be shrunk to any of them)."""


def choose_scale(step_seconds: Callable[[int], float], scales: Sequence[int] = AUTO_SCALES,
                 max_cost: float = MAX_COST, rounds: int = ROUNDS) -> ScaleChoice:
    """The finest of ``scales`` whose step costs at most ``max_cost`` times the coarsest measurable one's.

    Scales are measured coarse to fine, stopping at the first one over the budget (finer ones cost more), then
    ``rounds`` - 1 more times over the same scales; a scale's time is its fastest.

    Args:
        step_seconds: ``step_seconds(scale)`` measures one fused training step at ``scale`` and returns its
            seconds (> 0); it raises :class:`CannotShrink` when the model cannot be shrunk to ``scale`` (the scale
            is skipped and not asked again).
        scales: candidate width divisors, distinct ints >= 1, coarse to fine.
        max_cost: the budget as a multiple of the coarsest measured scale's step (>= 1).
        rounds: timing rounds (int >= 1).

    Returns:
        The :class:`ScaleChoice`: the chosen scale, each measured scale's step seconds, the skipped scales and
        the reason in words.

    Raises:
        ValueError: bad ``scales``, ``max_cost`` or ``rounds``, or a measured step time that is not > 0.
        NoScale: no scale could be measured.
    """
    if not scales or list(scales) != sorted(set(scales), reverse=True) or min(scales) < 1:
        raise ValueError(f"choose_scale: scales must be distinct ints >= 1, coarse to fine, got {list(scales)}")
    if not max_cost >= 1:
        raise ValueError(f"choose_scale: max_cost must be >= 1 (the coarsest scale's own cost), got {max_cost!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"choose_scale: rounds must be an int >= 1, got {rounds!r}")
    measured: dict[int, float] = {}
    skipped: dict[int, str] = {}
    for scale in scales:  # the first round decides which scales are timed
        try:
            seconds = _timed(step_seconds, scale)
        except CannotShrink as error:
            skipped[scale] = str(error)
            continue
        measured[scale] = seconds
        if seconds > max_cost * next(iter(measured.values())):
            break
    for _ in range(rounds - 1):
        for scale in measured:
            measured[scale] = min(measured[scale], _timed(step_seconds, scale))
    if not measured:
        raise NoScale("hydro: scale='auto' could not shrink the model to any of S=" + ", ".join(map(str, scales))
                      + ": " + "; ".join(f"S={s}: {why}" for s, why in skipped.items())
                      + ". Fix: pass a scale the model can be shrunk to, or scale=1 (full size)")
    coarsest = next(iter(measured))
    budget = max_cost * measured[coarsest]
    chosen = [s for s, t in measured.items() if t <= budget][-1]
    steps = ", ".join(f"S={s} {1e3 * t:.3g} ms" for s, t in measured.items())
    over = [s for s, t in measured.items() if t > budget]
    reason = (f"S={over[0]}'s step costs {measured[over[0]] / measured[coarsest]:.2f}x the S={coarsest} one's, "
              f"more than {max_cost:g}x" if over else
              f"the finest scale measured costs at most {max_cost:g}x the S={coarsest} step") + f" ({steps})"
    if skipped:
        reason += "; cannot shrink to " + ", ".join(f"S={s}" for s in skipped)
    return ScaleChoice(chosen, measured, skipped, reason)


def _timed(step_seconds: Callable[[int], float], scale: int) -> float:
    seconds = step_seconds(scale)
    if not seconds > 0:
        raise ValueError(f"choose_scale: a step at S={scale} measured {seconds!r} s; a step time is > 0")
    return seconds


def auto_scales(early_stopping: bool) -> tuple[int, ...]:
    """The candidates of ``scale="auto"``: :data:`AUTO_SCALES`, or with per-member early stopping in the search only
    those whose first rung's transfer check can escalate (S/2 >= ``MIN_ESCALATION_SCALE``): early stopping ranks the
    configurations it stops by their early epochs, and below them nothing after the search checks that ranking (the
    measurements: ``docs/design/scale-choice.md``). The search's surrogates there need no pilot: the escalation is
    their check."""
    return tuple(s for s in AUTO_SCALES if s // 2 >= MIN_ESCALATION_SCALE) if early_stopping else AUTO_SCALES


# The pilot: before the search, a few configurations train at the chosen scale S and at S/2 for a share of the
# epochs; when their rankings disagree confidently, S is too narrow to rank the workload and the search trains at
# S/2. Only where S/2 is a scale escalation would rank at (S >= 8): finer choices are already the fine ones.
PILOT_CONFIGS = 6  # configurations the pilot trains at each of its two scales
PILOT_EPOCH_SHARE = 3  # the pilot trains 1/3 of the search's epochs (at least one)


@dataclass(frozen=True)
class Pilot:
    """``configs`` configurations trained at ``coarse`` (the scale chosen from step times) and at ``fine``
    (``coarse // 2``), each for ``epochs`` of the search's ``search_epochs``."""

    coarse: int
    fine: int
    configs: int
    epochs: int
    search_epochs: int

    @classmethod
    def plan(cls, scale: int, num_samples: int, epochs: int, configs: int = PILOT_CONFIGS,
             epoch_share: int = PILOT_EPOCH_SHARE) -> Pilot | None:
        """The pilot of a search of ``num_samples`` configurations at ``scale``, ``epochs`` each: ``configs`` of
        them for ``epochs // epoch_share`` epochs (at least one); ``None`` where ``scale // 2`` is below
        :data:`~schedulers.transfer.MIN_ESCALATION_SCALE` or the search has fewer configurations than the pilot
        would train."""
        if scale // 2 < MIN_ESCALATION_SCALE or num_samples < configs:
            return None
        return cls(scale, scale // 2, configs, max(1, epochs // epoch_share), epochs)

    def cost(self) -> float:
        """Full-size trainings the pilot costs, a member's compute taken as proportional to width²."""
        return self.configs * (1 / self.coarse ** 2 + 1 / self.fine ** 2) * self.epochs / self.search_epochs

    def describe(self) -> str:
        """The pilot and its cost, to show before it runs."""
        return (f"pilot: {self.configs} configurations at S={self.coarse} and S={self.fine} for {self.epochs} of "
                f"{self.search_epochs} epochs, about {self.cost():.2f} full-size trainings")

    def decide(self, choice: ScaleChoice, coarse: Mapping[str, float], fine: Mapping[str, float], mode: str,
               min_agreement: float = 0.5) -> ScaleChoice:
        """``choice`` kept, or moved to :attr:`fine` when the pilot's rankings at the two scales disagree: the
        Spearman rho of the configurations scored at both (``coarse``, ``fine``: config id -> final value of the
        metric optimised in ``mode``, NaN the worst) has a one-sided 95% upper bound below ``min_agreement``."""
        common = [c for c in coarse if c in fine]
        check = rank_check(self.coarse, [score(coarse[c], mode) for c in common],
                           self.fine, [score(fine[c], mode) for c in common], min_agreement)
        words = (f"{self.describe()}: Spearman {check.rho:.2f} over {check.configs} (95% upper bound "
                 f"{check.upper:.2f})")
        if not check.low:
            return replace(choice, reason=f"{choice.reason}; {words}, S={self.coarse} ranks")
        return replace(choice, scale=self.fine,
                       reason=f"{choice.reason}; {words}, below {min_agreement:g}: S={self.coarse} is too narrow to "
                              f"rank, the search trains at S={self.fine}")
