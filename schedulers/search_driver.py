"""The stage machine of a Hydro search (plain Python): which members each trial trains, from the search through
the width-ladder rungs to the full-size targets and the fallback targets, and what an inner searcher hears.

:class:`SearchDriver` holds the member pool, the member ledger and the transfer stages (:class:`DriverState`,
plain data to save and restore) and decides from plain inputs: trial ids, member results, trials' seconds and
the compute a :class:`Cluster` reports. Its decisions are :class:`StageTrial` values; a Ray adapter turns them
into trial configurations.

Early targets: once every trial of a surrogate rung has started and a trial slot is idle beside its stragglers, a
configuration that the full-size stage after the rung trains whatever the stragglers score starts its target there
(:mod:`schedulers.early_target` states the rule). The rung still closes on all its members and the stage after it is
decided as without the early start; a target it names that started early is not started again. Only certain
configurations start early, so every stage's scores and the returned configuration are those of waiting.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from schedulers.early_target import early_targets
from schedulers.halving_choice import auto_halving, reads_curves
from schedulers.member_id import MemberId
from schedulers.member_ledger import EventKind, MemberEvent, MemberLedger
from schedulers.member_pool import Member, MemberPool, Suggestion
from schedulers.rung_halving import RungHalving, milestones
from schedulers.transfer import AUTO, FULL_SIZE, Rung, RungKind, Score, TransferPolicy, scores_of
from schedulers.trial_slots import TRIAL_OVERHEAD_S, WARM_TRIAL_OVERHEAD_S, rung_trials, split_evenly


class Stage(enum.Enum):
    """Where a search is: its search members train (``SEARCH``), a ladder or escalation rung of surrogates
    (``RUNG``), the full-size targets (``TARGET``) or the fallback targets after a regressed one (``FALLBACK``)
    train, or every stage has closed (``DONE``)."""

    SEARCH = "search"
    RUNG = "rung"
    TARGET = "target"
    FALLBACK = "fallback"
    DONE = "done"


@dataclass(frozen=True)
class StageTrial:
    """A trial to start. ``members``: ``[(member id, config)]`` of a surrogate trial, or ``[(config id,
    config)]`` of a target (a full-size trial of that search member's configuration); ``scale``: their width
    divisor; ``cpus``: CPUs the trial trains with when a stage leaves trial slots idle (``None``: the trainable's
    request); ``reports_objective``: whether the trial-level objective is the best member's (search trials of a
    run without targets); ``halving``: which members of a rung trial stop at its milestone epochs (``None``: all
    train to the end); ``source``: a target's provenance (``member``, its surrogate score, ``scores`` per
    scale)."""

    stage: Stage
    members: list[Member]
    scale: int
    cpus: int | None = None
    reports_objective: bool = False
    source: dict = field(default_factory=dict)
    halving: RungHalving | None = None

    @property
    def is_target(self) -> bool:
        return self.stage in (Stage.TARGET, Stage.FALLBACK)


class Cluster(Protocol):
    """The compute a driver decides with, asked when it decides."""

    def trial_request(self) -> Mapping[str, float]:
        """One trial's resources (``{"CPU": ..., "GPU": ...}``; empty while unknown)."""

    def trial_slots(self) -> int:
        """How many trials train at once on separate compute."""

    def lone_trial_cpus(self) -> float:
        """The most CPUs one trial may train with while nothing else of the run trains: the CPUs of the largest
        node a trial can run on, less those its other processes (Ray's, the driver) need to stay responsive."""


@dataclass
class StageRun:
    """The transfer stage in progress: its ``rung``, its surrogate ``members`` (none for targets), its fused
    groups or target configurations not yet started (``waiting``), and the CPUs each of its trials asks for
    (``None``: the trainable's request)."""

    rung: Rung
    members: list[str]
    waiting: list[list[Member]]
    cpus: int | None = None


