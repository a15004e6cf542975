"""``HydroSearcher``: a Ray Tune ``Searcher`` that turns an inner searcher's configurations into fused trials.

Each Ray trial is one fused group of up to F members (configurations). A thin adapter, as Ray's
``ConcurrencyLimiter`` wraps a searcher, over the plain-Python search driver (:mod:`schedulers.search_driver`:
the member pool, the member ledger and the transfer stages — seed repeats, a width ladder, top-k full-size
targets, fidelity escalation, fallback targets after a regressed one) and a fusion planner
(:mod:`hydro.trial.fusion`): it turns the driver's trials into Tune configurations, tells the inner searcher what
its configurations did, asks Ray for the cluster's compute, and saves and restores. The run's best result is the
best target's: the best configurations at full size, in µP when the members were shrunk.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import pickle
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import ray
from ray.tune import PlacementGroupFactory
from ray.tune.registry import get_trainable_cls
from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher
from ray.tune.search.sample import Domain

from hydro.checks import is_count
from hydro.trial.check import check_group_by, check_member
from hydro.trial.fusion import FixedFusion, FusionPlanner, MeasuredFusion
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan, plan_of, reported_plan
from hydro.trial.data import DataSource
from hydro.trial.scale_plan import measured_scale, piloted_scale
from hydro.trial.spec import TuneSpec
from hydro.tune.placement.trial_merging import TrialMerging
from hydro.tune.placement.trial_placement import TrialPlacement, check_placement
from hydro.tune.search.member_decisions import start_service
from hydro.tune.search.member_rules import refuse_trial_scheduler, stopping_rule
from hydro.tune.search.random_search import RandomSearch
from hydro.tune.cluster.ray_internals import tune_run_locals
from hydro.tune.cluster.worker_env import passive_openmp
from hydro.tune.search.run_reporter import attach
from hydro.tune.search.session import ERROR_KEY, MEMBERS_KEY, TRIAL_CPUS_KEY, TRIAL_GPUS_KEY
from hydro.tune.search.space_check import check_batch_size_space, other_values
from schedulers.member_ledger import EventKind, MemberEvent
from schedulers.member_pool import MemberPool, Suggestion
from schedulers.member_stopping import MemberStopping, StoppingRule
from schedulers.scale_choice import (AUTO, AUTO_SCALES, PILOT_CONFIGS, NoScale, ScaleChoice, auto_scales,
                                     checked_scale)
from schedulers.search_driver import DriverState, SearchDriver, Stage, StageRun
from schedulers.transfer import MIN_ESCALATION_SCALE, TransferPolicy
from schedulers.trial_slots import trial_slots, whole_round_counts

logger = logging.getLogger(__name__)

_SET_BY_SEARCHER = {"fraction", "num_samples", "metric", "mode", "scale", "slots", "epochs"}  # not in **transfer


@dataclass
class SearchState:
    """What a ``HydroSearcher`` holds apart from its driver's state and the inner searcher (saved with them) and
    the workload: what ``save``/``restore`` write."""

    stopping: MemberStopping | None
    service_name: str
    space: dict
    rejected: dict[str, tuple[dict, str]] = field(default_factory=dict)  # member -> (config, why)
    trial_request: dict[str, float] = field(default_factory=dict)  # one trial's Ray resources: given, or reported
    max_concurrent: int | None = None  # Tune's max_concurrent_trials (set_max_concurrency)
    scale_choice: ScaleChoice | None = None  # scale="auto": the measured choice, once made
    suggested: dict[str, dict] = field(default_factory=dict)  # trial id -> the config it was given (while it runs)
    lost: list[tuple[str, dict]] = field(default_factory=list)  # lost trials to train again: (trial id, config)
    retries: dict[str, int] = field(default_factory=dict)  # trial id -> fresh trials its members had after a loss


class HydroSearcher(Searcher):
    """A Ray Tune ``Searcher`` that trains an inner searcher's configurations as fused surrogate trials, then the
    transfer stages, and ends the run (use it with ``TuneConfig(num_samples=-1)``).

    Args:
        spec: the workload.
        searcher: the inner Ray ``Searcher`` that suggests member configurations; each member's results reach it
            as its own trial. ``None``: random/grid sampling of the param space (seeded by ``seed``).
        num_samples: member configurations to draw.
        scale: the surrogates' width divisor S (int >= 1; 1: full-size members), or ``"auto"``: the finest of
            S=8, 4, 2 whose fused training step costs at most 2.5 times the S=8 one's, measured on this process's
            device before the first trial (:func:`~hydro.trial.scale_plan.measured_scale`), a choice of S=8
            checked by a pilot against S=4 (:func:`~hydro.trial.scale_plan.piloted_scale`); :attr:`scale` is then
            the chosen S and :attr:`scale_choice` the measurements.
        fusion: members per fused trial (int), ``"auto"`` (measured per group with ``hydro.plan_fusion``), or a
            :class:`~hydro.trial.fusion.FusionPlanner`; any of them at most an even share of ``num_samples`` per
            trial slot once the slots are known.
        max_fusion: the most members in one fused trial.
        scheduler: per-member early stopping: a :class:`~schedulers.member_stopping.StoppingRule`, or Ray's
            ``ASHAScheduler``/``AsyncHyperBandScheduler``/``MedianStoppingRule`` with metric and mode unset.
        transfer_fraction: share of the members that must have finished before the transfer stages start, in
            (0, 1]; ``None``: no stages and no target.
        seed: seed of the default random search.
        data: the ``spec.load_data()`` the driver already loaded, to plan fusion and measure scales with
            (default: loaded when needed).
        trial_cpus: CPUs (torch threads) each trial trains with; ``plan_fusion`` measures with as many.
        trial_resources: one trial's Ray resources as its trainable asks for them (e.g. ``{"CPU": 1, "GPU":
            0.5}``; ``fit`` passes them). ``None``: in a ``tune.Tuner`` run, read from its trainable's resource
            request (Tune's default for a function trainable: 1 CPU); ``{}``: unknown until the first trials report
            theirs. Trial slots, the trials that train at once on separate compute, are counted from them
            (:func:`~schedulers.trial_slots.trial_slots`, at most Tune's ``max_concurrent_trials``).
        lost_trial_retries: fresh trials a trial gets when Tune gave up on it (its worker, node or storage lost
            more often than ``FailureConfig(max_failures)`` allows): the same members and configuration trained
            again from the start, so that no stage goes on without them (``fit`` sets it to its ``max_failures``).
        run_reporter: in a ``tune.Tuner`` run, do what ``fit`` does around its run (``fit`` passes ``False``):
            refuse a key outside ``TuneSpec.group_by`` that changes the model before the first trial, and add a
            :class:`~hydro.tune.search.run_reporter.RunReporter` (member progress; the member table, best
            configuration and trained model written to the run directory at the end).
        placement: ``"elastic"``: each trial goes to the GPU type of the cluster's nodes on which it is predicted to
            finish first (:class:`~hydro.tune.placement.trial_placement.TrialPlacement`; its config asks for that
            type), and search trials of one fused group merge their surviving members into one trial when that
            frees a GPU (:class:`~hydro.tune.placement.trial_merging.TrialMerging`, :attr:`merging`: its rule and
            the merges made); a :class:`~hydro.tune.placement.trial_placement.TrialPlacement` of this run's
            (``fit``'s, with energy or bubbles: with bubbles only targets are placed and nothing merges); ``None``:
            Ray's resource request alone.
        **transfer: the options of :class:`~schedulers.transfer.TransferPolicy` (``ladder``, ``halving``, ``eta``,
            ``top_k``, ``seeds``, ``min_agreement``, ``max_target_drop``, ``escalate``, ``disagreement``, ``probes``,
            ``probe_margin``, ``fallback_targets``): the width ladder, full-size targets, escalation and fallback
            targets after the search.

    The run's best result is the best full-size target's (µP when the members were shrunk). The run logs the
    stages' cost before they start, the returned configuration's score at each scale and the transfer check.

    Raises:
        ValueError: a bad ``scale``, ``trial_cpus`` or ``trial_resources``; a transfer option out of range, or one
            other than ``seeds`` set away from its default where it cannot act (``scale`` 1 or
            ``transfer_fraction=None``); a ``scheduler`` whose settings cannot act per member (its own metric,
            a ``time_attr`` other than epochs, ``MedianStoppingRule(hard_stop=False)``); a non-integer batch size
            in the param space.
        TypeError: ``searcher`` is not a Ray ``Searcher``; a ``scheduler`` of another kind; an unknown transfer
            option.
    """

    def __init__(self, spec: TuneSpec, searcher: Searcher | None = None, *, num_samples: int, scale: int | str = 1,
                 fusion: int | str | FusionPlanner = "auto", max_fusion: int = 64,
                 scheduler: StoppingRule | TrialScheduler | None = None, transfer_fraction: float | None = 1.0,
                 seed: int | None = None, data: tuple[DataSource, DataSource] | None = None, trial_cpus: int = 1,
                 trial_resources: Mapping[str, float] | None = None, lost_trial_retries: int = 1,
                 run_reporter: bool = True, placement: str | TrialPlacement | None = None, **transfer) -> None:
        super().__init__(metric=spec.metric, mode=spec.mode)
        _check_arguments(searcher, scale, trial_cpus, trial_resources, lost_trial_retries, transfer)
        self.spec, self.trial_cpus, self._data, self._auto = spec, trial_cpus, data, scale == AUTO
        self.lost_trial_retries = lost_trial_retries
        self._planner = (None if fusion == "auto" else fusion if isinstance(fusion, FusionPlanner)
                         else FixedFusion(fusion))
        policy = TransferPolicy(transfer_fraction, num_samples, spec.metric, spec.mode, scale=checked_scale(scale),
                                **transfer)
        self.driver = SearchDriver(policy, MemberPool(num_samples, max_fusion), spec.metric, spec.epochs,
                                   spec.group_key, logger)
        rule = stopping_rule(scheduler, spec.metric)
        self.inner = searcher if searcher is not None else RandomSearch(seed=seed)
        self.state = SearchState(MemberStopping(rule, spec.mode) if rule is not None else None,
                                 f"hydro-member-decisions-{uuid.uuid4().hex[:12]}", {},
                                 trial_request={k.upper(): float(v) for k, v in (trial_resources or {}).items()})
        self._service, self._cluster, self._scheduler_checked = None, _RayCluster(self), False
        self._run_reporter, self._learn_resources = run_reporter, trial_resources is None
        if isinstance(placement, str):
            check_placement(placement, spec, self._loaded_data())  # loaded once, for the placement's work too
            placement = TrialPlacement(spec, self._data)
        self.placement = placement
        self.merging = (TrialMerging(placement, spec.epochs, f"hydro-merges-{uuid.uuid4().hex[:12]}")
                        if placement is not None and not placement.bubbles else None)
        if not self._auto:
            self._warn_unchecked_stopping()

    # --- Ray Tune Searcher API -------------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if metric and metric != self.spec.metric:
            raise ValueError(f"the tuned metric {metric!r} is not one Hydro trials report; they report "
                             f"{self.spec.metric_names()} per member (set TuneSpec.metric, or add {metric!r} "
                             f"to TuneSpec.metrics)")
        if mode and mode != self.spec.mode:
            raise ValueError(f"mode {mode!r} differs from TuneSpec.mode {self.spec.mode!r}")
        check_batch_size_space(config or {})
        run = tune_run_locals()
        if run is not None and self._run_reporter and config:
            member = RandomSearch(config, seed=0).suggest("check")
            check_group_by(self.spec, member, other_values(config, member, 0), mup=self.scale != 1)
        if run is not None and self._learn_resources and not self.state.trial_request:
            self.state.trial_request = _trainable_request(run, self.scale)
        if run is not None and self._run_reporter:
            attach(self)  # last: Tune makes the run's callbacks next
        self.state.space = config or self.state.space
        return self.inner.set_search_properties(self.spec.metric, self.spec.mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.state.max_concurrent = max_concurrent  # the search and the rungs spread over at most that many trials
        return False  # the limit applies to fused trials, which Tune counts itself (ConcurrencyLimiter)

    def suggest(self, trial_id: str) -> dict | None:
        if not self._scheduler_checked:  # before the first trial
            run = tune_run_locals()
            refuse_trial_scheduler((run or {}).get("scheduler"))
            if run is not None and self._learn_resources and not self.state.trial_request:
                # Tune calls set_search_properties only with a param_space: an inner searcher holding its own
                # space leaves it uncalled, and the search would not know the trial slots it can fill
                self.state.trial_request = _trainable_request(run, self.scale)
            self._scheduler_checked = True
        self._ensure_service()
        merging = self.merging
        config = (merging and merging.next_config(trial_id, self.driver)) or self._next_trial(trial_id)
        if merging is not None and isinstance(config, dict) and trial_id in self.driver.state.trial_groups:
            config = merging.trial_config(config)  # a search trial: it may hand its members over to a merge
        elif merging is not None and config == Searcher.FINISHED and merging.pending():
            config = None  # a merged trial is still to start
        if isinstance(config, dict) and self.placement is not None:
            config = self.placement.place(trial_id, config)
        if isinstance(config, dict):
            self.state.suggested[trial_id] = config
        return config

    def _next_trial(self, trial_id: str) -> dict | str | None:
        if self.state.lost:
            return self._again(trial_id)
        trial = self.driver.next_trial(trial_id, self._suggest_member, self._fusion_for, self._cluster)
        if trial is None:
            return Searcher.FINISHED if self.driver.done() and not (
                self.lost_trial_retries and self.state.suggested) else None  # a started trial may be lost
        if trial.is_target:
            ((config_id, config),) = trial.members
            plan = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], scale=1, mup=self.scale > 1,
                             source=trial.source, cpus=trial.cpus)
            return {**plan.to_config(), **config}
        search = trial.stage is Stage.SEARCH
        plan = TrialPlan(TrialKind.SURROGATE, trial.members, trial.scale, mup=not search or trial.scale > 1,
                         decisions=self._service_name() if search else None,
                         reports_objective=trial.reports_objective, final_score_only=not search,
                         halving=trial.halving, cpus=trial.cpus)
        return {**_unset(self.state.space), **plan.to_config()}

    def _lost(self, trial_id: str, config: dict | None, error: bool) -> bool:
        """Queue trial ``trial_id`` (given ``config``), which ended in an ``error`` after Tune's retries (its
        process, node or storage was lost; an error of its own code ends a Hydro trial without one), to train again
        from the start as a fresh trial with the same members and configuration, unless its members had
        ``lost_trial_retries`` such trials already. Returns whether it was queued. Members train again exactly
        (their initialisation, batches and stopping decisions are functions of their ids, seed and epochs), and
        each member's epochs count once."""
        retries = self.state.retries.get(trial_id, 0)
        if not error or config is None or retries >= self.lost_trial_retries:
            return False
        logger.warning("trial %s was lost (after Tune's retries from its checkpoint); training its members %s again "
                       "in a fresh trial (%d of %d)", trial_id, ", ".join(plan_of(config).member_ids), retries + 1,
                       self.lost_trial_retries)
        self.state.lost.append((trial_id, config))
        return True

    def _again(self, trial_id: str) -> dict:
        """The next lost trial's configuration, handed to ``trial_id`` in its place."""
        lost, config = self.state.lost.pop(0)
        self.state.retries[trial_id] = self.state.retries.pop(lost, 0) + 1
        self.driver.rename_trial(lost, trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if TRIAL_CPUS_KEY in result and trial_id not in self.driver.state.widened:
            self.state.trial_request = {"CPU": result[TRIAL_CPUS_KEY], "GPU": result.get(TRIAL_GPUS_KEY, 0.0)}
        if self.placement is not None:
            self.placement.on_result(trial_id, result, int(result.get("live_members", 1)))
        if (plan := reported_plan(result)) is not None:  # as the trial runs it: a scheduler may have set a key
            self.driver.trained_with(plan.members)
        _tell(self.inner, self.driver.on_result(trial_id, _member_results(result), self._cluster,
                                                result.get("time_total_s"), result.get("max_fusion")))
        if self.merging is not None:
            self.merging.on_result(trial_id, result, self.driver)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if self.placement is not None:
            self.placement.end(trial_id)
        if self.merging is not None:  # members it handed over wait for their merged trial
            self.merging.on_complete(trial_id, self.state.suggested.get(trial_id), self.driver)
        if self._lost(trial_id, self.state.suggested.pop(trial_id, None), error):
            return
        self.state.retries.pop(trial_id, None)
        if trial_id in self.driver.state.targets:
            self.driver.on_target_complete(trial_id, (result or {}).get(self.spec.metric), self._cluster)
            return
        if result:
            self.on_trial_result(trial_id, result)
        error = error or bool((result or {}).get(ERROR_KEY))
        _tell(self.inner, self.driver.on_trial_complete(trial_id, error, self._cluster))

    def save(self, checkpoint_path: str) -> None:
        if self._service is not None:
            self.state.stopping = ray.get(self._service.get_state.remote())
        with tempfile.TemporaryDirectory() as directory:  # the inner searcher's state, in the same file
            self.inner.save(os.path.join(directory, "inner"))
            with open(os.path.join(directory, "inner"), "rb") as f:
                inner = f.read()
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.state, "driver": self.driver.state, "inner": inner, "merging": self.merging}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = _saved_state(pickle.load(f))
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "inner"), "wb") as f:
                f.write(saved["inner"])
            self.inner.restore(os.path.join(directory, "inner"))
        self.state, self._service = saved["state"], None
        self.driver.restore(saved["driver"])
        self.merging = saved.get("merging", self.merging)
        if self.merging is not None:  # members handed over to a merge that had not started train again
            self.state.lost += self.merging.restart_pending()
        if self.state.scale_choice is not None:  # scale="auto", chosen before the checkpoint
            self.driver.use_scale(self.state.scale_choice.scale)
        self._ensure_service()  # restored trials look the service up as soon as they resume

    def __getstate__(self) -> dict:
        # actor handles belong to one Ray session; the data stays with the driver (a fusion planner that measures
        # leaves its copy behind too and loads it again when it next plans)
        return {**self.__dict__, "_service": None, "_data": None}

    # --- the scale -------------------------------------------------------------------------------------

    @property
    def scale(self) -> int | str:
        """The surrogates' width divisor S (1: full size); ``"auto"`` until measured."""
        return AUTO if self._auto and self.state.scale_choice is None else self.driver.policy.scale

    @property
    def scale_choice(self) -> ScaleChoice | None:
        """With ``scale="auto"``: the measured choice, once made (``None`` before, and for a given scale)."""
        return self.state.scale_choice

    def choose_scale(self, config: Mapping, space: Mapping | None = None) -> int:
        """The search's surrogate scale; with ``scale="auto"`` measured once, on ``config`` (a member's), then
        checked by the pilot on configurations drawn from ``space`` (default: the param space Tune passed), and
        kept (``fit`` chooses before Ray starts; else the first member's configuration decides). With per-member
        early stopping, among the scales whose transfer check can escalate, without a pilot
        (:func:`~schedulers.scale_choice.auto_scales`), where the model can be shrunk to one."""
        if self._auto and self.state.scale_choice is None:
            pool, data = self.driver.state.pool, self._loaded_data()
            measure = functools.partial(measured_scale, self.spec, config, data, min(pool.num_samples, pool.max_fusion),
                                        self.trial_cpus)
            checked = auto_scales(early_stopping=self.state.stopping is not None and self.driver.policy.escalate)
            try:
                choice = measure(scales=checked)
            except NoScale:
                if checked == AUTO_SCALES:
                    raise
                choice = None  # too small for those: the finer scales, warned of below
            if choice is not None and checked != AUTO_SCALES:
                logger.info("scale='auto': S=%d without a pilot: per-member early stopping ranks the configurations "
                            "it stops by their early epochs, and the first rung's transfer check at S=%d can escalate "
                            "on it (none would at a finer scale)", choice.scale, choice.scale)
            else:
                choice = choice or measure()
                space = self.state.space if space is None else space
                drawn = RandomSearch(dict(space), seed=0) if space else None
                pilot = [drawn.suggest(f"pilot{i}") for i in range(PILOT_CONFIGS)] if drawn else []
                choice = piloted_scale(self.spec, choice, pilot, data, pool.num_samples, self.trial_cpus)
            self.state.scale_choice = choice
            self.driver.use_scale(choice.scale)
            self._warn_unchecked_stopping()
        return self.scale

    def _warn_unchecked_stopping(self) -> None:
        """Warn, once the search's scale is known, where per-member early stopping meets surrogates that no transfer
        check follows (no escalation below S=8): the stopped configurations rank by their early epochs."""
        policy = self.driver.policy
        if self.state.stopping is None or policy.scale == 1 or policy.can_escalate():
            return
        why = "escalate=False" if policy.scale // 2 >= MIN_ESCALATION_SCALE else "escalation needs S >= 8"
        logger.warning("hydro: per-member early stopping ranks the configurations it stops by their early epochs, and "
                       "at S=%d no transfer check follows the search (%s): on a model whose "
                       "early epochs rank configurations unlike its last ones (overfitting, slow starters) the ones "
                       "that win late are dropped before any rung trains them, and the returned configuration can "
                       "be points worse. There, leave scheduler unset (the width ladder is the cheaper filter) or "
                       "search at scale=8, whose transfer check escalates on it "
                       "(docs/tuner-and-transfer.md#per-member-early-stopping)", policy.scale, why)

    def _loaded_data(self) -> tuple[DataSource, DataSource]:
        """The workload's data, loaded in this process when first needed (it is not pickled with the searcher)."""
        if self._data is None:
            self._data = self.spec.load_data()
        return self._data

    # --- results ---------------------------------------------------------------------------------------

    def member_results(self) -> dict[str, dict]:
        """Final result of every finished member (member id -> metrics, epoch, stopped), seed repeats and
        ladder members included."""
        return dict(self.driver.state.ledger.finished)

    def rejected_members(self) -> dict[str, tuple[dict, str]]:
        """Members whose configuration could not train, rejected before any trial: id -> (config, why)."""
        return dict(self.state.rejected)

    def best_member(self) -> tuple[str, dict] | None:
        """The search's configuration with the best finite objective (mean over its seeds), as (member id,
        config)."""
        member = self.driver.best_member()
        return None if member is None else (member, self.driver.state.pool.configs[member])

    def transfer_report(self) -> str:
        """The returned configuration's score at each scale it was trained at, and the transfer checks."""
        return self.driver.report()

    def _service_name(self) -> str | None:
        return self.state.service_name if self.state.stopping is not None else None

    def _ensure_service(self) -> None:
        if self.state.stopping is not None and self._service is None:
            self._service = start_service(self.state.service_name, self.state.stopping)

    def _suggest_member(self, member: str) -> dict | Suggestion:
        config = self.inner.suggest(member)
        if config is None:
            return Suggestion.NOT_NOW
        if config == Searcher.FINISHED:
            return Suggestion.FINISHED
        config = _complete(self.state.space, config)
        problem = check_member(self.spec, config)
        if problem is None:
            self.choose_scale(config)
            return config
        logger.warning("member %s rejected before training (the inner searcher is told it failed): %s; "
                       "configuration %s", member, problem, config)
        self.state.rejected[member] = (config, problem)
        _tell(self.inner, self.driver.reject(member))
        return Suggestion.REJECTED

    def _fusion_for(self, key, config: Mapping) -> int:
        if self._planner is None:  # fusion="auto"
            pool, seeds, slots = self.driver.state.pool, self.driver.policy.seeds, self._cluster.trial_slots()
            counts = whole_round_counts(pool.num_samples, slots)  # per search trial, filling the slots
            self._planner = MeasuredFusion(self.spec, self.scale, self._loaded_data(), min(
                pool.max_fusion, pool.num_samples, self.driver.search_share(slots) * seeds), self.trial_cpus,
                counts=None if counts is None else [count * seeds for count in counts])
        return self._planner.fusion_for(key, config)


