"""Per-member early stopping: a Ray Tune trial scheduler that decides for members of fused trials.

Each member is fed to a real Ray scheduler instance (``ASHAScheduler``/``AsyncHyperBandScheduler``,
``MedianStoppingRule``) as a pseudo-trial: an object with the ``trial_id`` these schedulers read, the
member's id. Decisions are idempotent per (member, epoch), so a trial that is retried from a checkpoint
and reports an epoch again gets the decision it got the first time, and a stopped member stays stopped.
Schedulers that pause, clone or reallocate trials (HyperBand, PBT, ...) do not act on one member's metric
alone and are refused.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

SUPPORTED = (AsyncHyperBandScheduler, MedianStoppingRule)


@dataclass(frozen=True)
class MemberTrial:
    """What the wrapped schedulers read of a trial: its id (here a member id)."""

    trial_id: str


class _NoController:
    """Stands in for the Tune controller: members are never pending or paused."""

    @staticmethod
    def get_live_trials() -> list:
        return []


class MemberStopping:
    """Decides which members stop, by a Ray ``TrialScheduler`` fed one pseudo-trial per member.

    ``scheduler=None`` (or a ``FIFOScheduler``) never stops anyone. Results are dicts with the scheduler's
    ``time_attr`` (members report ``training_iteration`` and ``epoch``) and its metric.
    """

    def __init__(self, scheduler: TrialScheduler | None, metric: str, mode: str) -> None:
        if scheduler is not None and type(scheduler) is not FIFOScheduler and not isinstance(scheduler, SUPPORTED):
            raise TypeError(f"per-member scheduling supports ASHAScheduler/AsyncHyperBandScheduler and "
                            f"MedianStoppingRule (they act on one member's metric); got {type(scheduler).__name__}")
        self.scheduler = None if type(scheduler) is FIFOScheduler else scheduler
        if self.scheduler is not None:
            scheduler_metric = getattr(self.scheduler, "_metric", None)
            if scheduler_metric and scheduler_metric != metric:
                raise ValueError(f"the scheduler's metric {scheduler_metric!r} differs from the tuned metric "
                                 f"{metric!r}; leave the scheduler's metric and mode unset")
            self.scheduler.set_search_properties(metric, mode)
        self.decisions: dict[tuple[str, int], bool] = {}  # (member, epoch) -> stop
        self.stopped_at: dict[str, int] = {}
        self.finished: set[str] = set()
        self._known: set[str] = set()

    def decide(self, member_id: str, epoch: int, result: Mapping, final: bool = False) -> bool:
        """Whether ``member_id`` stops after ``epoch`` given its ``result`` (``final``: it ran its last epoch)."""
        if member_id in self.stopped_at and epoch >= self.stopped_at[member_id]:
            return True
        if (member_id, epoch) in self.decisions:
            return self.decisions[member_id, epoch]
        stop = False
        if self.scheduler is not None and member_id not in self.finished:
            trial = MemberTrial(member_id)
            if member_id not in self._known:
                self._known.add(member_id)
                self.scheduler.on_trial_add(_NoController(), trial)
            if final:
                self.scheduler.on_trial_complete(_NoController(), trial, dict(result))
                self.finished.add(member_id)
            else:
                stop = self.scheduler.on_trial_result(_NoController(), trial, dict(result)) == TrialScheduler.STOP
        self.decisions[member_id, epoch] = stop
        if stop:
            self.stopped_at[member_id] = epoch
        return stop

    def stopped(self) -> dict[str, int]:
        """Stopped members and the epoch they stopped after."""
        return dict(self.stopped_at)
