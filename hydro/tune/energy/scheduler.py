"""Ray Tune scheduler applying the energy decisions to tuning trials (the only Ray import here).

Trials measure themselves with :class:`hydro.energy.trial.TrialEnergy` (power limit profiled once
per (model, batch size) and reused through the store) and report cumulative ``cost`` (J) and a
``converged`` flag (target reached). The scheduler

* stops a trial once its cost passes β·(min cost of a converged trial of this job);
* records every finished trial of the job in the store, so recurring tuning jobs keep learning;
* with ``energy_tuned=True``, sets ``config[batch_size_key]`` of each new trial to the choice of a
  :class:`BatchSizeBandit` restored from the store.

The batch size is set in ``on_trial_add``, which Ray 2.60 calls after resolving the trial's config
and before its actor starts. Tune creates trials ahead of time: with the default
``BasicVariantGenerator`` up to 200 at once, so they are chosen from what was known when the run
started. To let the bandit learn within one run, create trials lazily: use a ``Searcher`` (Tune
then keeps one pending trial, or ``max_concurrent_trials``) or set ``TUNE_MAX_PENDING_TRIALS_PG=1``.

Hydro's own trials (``hydro tune --energy``, :func:`for_hydro`): the bandit's batch size goes to every member of
a new fused group (the batch size is a group key); the cost compared is ``member_epoch_cost`` (J per member per
epoch trained, so groups of any size and members stopped early compare); a fused trial converged when it ended
without being stopped by the bound. Only the search's trials are compared, stopped and recorded: the transfer
stages' trials (width-ladder rungs and full-size targets) are measured and reported but neither stopped nor recorded
here (their costs are not comparable with the search's, and a stopped rung or target would end the run without its
answer), and get no bandit choice: they train with the batch sizes their configurations were tuned with (the
searcher keeps the configuration each search member trained with).
"""
from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from hydro.energy.tuning import EnergySettings
from hydro.trial.plan import HYDRO_KEY, TrialKind, plan_of
from hydro.trial.spec import TuneSpec
from schedulers.energy.batch_size import BatchSizeBandit, Observation, min_converged_cost
from schedulers.energy.store import EnergyStore

HYDRO_COST_KEY = "member_epoch_cost"


class EnergyScheduler(FIFOScheduler):
    """FIFO scheduling plus the energy cost bound and (optionally) bandit-chosen batch sizes.

    ``job`` names the recurring tuning job in the store at ``store_path``. ``batch_sizes`` and
    ``default_batch_size`` are required with ``energy_tuned=True``. ``metered=False``: the trials report no cost
    (fill trials in pipeline bubbles share the stage's device, which has no meter per process): the bandit chooses
    each trial's batch size but learns nothing, no trial is stopped by the bound and nothing is recorded.
    """

    def __init__(
        self,
        *,
        job: str,
        store_path: str | os.PathLike[str],
        energy_tuned: bool = False,
        batch_sizes: Sequence[int] | None = None,
        default_batch_size: int | None = None,
        batch_size_key: str = "batch_size",
        cost_key: str = "cost",
        converged_key: str = "converged",
        beta: float = 2.0,
        seed: int | None = None,
        metered: bool = True,
    ) -> None:
        super().__init__()
        if energy_tuned and (not batch_sizes or default_batch_size is None):
            raise ValueError(f"EnergyScheduler: energy_tuned=True needs batch_sizes and default_batch_size for the "
                             f"bandit, got batch_sizes={batch_sizes!r}, default_batch_size={default_batch_size!r}")
        if not beta > 1:
            raise ValueError(f"EnergyScheduler: beta={beta} must be > 1 (trials stop at beta x the least cost)")
        self.job, self.beta, self.metered = job, beta, metered
        self.keys = {"batch_size": batch_size_key, "cost": cost_key, "converged": converged_key}
        self.store = EnergyStore(store_path)
        self._history = self.store.observations(job)
        self.bandit: BatchSizeBandit | None = None
        if energy_tuned:
            self.bandit = BatchSizeBandit(batch_sizes, default_batch_size, seed=seed, beta=beta)
            for o in self._history:
                if o.batch_size in self.bandit.batch_sizes:
                    self.bandit.observe(o.batch_size, o.cost, o.converged)
        self._assigned: dict[str, int] = {}
        self._stopped: set[str] = set()
        self._last_cost: dict[str, float] = {}

    @property
    def stop_cost(self) -> float | None:
        """β·(min cost of a converged trial of this job) in J, or None before one converged."""
        best = min_converged_cost(self._history)
        return None if best is None else self.beta * best

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        if self.bandit is None:
            return
        if _is_transfer_stage(trial.config):  # its configurations as the search trained them (the searcher's)
            return
        choice = self.bandit.choose()
        _set_batch_size(trial.config, self.keys["batch_size"], choice)
        self._assigned[trial.trial_id] = choice

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        if _is_transfer_stage(trial.config) or not self.metered:
            return TrialScheduler.CONTINUE
        cost = result.get(self.keys["cost"])
        if cost is None:
            raise KeyError(
                f"trial {trial.trial_id} reported no {self.keys['cost']!r}; report TrialEnergy.metrics() "
                f"with ray.tune.report, or set cost_key."
            )
        self._last_cost[trial.trial_id] = float(cost)
        bound = self.stop_cost
        if bound is not None and cost > bound and not result.get(self.keys["converged"], False):
            self._stopped.add(trial.trial_id)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE

    def _record(self, trial: Trial, cost: float, converged: bool) -> None:
        if not self.metered:  # no cost to learn from: the choice is no longer pending
            if trial.trial_id in self._assigned and self.bandit is not None:
                self.bandit.cancel(self._assigned.pop(trial.trial_id))
            return
        batch_size = _batch_size(trial.config, self.keys["batch_size"])
        if batch_size is None or _is_transfer_stage(trial.config):
            return
        obs = Observation(int(batch_size), cost, converged)
        self._history.append(obs)
        self.store.add_observation(self.job, obs, trial.trial_id)
        if self.bandit is not None and obs.batch_size in self.bandit.batch_sizes:
            self.bandit.observe(obs.batch_size, obs.cost, obs.converged)

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        cost = result.get(self.keys["cost"], self._last_cost.get(trial.trial_id, math.inf))
        # a Hydro trial that ended on its own (last epoch, or every member stopped) converged
        converged = bool(result.get(self.keys["converged"], HYDRO_KEY in trial.config))
        converged = converged and trial.trial_id not in self._stopped
        self._record(trial, float(cost), converged)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self._record(trial, self._last_cost.get(trial.trial_id, math.inf), False)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        if trial.trial_id in self._last_cost:  # it ran: a stopped run, not converged
            self._record(trial, self._last_cost[trial.trial_id], False)
        elif trial.trial_id in self._assigned and self.bandit is not None:  # never started
            self.bandit.cancel(self._assigned[trial.trial_id])

    def debug_string(self) -> str:
        bound = self.stop_cost
        phase = "" if self.bandit is None else f", bandit {'pruning' if self.bandit.pruning else 'sampling'} arms {self.bandit.arms}"
        return f"EnergyScheduler(job={self.job}, stop cost {bound if bound is None else round(bound)} J{phase})."