def _check_arguments(searcher: Searcher | None, scale: int | str, trial_cpus: int,
                     trial_resources: Mapping[str, float] | None, lost_trial_retries: int, transfer: Mapping) -> None:
    """Raise ``ValueError``/``TypeError`` for a ``HydroSearcher`` argument it cannot use (see its ``Raises:``)."""
    if trial_cpus < 1:
        raise ValueError(f"trial_cpus must be >= 1, got {trial_cpus}")
    if not (isinstance(lost_trial_retries, int) and lost_trial_retries >= 0):
        raise ValueError(f"HydroSearcher: lost_trial_retries must be an int >= 0, got {lost_trial_retries!r}")
    if trial_resources is not None and not (isinstance(trial_resources, Mapping) and all(
            isinstance(v, (int, float)) and v >= 0 for v in trial_resources.values())):
        raise ValueError(f"HydroSearcher: trial_resources holds Ray resource amounts >= 0 per trial, e.g. "
                         f"{{'CPU': 1, 'GPU': 0.5}}; got {trial_resources!r}")
    if scale != AUTO and not is_count(scale):
        raise ValueError(f"HydroSearcher: scale must be an int >= 1 (the surrogates' width divisor; 1: full size) "
                         f"or 'auto' (measured), got {scale!r}")
    if searcher is not None and not isinstance(searcher, Searcher):
        raise TypeError(f"HydroSearcher: searcher must be a Ray Tune Searcher (e.g. OptunaSearch()) or None "
                        f"(random search of the param space), got {type(searcher).__name__}")
    options = sorted(f.name for f in dataclasses.fields(TransferPolicy) if f.name not in _SET_BY_SEARCHER)
    unknown = sorted(set(transfer) - set(options))
    if unknown:
        raise TypeError(f"HydroSearcher: unknown transfer option(s) {unknown}; the transfer options are {options}")