@dataclass
class DriverState:
    """Everything a :class:`SearchDriver` decides from: what saving it writes.

    ``pool``/``ledger``: the members drawn and their results; ``trial_groups``: surrogate search trial -> its
    members' group key; ``trial_seconds``: finished surrogate trial -> its seconds of training; ``stages``: scores
    of the finished stages (config id -> score), the search's first; ``current``: the stage in progress;
    ``targets``: full-size trial id -> config id (early ones included); ``target_values``: config id -> the final
    value of its target (``None``: failed before a report); ``forwarded``: configs whose completion the inner searcher heard;
    ``widened``: trials that train on more CPUs than the trainable's request; ``slots``: the trial slots the
    rungs fill (fixed when the stages start; 1 for GPU trials, whose time hardly grows with their members);
    ``started``: every trial of the stages has started; ``curves``: search member -> {milestone epoch: its
    objective then}, kept while the policy's rung halving is :data:`~schedulers.transfer.AUTO`; ``halving``: what
    that choice decided when the stages started (``None``: not decided)."""

    pool: MemberPool
    ledger: MemberLedger = field(default_factory=MemberLedger)
    trial_groups: dict = field(default_factory=dict)
    trial_seconds: dict[str, float] = field(default_factory=dict)
    stages: list[dict[str, Score]] = field(default_factory=list)
    current: StageRun | None = None
    targets: dict[str, str] = field(default_factory=dict)
    target_values: dict[str, float | None] = field(default_factory=dict)
    forwarded: set[str] = field(default_factory=set)
    widened: set[str] = field(default_factory=set)
    slots: int = 1
    started: bool = False
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    halving: bool | None = None