def _is_transfer_stage(config: Mapping) -> bool:
    """A trial of a transfer stage after the search: a full-size target or a ladder rung (surrogates that read
    only their final scores)."""
    if HYDRO_KEY not in config:
        return False
    plan = plan_of(config)
    return plan.kind == TrialKind.TARGET or (plan.kind == TrialKind.SURROGATE and plan.final_score_only)


def _set_batch_size(config: dict, key: str, batch_size: int) -> None:
    """Set the trial's batch size: ``config[key]`` of a plain trial, and every member's of a Hydro search trial
    (whose members train from the plan's configurations)."""
    if HYDRO_KEY in config:
        for _, member_config in plan_of(config).members:
            member_config[key] = batch_size
    else:
        config[key] = batch_size


def _batch_size(config: Mapping, key: str) -> int | None:
    if HYDRO_KEY in config:
        return plan_of(config).members[0][1].get(key)
    return config.get(key)


def check_batch_sizes(settings: EnergySettings, spec: TuneSpec) -> list[int]:
    """The bandit's batch sizes, sorted; ``ValueError`` when they leave out the workload's own (its start)."""
    sizes = sorted(set(settings.batch_sizes))
    if sizes and spec.batch_size not in sizes:
        raise ValueError(f"hydro tune --energy: the workload's batch size {spec.batch_size} is not among the bandit's "
                         f"batch sizes {sizes}; add it to --energy-batch-sizes")
    return sizes


def for_hydro(settings: EnergySettings, spec: TuneSpec, seed: int | None = None,
              metered: bool = True) -> EnergyScheduler:
    """The scheduler of ``hydro tune --energy``: Hydro trials, cost per member-epoch, the bandit over
    ``settings.batch_sizes`` (off if empty) starting from ``spec.batch_size``; ``metered=False`` for fill trials
    in pipeline bubbles (see :class:`EnergyScheduler`)."""
    sizes = check_batch_sizes(settings, spec)
    return EnergyScheduler(job=settings.job, store_path=settings.store_path, energy_tuned=bool(sizes),
                           batch_sizes=sizes or None, default_batch_size=spec.batch_size if sizes else None,
                           cost_key=HYDRO_COST_KEY, beta=settings.beta, seed=seed, metered=metered)