@dataclass
class _RayCluster:
    """The compute of the Ray cluster a ``HydroSearcher`` runs on, as its driver asks for it."""

    searcher: HydroSearcher

    def trial_request(self) -> Mapping[str, float]:
        return self.searcher.state.trial_request

    def trial_slots(self) -> int:
        """How many trials train at once on separate compute of the cluster (1 while a trial's resources are not
        known, or outside a Ray session; with placement, at most its GPUs of every type)."""
        state = self.searcher.state
        if not state.trial_request or not ray.is_initialized():
            return 1
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        slots = trial_slots(nodes, state.trial_request, state.max_concurrent)
        placement = self.searcher.placement
        return slots if placement is None else max(1, min(slots, placement.gpus()))

    def lone_trial_cpus(self) -> float:
        """The largest node's CPUs, less one that Ray's processes and the driver keep unless the job's workers run
        OpenMP with passive waits (:func:`~hydro.tune.cluster.worker_env.worker_env_vars` sets that on clusters Hydro starts): torch's
        OpenMP threads spin-wait on every core by default, and each step then takes many times longer whenever
        anything else runs on that node."""
        cpus = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]), default=0.0)
        return cpus if passive_openmp(ray.get_runtime_context().runtime_env.get("env_vars") or {}) else cpus - 1