class SearchDriver:
    """The stages of one search.

    Args:
        policy: the transfer policy (its ``scale`` is the search's surrogate scale; ``slots`` set when the
            stages start).
        pool: the member pool to draw from.
        metric: the objective the members report.
        epochs: the epochs a member trains.
        group_key: the group key of a configuration (members that may share a fused trial).
        log: where the stages are logged.
    """

    def __init__(self, policy: TransferPolicy, pool: MemberPool, metric: str, epochs: int,
                 group_key: Callable[[dict], Hashable], log: logging.Logger | None = None) -> None:
        self.policy, self.metric, self.epochs, self.group_key = policy, metric, epochs, group_key
        self.policy = dataclasses.replace(policy, epochs=epochs)
        self.log = log or logging.getLogger(__name__)
        self.state = DriverState(pool)

    @property
    def stage(self) -> Stage:
        state = self.state
        if not state.stages:
            return Stage.SEARCH
        if state.current is None:
            return Stage.DONE
        rung = state.current.rung
        if rung.scale != FULL_SIZE:
            return Stage.RUNG
        return Stage.FALLBACK if rung.kind == RungKind.FALLBACK else Stage.TARGET

    def restore(self, state: DriverState) -> None:
        self.state = state
        self.policy = dataclasses.replace(self.policy, slots=state.slots)
        if state.halving is not None:
            self.policy = dataclasses.replace(self.policy, halving=state.halving)

    def use_scale(self, scale: int) -> None:
        """Train the search's surrogates at ``scale`` (a measured choice)."""
        self.policy = dataclasses.replace(self.policy, scale=scale)

    # --- trials ------------------------------------------------------------------------------------------

    def next_trial(self, trial_id: str, suggest: Callable[[str], dict | Suggestion],
                   fusion_of: Callable[[Hashable, dict], int], cluster: Cluster) -> StageTrial | None:
        """The next trial's members, ``trial_id`` its id (``None``: nothing to start now). ``suggest(member
        id)``: a configuration or a :class:`Suggestion`; ``fusion_of(key, config)``: the planned members per
        fused trial of a group."""
        state, policy = self.state, self.policy
        if state.stages or policy.due(self._search_finished(), self._nothing_left()):
            trial = self._stage_trial(trial_id, cluster)
            if trial is not None:
                return trial
        members = state.pool.draw(suggest, self.group_key, lambda key, config: max(1, min(
            fusion_of(key, config) // self.policy.seeds, self.search_share(cluster.trial_slots()))))
        if not members:
            return None
        members = [(str(MemberId(m, seed=s)), c) for m, c in members for s in range(self.policy.seeds)]
        state.ledger.add_trial(trial_id, [m for m, _ in members])
        state.trial_groups[trial_id] = self.group_key(members[0][1])
        return StageTrial(Stage.SEARCH, members, self.policy.scale, reports_objective=self.policy.fraction is None)

    def done(self) -> bool:
        """Whether no trial is left to start."""
        state = self.state
        return state.pool.exhausted and (self.policy.fraction is None or state.started
                                         or (not state.stages and not state.ledger.running()))

    def search_share(self, slots: int) -> int:
        """Configurations per fused trial of the search that spread it evenly over ``slots`` trial slots."""
        return -(-self.state.pool.num_samples // slots)

    def rename_trial(self, old: str, new: str) -> None:
        """Trial ``new`` trains what trial ``old`` (lost) trained."""
        state = self.state
        for table in (state.ledger.trials, state.trial_groups, state.targets):
            if old in table:
                table[new] = table.pop(old)
        if old in state.widened:
            state.widened.add(new)

    def trained_with(self, members: Iterable[Member]) -> None:
        """The configurations search members train with, as their trial runs them (a trial scheduler may set a
        key of a new trial's configuration, e.g. the energy bandit's batch size): the later stages (rungs,
        targets) train and group these. Members that are not search members are ignored."""
        configs = self.state.pool.configs
        for member, config in members:
            if member in configs:
                configs[member] = dict(config)

    # --- results -----------------------------------------------------------------------------------------

    def on_result(self, trial_id: str, members: Mapping[str, Mapping], cluster: Cluster,
                  seconds: float | None = None, fused_at_once: int | None = None) -> list[MemberEvent]:
        """A surrogate trial's report: ``members`` (member id -> metrics), its ``seconds`` of training so far, and
        the most members it ``fused_at_once`` (fewer than it holds: it ran out of memory). Returns what the inner
        searcher must hear (config ids)."""
        if trial_id in self.state.targets:
            return []  # its final value counts, at completion
        observed = self.state.ledger.observe(members)
        self._record_curves(observed)
        events = self._forward(observed)
        self._replan(trial_id, fused_at_once)
        if seconds is not None:  # counted once its members have all finished (see _rung_seconds)
            self.state.trial_seconds[trial_id] = seconds
        if self.state.current is not None:
            # A stage closes on its members' last results, before Tune completes their trials: Tune then holds
            # the next stage's trials when it stops these trials' workers, and keeps as many idle workers for
            # them (with none waiting, it keeps one, and the next stage's second trial waits for a new worker).
            self._advance(cluster)
        return events

    def on_target_complete(self, trial_id: str, value: float | None, cluster: Cluster) -> None:
        """Target trial ``trial_id`` ended with final objective ``value`` (``None``: no report)."""
        self.state.target_values[self.state.targets[trial_id]] = value
        if self.state.current is not None:  # an early target the stages did not choose may end after them
            self._advance(cluster)

    def on_trial_complete(self, trial_id: str, error: bool, cluster: Cluster) -> list[MemberEvent]:
        """Surrogate trial ``trial_id`` ended (``error``: in an error). Returns what the inner searcher must hear."""
        events = self._forward(self.state.ledger.trial_complete(trial_id, error))
        if self.state.current is not None:
            self._advance(cluster)
        return events

    def reject(self, member: str) -> list[MemberEvent]:
        """``member``'s configuration cannot train. Returns what the inner searcher must hear."""
        return self._forward([self.state.ledger.reject(member)])

    def best_member(self) -> str | None:
        """The search's configuration with the best finite objective (mean over its seeds)."""
        return self.policy.returned([self._search_scores()])

    def report(self) -> str:
        """The returned configuration's score at each scale it was trained at, and the transfer checks."""
        stages, policy = self.state.stages, self.policy
        config = policy.returned(stages)
        if config is None:
            return "no transfer stage has a score"
        trail = ", ".join(f"{'full size' if s == FULL_SIZE else f'S={s}'}: {score}"
                          for s, score in policy.trail(stages, config))
        checks = "; ".join(f"S={c.coarse} vs S={c.fine} over {c.configs} configurations: rho {c.rho:.2f}"
                           + (f" (95% upper bound {c.upper:.2f})" if math.isfinite(c.upper) else "")
                           + (" (LOW)" if c.low else "") for c in policy.checks(stages) if c.configs >= 3)
        return f"{self.metric} of the returned configuration {config} at each scale: {trail}" + \
            (f". Transfer check (Spearman): {checks}" if checks else "")

    # --- the stage machine ---------------------------------------------------------------------------------

    def _stage_trial(self, trial_id: str, cluster: Cluster) -> StageTrial | None:
        """The next trial of the transfer stages, or ``None`` (waiting for a stage, or all started)."""
        state = self.state
        if not state.stages:
            # the rungs' cut (TransferPolicy.slots) is for trials whose time grows with their members: CPU trials
            state.slots = 1 if cluster.trial_request().get("GPU", 0.0) else cluster.trial_slots()
            self.policy = dataclasses.replace(self.policy, slots=state.slots)
            state.stages.append(self._search_scores())
            self._choose_halving()
            self.log.info("transfer stages after the search: %s", self.policy.describe(len(state.stages[0])))
            self._advance(cluster)
        current = state.current
        if current is None or not current.waiting:
            return self._early_target(trial_id, cluster) if self.stage is Stage.RUNG else None
        stage, group = self.stage, current.waiting.pop(0)
        if current.cpus:
            state.widened.add(trial_id)
        if stage is Stage.RUNG:
            state.ledger.add_trial(trial_id, [m for m, _ in group])
            return StageTrial(stage, group, current.rung.scale, current.cpus, halving=self._halving(current, len(group)))
        ((config_id, config),) = group
        state.targets[trial_id] = config_id
        state.started = not current.waiting and self.policy.final(state.stages)
        self.log.info("training the full-size target with %s's configuration %s", config_id, config)
        return StageTrial(stage, group, FULL_SIZE, current.cpus, source=self._source(state.stages, config_id))

    def _early_target(self, trial_id: str, cluster: Cluster) -> StageTrial | None:
        """A full-size target started beside the rung's stragglers on a trial slot they leave idle, for a
        configuration the stage after the rung trains whatever the stragglers score (:mod:`schedulers.early_target`);
        ``None`` if there is none or no slot is idle."""
        state, current = self.state, self.state.current
        running = sum(any(m not in state.ledger.finished for m in ids) for ids in state.ledger.trials.values())
        if running + self._targets_running() >= cluster.trial_slots():
            return None
        finished = [m for m in current.members if m in state.ledger.finished]
        seeds = Counter(MemberId.parse(m).config for m in finished)
        finished = [m for m in finished if seeds[MemberId.parse(m).config] == current.rung.seeds]  # every seed
        partial = scores_of(((MemberId.parse(m).config, self._final_value(m)) for m in finished),
                            self._reached(finished))
        unfinished = len({MemberId.parse(m).config for m in current.members if m not in state.ledger.finished})
        configs = early_targets(self.policy, state.stages, current.rung.scale, partial, unfinished,
                                set(state.targets.values()))
        if not configs:
            return None
        config_id = configs[0]
        config = state.pool.configs[config_id]
        state.targets[trial_id] = config_id
        self.log.info("training the full-size target with %s's configuration %s beside %d trial(s) of the rung at "
                      "S=%d: the rung's unfinished configurations cannot change that it is among the top %d",
                      config_id, config, running, current.rung.scale, self.policy.top_k)
        return StageTrial(Stage.TARGET, [(config_id, config)], FULL_SIZE,
                          source=self._source([*state.stages, partial], config_id))

    def _source(self, stages: list[dict[str, Score]], config_id: str) -> dict:
        """A target's provenance: its configuration, its score at the finest scale of ``stages`` and per scale."""
        trail = self.policy.trail(stages, config_id)
        return {"member": config_id, self.metric: trail[-1][1].mean, "scores": {str(s): str(v) for s, v in trail}}

    def _targets_running(self) -> int:
        """Full-size targets started that have not ended."""
        return sum(c not in self.state.target_values for c in self.state.targets.values())

    def _advance(self, cluster: Cluster) -> None:
        """Close the stage in progress once all of it finished, and queue the next (or end the stages)."""
        state, current = self.state, self.state.current
        if current is not None:
            if current.waiting:
                return
            if current.rung.scale == FULL_SIZE:
                if any(c not in state.target_values for c in current.rung.configs):
                    return
                state.stages.append(scores_of((c, state.target_values[c]) for c in current.rung.configs))
            else:
                if any(m not in state.ledger.finished for m in current.members):
                    return
                state.stages.append(scores_of(((MemberId.parse(m).config, self._final_value(m))
                                               for m in current.members), self._reached(current.members)))
        rung = self.policy.next_rung(state.stages)
        if rung is None:
            state.current = None
            self._finish()
            return
        configs = {c: state.pool.configs[c] for c in rung.configs}
        if rung.scale == FULL_SIZE:  # a target started early is not started again
            waiting = [[(c, config)] for c, config in configs.items() if c not in state.targets.values()]
            state.current = StageRun(rung, [], waiting, self._stage_cpus(len(waiting), self._rung_seconds(
                1, FULL_SIZE), cluster) if waiting else None)
            if rung.kind == RungKind.FALLBACK:
                self.log.warning("transfer check: %s: training %d fallback target(s) at full size, %s, and returning "
                                 "the best full-size one", rung.why, len(configs), ", ".join(configs))
            if not waiting:  # all started early: the stage closes when they have ended
                state.started = self.policy.final(state.stages)
                self._advance(cluster)
            return
        members = [(str(MemberId(c, rung.scale, s)), config) for c, config in configs.items()
                   for s in range(rung.seeds)]
        groups: dict = {}
        for member in members:
            groups.setdefault(self.group_key(member[1]), []).append(member)
        slots = rung_trials(self._rung_seconds(len(members), rung.scale), cluster.trial_slots(),
                            self._spread_overhead(cluster.trial_slots()))
        size = min(max(1, state.pool.max_fusion), -(-len(members) // slots))
        waiting = [part for g in groups.values() for part in split_evenly(g, -(-len(g) // size))]
        cpus = self._stage_cpus(len(waiting), self._rung_seconds(max(map(len, waiting)), rung.scale), cluster)
        state.current = StageRun(rung, [m for m, _ in members], waiting, cpus)
        seeds = f" ({rung.seeds} seeds each)" if rung.seeds > 1 else ""
        trials = f" in {len(waiting)} fused trials" if len(waiting) > 1 else ""
        if rung.kind == RungKind.ESCALATION:
            self.log.warning("transfer check: %s: fidelity escalation: training the %d other configurations at S=%d"
                             "%s%s to rank all of them there, then the ladder again from there", rung.why,
                             len(configs), rung.scale, seeds, trials)
        else:
            self.log.info("width ladder: training %d configurations at S=%d%s%s", len(configs), rung.scale, seeds,
                          trials)

    def _halving(self, run: StageRun, members: int) -> RungHalving | None:
        """The halving of a trial of ``members`` of the rung ``run``: its share of the rung's survivors train to the
        end (rounded up); ``None`` when the rung does not halve."""
        survivors = run.rung.survivors
        if not survivors:
            return None
        return RungHalving.plan(members, -(-survivors * members // len(run.members)), self.epochs, self.policy.eta)

    def _halving_decided(self) -> bool:
        """Whether the rungs' halving is set (not :data:`~schedulers.transfer.AUTO`, or already chosen) or moot (an
        unshrunk search has no rungs, and its policy refuses a halving set away from the default)."""
        return self.policy.halving != AUTO or self.policy.scale == FULL_SIZE

    def _record_curves(self, events: list[MemberEvent]) -> None:
        """Keep the search members' objective at the rungs' milestone epochs while halving is to be chosen from
        them."""
        if self._halving_decided() or not reads_curves(self.policy):
            return
        at = set(milestones(self.epochs, self.policy.eta))
        for event in events:
            result = event.result or {}
            epoch, value = result.get("epoch", math.nan), result.get(self.metric, math.nan)
            if epoch in at and MemberId.parse(event.member).is_search and isinstance(value, (int, float)):
                self.state.curves.setdefault(event.member, {})[int(epoch)] = float(value)

    def _choose_halving(self) -> None:
        """Decide the rungs' halving where it is :data:`~schedulers.transfer.AUTO`, when the stages start: from the
        search members' curves (:func:`~schedulers.halving_choice.auto_halving`), off where no rung could halve
        (one scale, or seed repeats, whose rungs train whole)."""
        if self._halving_decided():
            return
        state, ledger = self.state, self.state.ledger
        final = {m: (r or {}).get(self.metric, math.nan) for m, r in ledger.finished.items()
                 if MemberId.parse(m).is_search and m not in ledger.failed
                 and (r or {}).get("epoch") == self.epochs}
        choice = auto_halving(self.policy, state.curves, final)
        self.log.info("rung halving %s: %s", "on" if choice.halving else "off", choice.reason)
        state.halving, state.curves = choice.halving, {}
        self.policy = dataclasses.replace(self.policy, halving=choice.halving)

    def _reached(self, members: list[str]) -> dict[str, int]:
        """The epoch each finished rung member's configuration was last measured after (its furthest seed)."""
        reached: dict[str, int] = {}
        for member in members:
            epoch = (self.state.ledger.finished.get(member) or {}).get("epoch", 0)
            config = MemberId.parse(member).config
            reached[config] = max(reached.get(config, 0), int(epoch) if math.isfinite(epoch) else 0)
        return reached

    def _finish(self) -> None:
        state, policy = self.state, self.policy
        state.started = True
        self.log.info(self.report())
        for check in policy.checks(state.stages):
            if check.low:
                self.log.warning("transfer check: the rankings at S=%d and S=%d disagree (Spearman %.2f over %d "
                                 "configurations, 95%% upper bound %.2f, below %.2f): the surrogates' choice may not "
                                 "hold at full size; use a smaller scale, seeds=, ladder=True or a larger top_k",
                                 check.coarse, check.fine, check.rho, check.configs, check.upper,
                                 policy.min_agreement)
        regression = policy.regression(state.stages)
        if regression is not None:
            self.log.warning("transfer check: the returned configuration %s scored %.4g at full size, %.1f%% worse "
                             "than at S=%d (%.4g): a full-size model should not do worse than its surrogate, so the "
                             "surrogates' choice may not hold at full size (seen on overfitting workloads); try a "
                             "smaller scale, top_k=2 or fallback_targets=2", regression.config,
                             regression.full_size, 100 * regression.drop, regression.scale, regression.surrogate)

    def _spread_overhead(self, slots: int) -> float:
        """Seconds one more trial of a rung costs: a warm worker's set-up once the run has had at least ``slots``
        trials of the trainable's request (Tune reuses their workers for the stages: ``HydroSearcher`` closes a
        stage on its results), else a fresh worker's start."""
        plain = sum(t not in self.state.widened for t in self.state.ledger.trials)
        return WARM_TRIAL_OVERHEAD_S if plain >= slots else TRIAL_OVERHEAD_S

    def _stage_cpus(self, trials: int, work_s: float | None, cluster: Cluster) -> int | None:
        """CPUs for each of a stage's ``trials`` (``work_s``: the longest one's estimated seconds of training in
        one slot) when they leave trial slots idle and nothing else trains: the idle slots' CPUs shared among them
        (torch threads; at most :meth:`Cluster.lone_trial_cpus`), so that a lone target trains on the cores the run's
        slots hold, when that saves more than a trial's start, as :func:`rung_trials` spreads a rung; ``None`` (the
        trainable's request) otherwise, for GPU trials (their GPU does the work) and while search members or targets
        still train."""
        request, slots = cluster.trial_request(), cluster.trial_slots()
        if trials >= slots or request.get("GPU", 0.0) or self.state.ledger.running() or self._targets_running():
            return None
        cpus = int(min(request.get("CPU", 1.0) * rung_trials(work_s, slots // trials, TRIAL_OVERHEAD_S),
                       cluster.lone_trial_cpus()))
        return cpus if cpus > request.get("CPU", 1.0) else None

    def _rung_seconds(self, members: int, scale: int) -> float | None:
        """Estimated seconds of training of ``members`` members at ``scale`` fused in one trial, from the finished
        trials at the finest scale so far whose members all finished without an error: their seconds per
        member-epoch trained (members stopped early count the epochs they trained; each epoch's fixed cost then
        falls on fewer member-epochs, an overestimate that favours spreading a rung), times (their scale /
        ``scale``)² (a layer's cost grows with the square of its width); ``None``: no such trial yet."""
        ledger, measured = self.state.ledger, {}
        for trial, seconds in self.state.trial_seconds.items():
            ids = ledger.trials.get(trial, [])
            if not ids or any(m in ledger.failed or m not in ledger.finished for m in ids):
                continue
            epochs = sum(int((ledger.finished[m] or {}).get("epoch", 0)) for m in ids)
            if not epochs:
                continue
            total = measured.setdefault(MemberId.parse(ids[0]).scale_or(self.policy.scale), [0.0, 0])
            total[0], total[1] = total[0] + seconds, total[1] + epochs
        if not measured:
            return None
        finest = min(measured)
        seconds, member_epochs = measured[finest]
        return seconds / member_epochs * (finest / scale) ** 2 * members * self.epochs

    def _replan(self, trial_id: str, fused_at_once: int | None) -> None:
        """A surrogate trial that ran out of memory trained its members in smaller fused chunks: later trials of
        its group get at most that many members. A trial that holds fewer members than planned (the last of a
        group, or the search's even share per slot) fuses all of them: that is no shortage of memory."""
        state = self.state
        key = state.trial_groups.get(trial_id)
        planned, held = state.pool.fusion.get(key), len(state.ledger.trials.get(trial_id, ()))
        if fused_at_once is not None and planned is not None and fused_at_once < min(planned, held):
            self.log.warning("group %s ran out of memory at %d fused members: its later trials get %d",
                             key, min(planned, held), fused_at_once)
            state.pool.fusion[key] = fused_at_once

    def _forward(self, events: list[MemberEvent]) -> list[MemberEvent]:
        """What the inner searcher must hear of ``events``, each under the id of the search member it drew: the
        first seed's intermediate results, and once all its seeds finished, the final result with the objective
        averaged over them (ladder members are not the inner searcher's)."""
        state, seeds, heard = self.state, self.policy.seeds, []
        finished = state.ledger.finished
        for event in events:
            member = MemberId.parse(event.member)
            config = member.config
            if not member.is_search:
                continue
            if event.kind is EventKind.RESULT:
                if member.seed == 0:
                    heard.append(event)
                continue
            repeats = [str(member.repeat(s)) for s in range(seeds)]
            if config in state.forwarded or any(m not in finished for m in repeats):
                continue  # the last seed to finish completes the configuration
            state.forwarded.add(config)
            score = Score.of((finished[m] or {}).get(self.metric) for m in repeats)
            result = finished[config]
            if result is not None and score is not None and seeds > 1:
                result = {**result, self.metric: score.mean}
            heard.append(MemberEvent(config, EventKind.COMPLETE, result, error=config in state.ledger.failed))
        return heard

    def _search_scores(self) -> dict[str, Score]:
        """Each finished search configuration's score over its finished seeds."""
        return scores_of((MemberId.parse(m).config, self._final_value(m)) for m in self.state.ledger.finished
                         if MemberId.parse(m).is_search)

    def _final_value(self, member: str) -> float | None:
        """A finished member's final objective; ``None`` for a failed member (its last result before the error
        does not make its configuration a candidate for the transfer stages: it would fail there again)."""
        ledger = self.state.ledger
        return None if member in ledger.failed else (ledger.finished[member] or {}).get(self.metric)

    def _nothing_left(self) -> bool:
        return self.state.pool.exhausted and not self.state.ledger.running()

    def _search_finished(self) -> dict[str, dict | None]:
        """Final results of the finished search members (first seeds), for when the stages are due."""
        return {m: r for m, r in self.state.ledger.finished.items() if m in self.state.pool.configs}
