"""Per-member early stopping in plain Python: rules that decide whether one member of a fused trial stops
after an epoch, and the record that makes their decisions idempotent.

Rules see *scores*: the member's objective signed so that higher is better, with NaN and ±inf mapped to
``-inf`` (a diverged member is the worst member, whatever the metric and mode). They implement the same
algorithms as Ray Tune's ``ASHAScheduler`` and ``MedianStoppingRule`` (``hydro.tune.search.member_rules`` translates
those), keyed by member id instead of trial.
"""
from __future__ import annotations

import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field


class StoppingRule(ABC):
    """Decides, from one member's score after an epoch and what it has seen of the others, whether the
    member stops. ``on_result`` may record the score; it is called at most once per (member, epoch)."""

    @abstractmethod
    def on_result(self, member: str, epoch: int, score: float) -> bool:
        """Whether ``member`` stops after ``epoch`` with ``score`` (higher is better; ``-inf``: diverged)."""

    def on_complete(self, member: str, epoch: int, score: float) -> None:
        """``member`` ran its last epoch with ``score`` (default: nothing to record)."""


def score(value: float, mode: str) -> float:
    """``value`` of a metric optimised in ``mode`` (``"min"``/``"max"``) as a score: higher is better, and
    NaN or ±inf is ``-inf``, the worst."""
    if not math.isfinite(value):
        return -math.inf
    return value if mode == "max" else -value


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation (numpy's default); an
    interpolation that touches ``-inf`` is ``-inf``."""
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    if fraction == 0 or ordered[low] == ordered[high] or ordered[low] == -math.inf:
        return ordered[low]
    return ordered[low] + fraction * (ordered[high] - ordered[low])


@dataclass
class _Rung:
    milestone: float
    recorded: dict[str, float] = field(default_factory=dict)


class _Bracket:
    """One bracket of asynchronous successive halving: rungs at ``min_t * rf ** (k + s)`` epochs; a member
    reaching a rung stops if its score is below the ``1 - 1/rf`` quantile of the scores recorded there."""

    def __init__(self, min_t: float, max_t: float, reduction_factor: float, s: int, stop_last_trials: bool) -> None:
        self.rf, self.stop_last_trials = reduction_factor, stop_last_trials
        count = int(math.log(max_t / min_t) / math.log(reduction_factor) - s + 1)
        self.rungs = [_Rung(min_t * reduction_factor ** (k + s)) for k in reversed(range(count))]  # highest first

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        for rung in self.rungs:
            if epoch >= rung.milestone and member in rung.recorded and not self.stop_last_trials:
                break
            if epoch < rung.milestone or member in rung.recorded:
                continue
            stop = bool(rung.recorded) and score < percentile(list(rung.recorded.values()), (1 - 1 / self.rf) * 100)
            rung.recorded[member] = score
            return stop
        return False


class ASHA(StoppingRule):
    """Asynchronous successive halving (Li et al., as Ray Tune's ``ASHAScheduler``) over epochs.

    ``max_t``: epochs after which every member stops; ``grace_period``: epochs before the first rung;
    ``reduction_factor``: 1/rf of the members at a rung go on; ``brackets``: several brackets with later
    first rungs, a member's bracket drawn from its id (deterministic, with Ray's bracket weights).
    """

    def __init__(self, max_t: int = 100, grace_period: int = 1, reduction_factor: float = 4, brackets: int = 1,
                 stop_last_trials: bool = True) -> None:
        if grace_period < 1 or max_t < grace_period:
            raise ValueError(f"ASHA needs 1 <= grace_period <= max_t, got grace_period={grace_period}, max_t={max_t}")
        if reduction_factor <= 1:
            raise ValueError(f"ASHA reduction_factor must be > 1, got {reduction_factor}")
        if brackets < 1:
            raise ValueError(f"ASHA brackets must be >= 1, got {brackets}")
        self.max_t, self.stop_last_trials = max_t, stop_last_trials
        self.brackets = [_Bracket(grace_period, max_t, reduction_factor, s, stop_last_trials) for s in range(brackets)]
        sizes = [len(b.rungs) for b in self.brackets]
        weights = [math.exp(n - max(sizes)) for n in sizes]
        self._cumulative = [sum(weights[: i + 1]) / sum(weights) for i in range(len(weights))]

    def bracket_of(self, member: str) -> _Bracket:
        """The member's bracket: a draw from its id against the brackets' cumulative weights."""
        draw = zlib.crc32(member.encode()) / 2**32
        index = sum(draw >= c for c in self._cumulative[:-1])
        return self.brackets[index]

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        if epoch >= self.max_t and self.stop_last_trials:
            return True
        return self.bracket_of(member).on_result(member, epoch, score)

    def on_complete(self, member: str, epoch: int, score: float) -> None:
        self.bracket_of(member).on_result(member, epoch, score)


class MedianStopping(StoppingRule):
    """Stop a member whose best score so far is below the median of the other members' mean scores over
    epochs ``grace_period..epoch`` (as Ray Tune's ``MedianStoppingRule`` with ``hard_stop=True``), once at
    least ``min_samples_required`` others with a finite mean have reached that epoch."""

    def __init__(self, grace_period: int = 1, min_samples_required: int = 3) -> None:
        if min_samples_required < 1:
            raise ValueError(f"min_samples_required must be >= 1, got {min_samples_required}")
        self.grace_period, self.min_samples_required = grace_period, min_samples_required
        self.history: dict[str, list[tuple[int, float]]] = {}

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        self.history.setdefault(member, []).append((epoch, score))
        if epoch < self.grace_period:
            return False
        others = [self._mean(r, epoch) for m, r in self.history.items() if m != member and r[-1][0] >= epoch]
        means = [m for m in others if math.isfinite(m)]
        if len(means) < self.min_samples_required:
            return False
        means.sort()
        middle = len(means) // 2
        median = means[middle] if len(means) % 2 else (means[middle - 1] + means[middle]) / 2
        return max(s for _, s in self.history[member]) < median

    def on_complete(self, member: str, epoch: int, score: float) -> None:
        self.history.setdefault(member, []).append((epoch, score))

    def _mean(self, results: list[tuple[int, float]], epoch: int) -> float:
        scoped = [s for t, s in results if self.grace_period <= t <= epoch]
        return sum(scoped) / len(scoped) if scoped else math.nan


class MemberStopping:
    """Applies a :class:`StoppingRule` (``None``: never stop) to members' objective values in ``mode``.

    Decisions are idempotent per (member, epoch): a trial retried from a checkpoint that reports an epoch again
    gets the decision it got the first time (the rule is not fed twice), and a stopped member stays stopped.
    """

    def __init__(self, rule: StoppingRule | None, mode: str) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.rule, self.mode = rule, mode
        self.decisions: dict[tuple[str, int], bool] = {}
        self.stopped_at: dict[str, int] = {}
        self.finished: set[str] = set()

    def decide(self, member: str, epoch: int, value: float, final: bool = False) -> bool:
        """Whether ``member`` stops after ``epoch`` with objective ``value`` (``final``: its last epoch)."""
        if member in self.stopped_at and epoch >= self.stopped_at[member]:
            return True
        if (member, epoch) in self.decisions:
            return self.decisions[member, epoch]
        stop = False
        if self.rule is not None and member not in self.finished:
            if final:
                self.rule.on_complete(member, epoch, score(value, self.mode))
                self.finished.add(member)
            else:
                stop = self.rule.on_result(member, epoch, score(value, self.mode))
        self.decisions[member, epoch] = stop
        if stop:
            self.stopped_at[member] = epoch
        return stop

    def stopped(self) -> dict[str, int]:
        """Stopped members and the epoch they stopped after."""
        return dict(self.stopped_at)


class ConvergenceStopping(StoppingRule):
    """Stop a member whose predicted score at ``max_t`` cannot beat the best score seen so far (Optimus's curve
    ``1/(β0·k + β1) + β2`` fitted to its scores, :func:`schedulers.prediction.convergence.fit_curve`).

    From ``grace_period`` epochs on (at least 3), the member's curve predicts its score at ``max_t`` with a
    standard deviation (bootstrap noise and the curve family's own error); it stops when even
    ``prediction + z·std`` is below the best score any member has reached (``margin`` more, in score units,
    makes it stop only clear losers). A diverged member
    (``-inf``) stops once any member has a finite score; every member stops at ``max_t``.
    """

    def __init__(self, max_t: int, grace_period: int = 3, z: float = 2.0, margin: float = 0.0,
                 bootstrap: int = 20) -> None:
        if grace_period < 3 or max_t < grace_period:
            raise ValueError(f"ConvergenceStopping needs 3 <= grace_period <= max_t (a curve needs 3 points), got "
                             f"grace_period={grace_period}, max_t={max_t}")
        if z < 0 or margin < 0:
            raise ValueError(f"ConvergenceStopping z and margin must be >= 0, got z={z}, margin={margin}")
        self.max_t, self.grace_period, self.z, self.margin, self.bootstrap = max_t, grace_period, z, margin, bootstrap
        self.history: dict[str, list[tuple[int, float]]] = {}
        self.best = -math.inf
        self.predictions: dict[str, tuple[float, float]] = {}  # member -> (predicted final score, std), last fit

    def on_result(self, member: str, epoch: int, score: float) -> bool:
        from schedulers.prediction.convergence import fit_curve  # numpy/scipy: only when this rule is used

        history = self.history.setdefault(member, [])
        history.append((epoch, score))
        best_before, self.best = self.best, max(self.best, score)
        if epoch >= self.max_t:
            return True
        if score == -math.inf:
            return best_before > -math.inf
        if epoch < self.grace_period or any(s == -math.inf for _, s in history):
            return False
        epochs, scores = zip(*history)
        fit = fit_curve(epochs, [-s for s in scores], bootstrap=self.bootstrap, seed=len(history))
        final = fit.value(self.max_t)
        self.predictions[member] = (-final.value, final.std)
        return -final.value + self.z * final.std + self.margin < best_before

    def on_complete(self, member: str, epoch: int, score: float) -> None:
        self.history.setdefault(member, []).append((epoch, score))
        self.best = max(self.best, score)