class TransferState:
    """The transfer stages as searchers saved them before the search driver held them: read from such
    checkpoints only (:func:`_saved_state`)."""


def _saved_state(saved: dict) -> dict:
    """A saved searcher (``{"state", "driver", "inner"}``), from one saved before the search driver held the
    members and the stages too (its ``state`` held them, the stages in a :class:`TransferState`)."""
    if "driver" in saved:
        return saved
    old, transfer = saved["state"].__dict__, saved["state"].__dict__.pop("transfer").__dict__
    current = None if transfer["rung"] is None else StageRun(transfer["rung"], transfer["members"],
                                                             transfer["waiting"], transfer["cpus"])
    driver = DriverState(*(old.pop(k) for k in ("pool", "ledger", "trial_groups", "trial_seconds")),
                         transfer["stages"], current, *(transfer[k] for k in (
                             "targets", "target_values", "forwarded", "widened", "slots", "started")))
    return {**saved, "driver": driver}


def _tell(inner: Searcher, events: list[MemberEvent]) -> None:
    """Tell ``inner`` what its configurations did (events under config ids, from the search driver)."""
    for event in events:
        if event.kind is EventKind.RESULT:
            inner.on_trial_result(event.member, event.result)
        elif event.result and event.result.get("stopped") is True and _prunes(inner):
            inner.on_trial_result(event.member, event.result)  # its last value, then no final result:
            inner.on_trial_complete(event.member, result=None)  # Optuna records PRUNED with that value
        else:
            inner.on_trial_complete(event.member, result=event.result, error=event.error)


