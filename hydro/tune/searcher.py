"""``HydroSearcher``: a Ray Tune ``Searcher`` that turns an inner searcher's configurations into fused trials.

Each Ray trial is one fused group of up to F members (configurations). A thin adapter, as Ray's
``ConcurrencyLimiter`` wraps a searcher, over plain-Python parts: the member pool (draw from the inner searcher
under member ids, group by ``TuneSpec.group_key``, take groups of the planned size,
:mod:`schedulers.member_pool`), the member ledger (each member's results reach the inner searcher as its own
trial, once, :mod:`schedulers.member_ledger`), the transfer policy (when the transfer stages start, what they train
— seed repeats, a width ladder, top-k full-size targets, fidelity escalation, fallback targets after a regressed
one — and the transfer check, :mod:`schedulers.transfer`) and a fusion planner (:mod:`hydro.trial.fusion`). The
run's best result is the best target's: the best configurations at full size, in µP when the members were shrunk.
"""
from __future__ import annotations

import dataclasses
import logging
import math
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
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan, plan_of
from hydro.trial.data import DataSource
from hydro.trial.scale_plan import measured_scale
from hydro.trial.spec import TuneSpec
from hydro.tune.member_decisions import start_service
from hydro.tune.member_rules import refuse_trial_scheduler, stopping_rule
from hydro.tune.random_search import RandomSearch
from hydro.tune.run_reporter import attach, tune_run_locals
from hydro.tune.session import ERROR_KEY, MEMBERS_KEY, TRIAL_CPUS_KEY, TRIAL_GPUS_KEY
from hydro.tune.space_check import check_batch_size_space, other_values
from schedulers.member_ledger import EventKind, MemberLedger
from schedulers.member_pool import MemberPool, Suggestion
from schedulers.member_stopping import MemberStopping, StoppingRule
from schedulers.scale_choice import AUTO, ScaleChoice, checked_scale
from schedulers.transfer import FULL_SIZE, Rung, RungKind, Score, TransferPolicy, scores_of
from schedulers.trial_slots import TRIAL_OVERHEAD_S, rung_trials, split_evenly, trial_slots, whole_round_counts

logger = logging.getLogger(__name__)

_SET_BY_SEARCHER = {"fraction", "num_samples", "metric", "mode", "scale", "slots"}  # not in **transfer


@dataclass
class TransferState:
    """The transfer stages of a search: ``stages``: scores of the finished stages (config id -> score), the
    search's first; ``rung``: the stage in progress, its ``members`` (surrogate stages) and the ``waiting``
    fused groups or target configurations not yet started; ``targets``: full-size trial id -> config id (the
    targets' and fallback targets'),
    ``target_values`` the final values of those that ended (``None``: failed before a report). A config id is
    the id of the search member the inner searcher drew; its seed repeats are ``<id>#<seed>``, its ladder
    members ``<id>@<scale>[#<seed>]``. ``forwarded``: configs whose completion the inner searcher heard.
    ``started``: every trial of the stages has started (the run can end). ``cpus``: CPUs each trial of the stage
    in progress asks for, when it leaves trial slots idle (``None``: the trainable's request); ``widened``: the
    trials that asked for more (their reported resources are not a trial slot's). ``slots``: the trial slots the
    rungs fill (:attr:`TransferPolicy.slots`), fixed when the stages start (1 for GPU trials, whose time hardly grows with their fused
    members; their rung trials still spread over the cards)."""

    stages: list[dict[str, Score]] = field(default_factory=list)
    rung: Rung | None = None
    members: list[str] = field(default_factory=list)
    waiting: list[list[tuple[str, dict]]] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    target_values: dict[str, float] = field(default_factory=dict)
    forwarded: set[str] = field(default_factory=set)
    started: bool = False
    cpus: int | None = None
    widened: set[str] = field(default_factory=set)
    slots: int = 1


