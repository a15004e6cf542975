"""Ray Tune schedulers given for per-member stopping, translated into Hydro's plain-Python rules.

``HydroSearcher(scheduler=...)`` takes a rule of :mod:`schedulers.member_stopping` (``ASHA``,
``MedianStopping``) or the Ray scheduler a Tune user already knows: ``ASHAScheduler``/``AsyncHyperBandScheduler``
and ``MedianStoppingRule`` act on one trial's metric at a time, so they become the same rule applied per member.
Ray keeps their settings in private attributes, read here once; ``tests/tune/test_member_rules.py`` checks that
the translated rule decides exactly as the Ray scheduler does.
"""
from __future__ import annotations

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

from schedulers.member_stopping import ASHA, MedianStopping, StoppingRule

EPOCH_ATTRS = ("training_iteration", "epoch")  # what a member's time counts: its epochs


def refuse_trial_scheduler(scheduler: TrialScheduler | None) -> None:
    """Refuse a Ray Tune scheduler given to Tune itself (``TuneConfig(scheduler=...)``) in a ``HydroSearcher``
    run: Ray's ASHA, HyperBand, median stopping and PBT compare whole fused trials, whose trial-level objective is
    not a member's, so they would stop nothing (or every member of a trial at once). Ray's ``FIFOScheduler`` and
    Hydro's schedulers (which only place or cost trials; one wrapping a ``base`` is checked through it) pass."""
    node = scheduler
    while node is not None and type(node) is not FIFOScheduler:
        if type(node).__module__.startswith("ray.tune.schedulers"):
            name = type(node).__name__
            fix = (f"pass it as HydroSearcher(..., scheduler={name}(...)) and leave TuneConfig.scheduler unset: Hydro "
                   f"applies it to each member" if isinstance(node, (AsyncHyperBandScheduler, MedianStoppingRule))
                   else "per-member stopping takes ASHAScheduler or MedianStoppingRule as HydroSearcher(scheduler=...)")
            raise ValueError(f"hydro: TuneConfig(scheduler={name}(...)) with a HydroSearcher would compare whole fused "
                             f"trials, not members, and stop nothing; {fix}")
        node = getattr(node, "base", None)


def stopping_rule(scheduler: StoppingRule | TrialScheduler | None, metric: str) -> StoppingRule | None:
    """The per-member rule for ``scheduler`` (``None`` or a ``FIFOScheduler``: no stopping); ``metric`` is the
    tuned metric, which a Ray scheduler must not name differently."""
    if scheduler is None or type(scheduler) is FIFOScheduler or isinstance(scheduler, StoppingRule):
        return scheduler if isinstance(scheduler, StoppingRule) else None
    if not isinstance(scheduler, (AsyncHyperBandScheduler, MedianStoppingRule)):
        raise TypeError(f"per-member stopping supports ASHAScheduler/AsyncHyperBandScheduler and MedianStoppingRule "
                        f"(or hydro's schedulers.member_stopping rules), which act on one member's metric; got "
                        f"{type(scheduler).__name__}, which pauses, clones or compares whole trials")
    own_metric = getattr(scheduler, "_metric", None)
    if own_metric and own_metric != metric:
        raise ValueError(f"the scheduler's metric {own_metric!r} differs from the tuned metric {metric!r}; leave the "
                         f"scheduler's metric and mode unset (HydroSearcher passes TuneSpec.metric and mode)")
    if scheduler._time_attr not in EPOCH_ATTRS:
        raise ValueError(f"per-member stopping counts epochs: give the scheduler time_attr='training_iteration' "
                         f"(got {scheduler._time_attr!r})")
    if isinstance(scheduler, MedianStoppingRule):
        if not scheduler._hard_stop:
            raise ValueError("MedianStoppingRule(hard_stop=False) pauses trials; members can only stop: use "
                             "hard_stop=True")
        return MedianStopping(grace_period=scheduler._grace_period,
                              min_samples_required=scheduler._min_samples_required)
    first = scheduler._brackets[0]
    return ASHA(max_t=scheduler._max_t, grace_period=first._rungs[-1][0], reduction_factor=scheduler._reduction_factor,
                brackets=len(scheduler._brackets), stop_last_trials=first._stop_last_trials)