def _trainable_request(run: Mapping, scale: int | str) -> dict[str, float]:
    """One surrogate trial's Ray resources at ``scale`` as the trainable of the ``ray.tune.run`` call ``run`` (its
    local variables) asks for them; Tune's default, 1 CPU, for a trainable that asks for none."""
    plan = TrialPlan(TrialKind.SURROGATE, [], checked_scale(scale), checked_scale(scale) > 1)
    request = get_trainable_cls(run["experiments"][0].run_identifier).default_resource_request(plan.to_config())
    if isinstance(request, PlacementGroupFactory):
        return {k.upper(): float(v) for k, v in request.required_resources.items()}
    return {"CPU": 1.0}


def _prunes(searcher: Searcher) -> bool:
    """Whether ``searcher`` records a trial completed without a result and without an error as stopped early
    (Ray's ``OptunaSearch``: ``PRUNED``, with its last intermediate value); others get the final result."""
    from ray.tune.search.optuna import OptunaSearch

    return isinstance(searcher, OptunaSearch)


def _member_results(result: Mapping) -> dict[str, dict]:
    """Per-member metrics of a flattened trial result (``members/<id>/<name>`` keys)."""
    members: dict[str, dict] = {}
    prefix = MEMBERS_KEY + "/"
    for key, value in result.items():
        if key.startswith(prefix):
            member, _, name = key[len(prefix):].partition("/")
            members.setdefault(member, {})[name] = value
    return members


def _unset(space: Mapping) -> dict:
    """``None`` for every sampled entry of ``space``: Tune merges a suggestion into ``param_space``, so a fused
    trial (whose members differ in these) would otherwise keep the unresolved search-space objects there."""
    unset = {}
    for key, value in space.items():
        if isinstance(value, Domain) or (isinstance(value, Mapping) and "grid_search" in value):
            unset[key] = None
        elif isinstance(value, Mapping):
            unset[key] = _unset(value)
    return unset


def _complete(space: Mapping, config: Mapping) -> dict:
    """``config`` with the constant (non-sampled) entries of ``space`` it lacks (some searchers, e.g.
    Optuna, return only the sampled values)."""
    merged = dict(config)
    for key, value in space.items():
        if isinstance(value, Mapping) and "grid_search" not in value:
            merged[key] = _complete(value, config.get(key, {}))
        elif key not in merged and not isinstance(value, (Domain, Mapping)):
            merged[key] = value
    return merged