@dataclass
class SearchState:
    """Everything a ``HydroSearcher`` decides from, apart from the inner searcher (saved with it) and the
    workload: what ``save``/``restore`` write."""

    pool: MemberPool
    ledger: MemberLedger
    stopping: MemberStopping | None
    service_name: str
    space: dict
    rejected: dict[str, tuple[dict, str]] = field(default_factory=dict)  # member -> (config, why)
    trial_groups: dict = field(default_factory=dict)  # surrogate trial id -> its members' group key
    transfer: TransferState = field(default_factory=TransferState)
    trial_request: dict[str, float] = field(default_factory=dict)  # one trial's Ray resources: given, or reported
    max_concurrent: int | None = None  # Tune's max_concurrent_trials (set_max_concurrency)
    trial_seconds: dict[str, float] = field(default_factory=dict)  # finished surrogate trial -> its time_total_s
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
            device before the first trial (:func:`~hydro.trial.scale_plan.measured_scale`); :attr:`scale` is then
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
            before the first trial, refuse a key outside ``TuneSpec.group_by`` that changes the model
            (:func:`~hydro.trial.check.check_group_by`), and add a :class:`~hydro.tune.run_reporter.RunReporter`
            (member progress in place of Ray's trial reporter; the member table, best configuration and trained
            model written to the run directory at the end). A non-integer batch size in the param space is
            refused either way.
        **transfer: the options of :class:`~schedulers.transfer.TransferPolicy` (``ladder``, ``eta``, ``top_k``,
            ``seeds``, ``min_agreement``, ``max_target_drop``, ``escalate``, ``disagreement``, ``probes``,
            ``probe_margin``, ``fallback_targets``): the width ladder, full-size targets, escalation and fallback
            targets after the search.

    The run's best result is the best full-size target's (µP when the members were shrunk). The run logs the
    stages' cost before they start, the returned configuration's score at each scale and the transfer check.

    Raises:
        ValueError: a bad ``scale``, ``trial_cpus`` or ``trial_resources``; a transfer option out of range, or one
            other than ``seeds`` set away from its default where it cannot act (``scale`` 1 or
            ``transfer_fraction=None``); a ``scheduler`` whose settings cannot act per member (its own metric,
            a ``time_attr`` other than epochs, ``MedianStoppingRule(hard_stop=False)``).
        TypeError: ``searcher`` is not a Ray ``Searcher``; a ``scheduler`` of another kind; an unknown transfer
            option.
    """

    def __init__(self, spec: TuneSpec, searcher: Searcher | None = None, *, num_samples: int, scale: int | str = 1,
                 fusion: int | str | FusionPlanner = "auto", max_fusion: int = 64,
                 scheduler: StoppingRule | TrialScheduler | None = None, transfer_fraction: float | None = 1.0,
                 seed: int | None = None, data: tuple[DataSource, DataSource] | None = None, trial_cpus: int = 1,
                 trial_resources: Mapping[str, float] | None = None, lost_trial_retries: int = 1,
                 run_reporter: bool = True, **transfer) -> None:
        super().__init__(metric=spec.metric, mode=spec.mode)
        if trial_cpus < 1:
            raise ValueError(f"trial_cpus must be >= 1, got {trial_cpus}")
        if not (isinstance(lost_trial_retries, int) and lost_trial_retries >= 0):
            raise ValueError(f"HydroSearcher: lost_trial_retries must be an int >= 0, got {lost_trial_retries!r}")
        self.lost_trial_retries = lost_trial_retries
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
        self.spec, self.scale, self.trial_cpus, self._data = spec, scale, trial_cpus, data
        self._planner = None if fusion == "auto" else fusion if isinstance(fusion, FusionPlanner) else FixedFusion(fusion)
        self.transfer = TransferPolicy(transfer_fraction, num_samples, spec.metric, spec.mode,
                                       scale=checked_scale(scale), **transfer)
        rule = stopping_rule(scheduler, spec.metric)
        self.inner = searcher if searcher is not None else RandomSearch(seed=seed)
        self.state = SearchState(MemberPool(num_samples, max_fusion), MemberLedger(),
                                 MemberStopping(rule, spec.mode) if rule is not None else None,
                                 f"hydro-member-decisions-{uuid.uuid4().hex[:12]}", {},
                                 trial_request={k.upper(): float(v) for k, v in (trial_resources or {}).items()})
        self._service = None
        self._scheduler_checked = False
        self._run_reporter, self._learn_resources = run_reporter, trial_resources is None

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
            self.state.trial_request = self._run_trial_request(run)
        if run is not None and self._run_reporter:
            attach(self)  # last: Tune makes the run's callbacks next
        self.state.space = config or self.state.space
        return self.inner.set_search_properties(self.spec.metric, self.spec.mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.state.max_concurrent = max_concurrent  # the search and the rungs spread over at most that many trials
        return False  # the limit applies to fused trials, which Tune counts itself (ConcurrencyLimiter)

    def suggest(self, trial_id: str) -> dict | None:
        if not self._scheduler_checked:  # before the first trial
            refuse_trial_scheduler((tune_run_locals() or {}).get("scheduler"))
            self._scheduler_checked = True
        self._ensure_service()
        config = self._next_trial(trial_id)
        if isinstance(config, dict):
            self.state.suggested[trial_id] = config
        return config

    def _next_trial(self, trial_id: str) -> dict | str | None:
        state = self.state
        if state.lost:
            return self._again(trial_id)
        if state.transfer.stages or self.transfer.due(self._search_finished(), self._nothing_left()):
            config = self._transfer_trial(trial_id)
            if config is not None:
                return config
        members = state.pool.draw(self._suggest_member, self.spec.group_key, self._repeat_fusion)
        if members:
            members = [(_repeat_id(m, s), c) for m, c in members for s in range(self.transfer.seeds)]
            state.ledger.add_trial(trial_id, [m for m, _ in members])
            state.trial_groups[trial_id] = self.spec.group_key(members[0][1])
            plan = TrialPlan(TrialKind.SURROGATE, members, self.scale, self.scale > 1, self._service_name(),
                             reports_objective=self.transfer.fraction is None)
            return {**_unset(state.space), **plan.to_config()}
        if state.pool.exhausted and (self.transfer.fraction is None or state.transfer.started
                                     or (not state.transfer.stages and not state.ledger.running())) \
                and not (self.lost_trial_retries and self._trials_running()):  # a lost one may train again
            return Searcher.FINISHED
        return None

    def _trials_running(self) -> bool:
        """Whether a trial this searcher started has not completed."""
        return bool(self.state.suggested)

    def _lost(self, trial_id: str) -> bool:
        """Queue trial ``trial_id``, which Tune gave up on after its retries (its process, node or storage was lost;
        an error of its own code ends a Hydro trial without one), to train again from the start as a fresh trial
        with the same members and configuration, unless its members had ``lost_trial_retries`` such trials already.
        Returns whether it was queued. Members train again exactly (their initialisation, batches and stopping
        decisions are functions of their ids, seed and epochs), and each member's epochs count once."""
        config = self.state.suggested.get(trial_id)
        retries = self.state.retries.get(trial_id, 0)
        if config is None or retries >= self.lost_trial_retries:
            return False
        logger.warning("trial %s was lost (after Tune's retries from its checkpoint); training its members %s again "
                       "in a fresh trial (%d of %d)", trial_id, ", ".join(plan_of(config).member_ids), retries + 1,
                       self.lost_trial_retries)
        self.state.lost.append((trial_id, config))
        return True

    def _again(self, trial_id: str) -> dict:
        """The next lost trial's configuration, handed to ``trial_id`` in its place."""
        state, transfer = self.state, self.state.transfer
        lost, config = state.lost.pop(0)
        state.retries[trial_id] = state.retries.pop(lost, 0) + 1
        if lost in state.ledger.trials:
            state.ledger.trials[trial_id] = state.ledger.trials.pop(lost)
        if lost in state.trial_groups:
            state.trial_groups[trial_id] = state.trial_groups.pop(lost)
        if lost in transfer.targets:
            transfer.targets[trial_id] = transfer.targets.pop(lost)
        if lost in transfer.widened:
            transfer.widened.add(trial_id)
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        if TRIAL_CPUS_KEY in result and trial_id not in self.state.transfer.widened:
            self.state.trial_request = {"CPU": result[TRIAL_CPUS_KEY], "GPU": result.get(TRIAL_GPUS_KEY, 0.0)}
        if trial_id in self.state.transfer.targets:
            return  # its final value counts, at completion
        self._forward(self.state.ledger.observe(_member_results(result)))
        self._replan(trial_id, result)
        if "time_total_s" in result:  # counted once its members have all finished (see _rung_seconds)
            self.state.trial_seconds[trial_id] = result["time_total_s"]
        if self.state.transfer.rung is not None:
            # A stage closes on its members' last results, before Tune completes their trials: Tune then holds
            # the next stage's trials when it stops these trials' workers, and keeps as many idle workers for
            # them (with none waiting, it keeps one, and the next stage's second trial waits for a new worker).
            self._advance()

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        transfer = self.state.transfer
        if error and self._lost(trial_id):
            self.state.suggested.pop(trial_id, None)
            return
        self.state.suggested.pop(trial_id, None)
        self.state.retries.pop(trial_id, None)
        if trial_id in transfer.targets:
            transfer.target_values[transfer.targets[trial_id]] = (result or {}).get(self.spec.metric)
            self._advance()
            return
        if result:
            self.on_trial_result(trial_id, result)
        self._forward(self.state.ledger.trial_complete(trial_id, error or bool((result or {}).get(ERROR_KEY))))
        if transfer.rung is not None:
            self._advance()

    def save(self, checkpoint_path: str) -> None:
        if self._service is not None:
            self.state.stopping = ray.get(self._service.get_state.remote())
        with tempfile.TemporaryDirectory() as directory:  # the inner searcher's state, in the same file
            self.inner.save(os.path.join(directory, "inner"))
            with open(os.path.join(directory, "inner"), "rb") as f:
                inner = f.read()
        with open(checkpoint_path, "wb") as f:
            pickle.dump({"state": self.state, "inner": inner}, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            saved = pickle.load(f)
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "inner"), "wb") as f:
                f.write(saved["inner"])
            self.inner.restore(os.path.join(directory, "inner"))
        self.state, self._service = saved["state"], None
        self.transfer = dataclasses.replace(self.transfer, slots=self.state.transfer.slots)
        if self.state.scale_choice is not None:  # scale="auto", chosen before the checkpoint
            self._use_scale(self.state.scale_choice.scale)
        self._ensure_service()  # restored trials look the service up as soon as they resume

    def __getstate__(self) -> dict:
        # actor handles belong to one Ray session; the data stays with the driver (a fusion planner that measures
        # leaves its copy behind too and loads it again when it next plans)
        return {**self.__dict__, "_service": None, "_data": None}

    # --- the scale -------------------------------------------------------------------------------------

    @property
    def scale_choice(self) -> ScaleChoice | None:
        """With ``scale="auto"``: the measured choice, once made (``None`` before, and for a given scale)."""
        return self.state.scale_choice

    def choose_scale(self, config: Mapping) -> int:
        """The search's surrogate scale; with ``scale="auto"`` measured once, on ``config`` (a member's), and
        kept (``fit`` chooses before Ray starts; else the first member's configuration decides)."""
        if self.scale == AUTO:
            if self.state.scale_choice is None:
                pool = self.state.pool
                self.state.scale_choice = measured_scale(self.spec, config, self._loaded_data(),
                                                         min(pool.num_samples, pool.max_fusion), self.trial_cpus)
            self._use_scale(self.state.scale_choice.scale)
        return self.scale

    def _loaded_data(self) -> tuple[DataSource, DataSource]:
        """The workload's data, loaded in this process when first needed (it is not pickled with the searcher)."""
        if self._data is None:
            self._data = self.spec.load_data()
        return self._data

    def _use_scale(self, scale: int) -> None:
        self.scale = scale
        self.transfer = dataclasses.replace(self.transfer, scale=scale)

    # --- results ---------------------------------------------------------------------------------------

    def member_results(self) -> dict[str, dict]:
        """Final result of every finished member (member id -> metrics, epoch, stopped), seed repeats and
        ladder members included."""
        return dict(self.state.ledger.finished)

    def rejected_members(self) -> dict[str, tuple[dict, str]]:
        """Members whose configuration could not train, rejected before any trial: id -> (config, why)."""
        return dict(self.state.rejected)

    def best_member(self) -> tuple[str, dict] | None:
        """The search's configuration with the best finite objective (mean over its seeds), as (member id,
        config)."""
        member = self.transfer.returned([self._search_scores()])
        return None if member is None else (member, self.state.pool.configs[member])

    def transfer_report(self) -> str:
        """The returned configuration's score at each scale it was trained at, and the transfer checks."""
        stages = self.state.transfer.stages
        config = self.transfer.returned(stages)
        if config is None:
            return "no transfer stage has a score"
        trail = ", ".join(f"{'full size' if s == FULL_SIZE else f'S={s}'}: {score}"
                          for s, score in self.transfer.trail(stages, config))
        checks = "; ".join(f"S={c.coarse} vs S={c.fine} over {c.configs} configurations: rho {c.rho:.2f}"
                           + (f" (95% upper bound {c.upper:.2f})" if math.isfinite(c.upper) else "")
                           + (" (LOW)" if c.low else "") for c in self.transfer.checks(stages) if c.configs >= 3)
        return f"{self.spec.metric} of the returned configuration {config} at each scale: {trail}" + \
            (f". Transfer check (Spearman): {checks}" if checks else "")

    # --- internals ---------------------------------------------------------------------------------------

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
        self._forward([self.state.ledger.reject(member)])
        return Suggestion.REJECTED

    def _fusion_for(self, key, config: Mapping) -> int:
        if self._planner is None:  # fusion="auto"
            pool, seeds = self.state.pool, self.transfer.seeds
            counts = whole_round_counts(pool.num_samples, self._trial_slots())  # per search trial, filling the slots
            self._planner = MeasuredFusion(self.spec, self.scale, self._loaded_data(), min(
                pool.max_fusion, pool.num_samples, self._search_share() * seeds), self.trial_cpus,
                counts=None if counts is None else [count * seeds for count in counts])
        return self._planner.fusion_for(key, config)

    def _replan(self, trial_id: str, result: Mapping) -> None:
        """A surrogate trial that ran out of memory trained its members in smaller fused chunks: later trials of
        its group get at most that many members. A trial that holds fewer members than planned (the last of a
        group, or the search's even share per slot) fuses all of them: that is no shortage of memory."""
        key, fused_at_once = self.state.trial_groups.get(trial_id), result.get("max_fusion")
        planned, held = self.state.pool.fusion.get(key), len(self.state.ledger.trials.get(trial_id, ()))
        if fused_at_once is not None and planned is not None and fused_at_once < min(planned, held):
            logger.warning("group %s ran out of memory at %d fused members: its later trials get %d",
                           key, min(planned, held), fused_at_once)
            self.state.pool.fusion[key] = fused_at_once

    def _nothing_left(self) -> bool:
        return self.state.pool.exhausted and not self.state.ledger.running()

    def _repeat_fusion(self, key, config: Mapping) -> int:
        """Search members per fused trial: the planned count divided among each configuration's seeds, at most
        an even share of the search per trial slot (so that every slot trains)."""
        return max(1, min(self._fusion_for(key, config) // self.transfer.seeds, self._search_share()))

    def _search_share(self) -> int:
        """Configurations per fused trial of the search that spread it evenly over the trial slots."""
        return -(-self.state.pool.num_samples // self._trial_slots())

    def _search_finished(self) -> dict[str, dict | None]:
        """Final results of the finished search members (first seeds), for when the stages are due."""
        return {m: r for m, r in self.state.ledger.finished.items() if m in self.state.pool.configs}

    def _search_scores(self) -> dict[str, Score]:
        """Each finished search configuration's score over its finished seeds."""
        return scores_of((_config_id(m), self._final_value(m)) for m in self.state.ledger.finished
                         if _is_search_member(m))

    def _final_value(self, member: str) -> float | None:
        """A finished member's final objective; ``None`` for a failed member (its last result before the error
        does not make its configuration a candidate for the transfer stages: it would fail there again)."""
        ledger = self.state.ledger
        return None if member in ledger.failed else (ledger.finished[member] or {}).get(self.spec.metric)

    def _transfer_trial(self, trial_id: str) -> dict | None:
        """The next trial of the transfer stages, or ``None`` (waiting for a stage, or all started)."""
        transfer = self.state.transfer
        if not transfer.stages:
            # the rungs' cut (TransferPolicy.slots) is for trials whose time grows with their members: CPU trials
            transfer.slots = 1 if self.state.trial_request.get("GPU", 0.0) else self._trial_slots()
            self.transfer = dataclasses.replace(self.transfer, slots=transfer.slots)
            transfer.stages.append(self._search_scores())
            logger.info("transfer stages after the search: %s", self.transfer.describe(len(transfer.stages[0])))
            self._advance()
        if not transfer.waiting:
            return None
        rung, group = transfer.rung, transfer.waiting.pop(0)
        if transfer.cpus:
            transfer.widened.add(trial_id)
        if rung.scale == FULL_SIZE:
            ((config_id, config),) = group
            transfer.targets[trial_id] = config_id
            transfer.started = not transfer.waiting and self.transfer.final(transfer.stages)
            trail = self.transfer.trail(transfer.stages, config_id)
            source = {"member": config_id, self.spec.metric: trail[-1][1].mean,
                      "scores": {str(s): str(v) for s, v in trail}}
            logger.info("training the full-size target with %s's configuration %s", config_id, config)
            plan = TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], scale=1, mup=self.scale > 1,
                             source=source, cpus=transfer.cpus)
            return {**plan.to_config(), **config}
        self.state.ledger.add_trial(trial_id, [m for m, _ in group])
        plan = TrialPlan(TrialKind.SURROGATE, group, rung.scale, mup=True, reports_objective=False,
                         final_score_only=True, cpus=transfer.cpus)
        return {**_unset(self.state.space), **plan.to_config()}

    def _advance(self) -> None:
        """Close the stage in progress once all of it finished, and queue the next (or end the stages)."""
        transfer = self.state.transfer
        current = transfer.rung
        if current is not None:
            if transfer.waiting:
                return
            if current.scale == FULL_SIZE:
                if any(c not in transfer.target_values for c in current.configs):
                    return
                transfer.stages.append(scores_of((c, transfer.target_values[c]) for c in current.configs))
            else:
                finished = self.state.ledger.finished
                if any(m not in finished for m in transfer.members):
                    return
                transfer.stages.append(scores_of((_config_id(m), self._final_value(m)) for m in transfer.members))
        rung = transfer.rung = self.transfer.next_rung(transfer.stages)
        if rung is None:
            self._finish_transfer()
            return
        configs = {c: self.state.pool.configs[c] for c in rung.configs}
        if rung.scale == FULL_SIZE:
            transfer.waiting = [[(c, config)] for c, config in configs.items()]
            transfer.cpus = self._stage_cpus(len(transfer.waiting), self._rung_seconds(1, FULL_SIZE))
            if rung.kind == RungKind.FALLBACK:
                logger.warning("transfer check: %s: training %d fallback target(s) at full size, %s, and returning "
                               "the best full-size one", rung.why, len(configs), ", ".join(configs))
            return
        members = [(_repeat_id(f"{c}@{rung.scale}", s), config) for c, config in configs.items()
                   for s in range(rung.seeds)]
        transfer.members = [m for m, _ in members]
        groups: dict = {}
        for member in members:
            groups.setdefault(self.spec.group_key(member[1]), []).append(member)
        slots = rung_trials(self._rung_seconds(len(members), rung.scale), self._trial_slots())
        size = min(max(1, self.state.pool.max_fusion), -(-len(members) // slots))
        transfer.waiting = [part for g in groups.values() for part in split_evenly(g, -(-len(g) // size))]
        transfer.cpus = self._stage_cpus(len(transfer.waiting),
                                         self._rung_seconds(max(map(len, transfer.waiting)), rung.scale))
        seeds = f" ({rung.seeds} seeds each)" if rung.seeds > 1 else ""
        trials = f" in {len(transfer.waiting)} fused trials" if len(transfer.waiting) > 1 else ""
        if rung.kind == RungKind.ESCALATION:
            logger.warning("transfer check: %s: fidelity escalation: training the %d other configurations at S=%d%s%s "
                           "to rank all of them there, then the ladder again from there", rung.why, len(configs),
                           rung.scale, seeds, trials)
        else:
            logger.info("width ladder: training %d configurations at S=%d%s%s", len(configs), rung.scale, seeds,
                        trials)

    def _stage_cpus(self, trials: int, work_s: float | None) -> int | None:
        """CPUs for each of a stage's ``trials`` (``work_s``: the longest one's estimated seconds of training in
        one slot) when they leave trial slots idle and nothing else trains: the idle slots' CPUs shared among them
        (torch threads; at most one node's), so that a lone target trains on every core the run's slots hold, when
        that saves more than a trial's start (a wider trial is a new Ray actor), as :func:`rung_trials` spreads a
        rung; ``None`` (the trainable's request) otherwise, for GPU trials (their GPU does the work) and while
        search members still train."""
        request, slots = self.state.trial_request, self._trial_slots()
        if trials >= slots or request.get("GPU", 0.0) or self.state.ledger.running():
            return None
        node = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]), default=0.0)
        cpus = int(min(request.get("CPU", 1.0) * rung_trials(work_s, slots // trials, TRIAL_OVERHEAD_S), node))
        return cpus if cpus > request.get("CPU", 1.0) else None

    def _rung_seconds(self, members: int, scale: int) -> float | None:
        """Estimated seconds of training of ``members`` members at ``scale`` fused in one trial, from the finished
        trials at the finest scale so far whose members all trained every epoch (early-stopped members would
        leave each epoch's fixed cost to fewer member-epochs): their seconds per member-epoch, times (their
        scale / ``scale``)² (a layer's cost grows with the square of its width); ``None``: no such trial yet."""
        ledger, measured = self.state.ledger, {}
        for trial, seconds in self.state.trial_seconds.items():
            ids = ledger.trials.get(trial, [])
            if not ids or any(m in ledger.failed or (ledger.finished.get(m) or {}).get("epoch") != self.spec.epochs
                              for m in ids):
                continue
            total = measured.setdefault(_member_scale(ids[0], self.scale), [0.0, 0])
            total[0], total[1] = total[0] + seconds, total[1] + len(ids) * self.spec.epochs
        if not measured:
            return None
        finest = min(measured)
        seconds, member_epochs = measured[finest]
        return seconds / member_epochs * (finest / scale) ** 2 * members * self.spec.epochs

    def _run_trial_request(self, run: Mapping) -> dict[str, float]:
        """One surrogate trial's Ray resources as the trainable of the ``ray.tune.run`` call ``run`` (its local
        variables) asks for them; Tune's default, 1 CPU, for a trainable that asks for none."""
        plan = TrialPlan(TrialKind.SURROGATE, [], checked_scale(self.scale), checked_scale(self.scale) > 1)
        request = get_trainable_cls(run["experiments"][0].run_identifier).default_resource_request(plan.to_config())
        if isinstance(request, PlacementGroupFactory):
            return {k.upper(): float(v) for k, v in request.required_resources.items()}
        return {"CPU": 1.0}

    def _trial_slots(self) -> int:
        """How many trials train at once on separate compute of the cluster (1 while a trial's resources are not
        known, or outside a Ray session)."""
        if not self.state.trial_request or not ray.is_initialized():
            return 1
        nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
        return trial_slots(nodes, self.state.trial_request, self.state.max_concurrent)

    def _finish_transfer(self) -> None:
        transfer = self.state.transfer
        transfer.started = True
        logger.info(self.transfer_report())
        for check in self.transfer.checks(transfer.stages):
            if check.low:
                logger.warning("transfer check: the rankings at S=%d and S=%d disagree (Spearman %.2f over %d "
                               "configurations, 95%% upper bound %.2f, below %.2f): the surrogates' choice may not "
                               "hold at full size; use a smaller scale, seeds=, ladder=True or a larger top_k",
                               check.coarse, check.fine, check.rho, check.configs, check.upper,
                               self.transfer.min_agreement)
        regression = self.transfer.regression(transfer.stages)
        if regression is not None:
            logger.warning("transfer check: the returned configuration %s scored %.4g at full size, %.1f%% worse "
                           "than at S=%d (%.4g): a full-size model should not do worse than its surrogate, so the "
                           "surrogates' choice may not hold at full size (seen on overfitting workloads); try a "
                           "smaller scale, top_k=2 or fallback_targets=2", regression.config, regression.full_size,
                           100 * regression.drop, regression.scale, regression.surrogate)

    def _forward(self, events) -> None:
        """Tell the inner searcher what the search's configurations did, each under the id of the member it
        drew: the first seed's intermediate results, and once all its seeds finished, the final result with the
        objective averaged over them (ladder members are not the inner searcher's)."""
        finished = self.state.ledger.finished
        for event in events:
            member, config = event.member, _config_id(event.member)
            if not _is_search_member(member):
                continue
            if event.kind is EventKind.RESULT:
                if member == config:
                    self.inner.on_trial_result(member, event.result)
                continue
            repeats = [_repeat_id(config, s) for s in range(self.transfer.seeds)]
            if config in self.state.transfer.forwarded or any(m not in finished for m in repeats):
                continue  # the last seed to finish completes the configuration
            self.state.transfer.forwarded.add(config)
            score = Score.of((finished[m] or {}).get(self.spec.metric) for m in repeats)
            result = finished[config]
            if result is not None and score is not None and self.transfer.seeds > 1:
                result = {**result, self.spec.metric: score.mean}
            if result and result.get("stopped") is True and _prunes(self.inner):
                self.inner.on_trial_result(config, result)  # its last value, then no final result:
                self.inner.on_trial_complete(config, result=None)  # Optuna records PRUNED with that value
            else:
                self.inner.on_trial_complete(config, result=result, error=config in self.state.ledger.failed)


def _repeat_id(member: str, seed: int) -> str:
    """Member id of seed ``seed`` of ``member``'s configuration (seed 0: the member itself)."""
    return member if seed == 0 else f"{member}#{seed}"


def _member_scale(member: str, search_scale: int) -> int:
    """The scale a member trains at: its ladder rung's (``<id>@<scale>``), else the search's."""
    _, at, rest = member.partition("@")
    return int(rest.split("#")[0]) if at else search_scale


def _config_id(member: str) -> str:
    """The search member whose configuration ``member`` trains."""
    return member.split("#")[0].split("@")[0]


def _is_search_member(member: str) -> bool:
    """Whether ``member`` trains at the search's scale (not a ladder member)."""
    return "@" not in member


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
