"""Merging the survivors of a Tune run's fused trials into one trial (``placement="elastic"``).

After each report of a search trial, :class:`TrialMerging` asks :class:`~schedulers.placement.trial_merge.MergeRule`
whether running trials of one fused group now fit one trial and merging them pays (it frees GPUs and the merged
trial is predicted, by the run's :class:`~schedulers.placement.predicted_finish.PredictedFinish`, to finish no
later). A merge is posted to the run's :class:`HandoverBox` (a named actor): each of its trials checks the box
after each report is processed (:func:`hand_over_if_due`), hands over its exact state (weights, optimizer state,
surviving member ids, epoch, RNG state) at the merge's epoch boundary and ends, freeing its GPU. Once every trial
of the merge has handed over or left it, the next trial Tune asks for continues the union of the handed-over
members from those states (:func:`merged_state`, :func:`hydro.trial.merge.merge_states`). A trial that passed the
merge's epoch, failed or was lost before handing over leaves the merge: its members go on as they would have
without it (in their trial, or as the run's fault handling decides), and a merge that nobody handed over to is
dropped.
"""
from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import ray
import torch
from ray import tune

from hydro.trial.merge import merge_states
from hydro.trial.plan import plan_of
from hydro.trial.unit import FusedTrial
from hydro.tune.placement.gpu_types import PLACEMENT_KEY
from hydro.tune.placement.trial_placement import TrialPlacement
from schedulers.placement.trial_merge import (MergeCandidate, MergeRule, finish_alone_s, merged_finish_s,
                                              park_members)
from schedulers.search_driver import SearchDriver

logger = logging.getLogger(__name__)

HANDOVER_KEY = "hydro_handover"  # a search trial's config entry: the name of the box it checks after each report
MERGED_KEY = "hydro_merged"  # a merged trial's config entry: (box name, merge id) whose states it continues from


@ray.remote(num_cpus=0, max_restarts=0)
class HandoverBox:
    """The run's pending merges and the states their trials handed over (serialized ``FusedTrial`` states)."""

    def __init__(self) -> None:
        self.epochs: dict[str, int] = {}  # merge id -> its epoch boundary
        self.of_trial: dict[str, str] = {}  # trial id -> the merge it is in (until it hands over or leaves)
        self.states: dict[str, dict[str, bytes]] = {}  # merge id -> trial id -> state
        self.left: dict[str, list[str]] = {}  # merge id -> trials that left it

    def add(self, merge: str, trials: list[str], epoch: int) -> None:
        self.epochs[merge] = epoch
        self.states[merge], self.left[merge] = {}, []
        self.of_trial.update(dict.fromkeys(trials, merge))

    def due(self, trial: str, epoch: int) -> bool:
        """Whether ``trial``, at epoch boundary ``epoch``, hands over now; past its merge's boundary, it leaves."""
        merge = self.of_trial.get(trial)
        if merge is None or epoch < self.epochs[merge]:
            return False
        if epoch > self.epochs[merge]:
            self.leave(trial)
            return False
        return True

    def hand_over(self, trial: str, state: bytes) -> str | None:
        """Keep ``trial``'s ``state`` for its merge; returns ``None``, or why it cannot continue as one with the
        states handed over before (:func:`~hydro.trial.merge.merge_states` refuses them): then ``trial`` leaves
        the merge instead."""
        merge = self.of_trial[trial]
        try:
            merge_states([_loaded(s) for s in (*self.states[merge].values(), state)])
        except ValueError as error:
            self.leave(trial)
            return str(error)
        del self.of_trial[trial]
        self.states[merge][trial] = state
        return None

    def leave(self, trial: str) -> None:
        """``trial`` will not hand over (a no-op once it has)."""
        merge = self.of_trial.pop(trial, None)
        if merge is not None:
            self.left[merge].append(trial)

    def status(self, merge: str) -> tuple[list[str], list[str]]:
        """(trials that handed over, trials that left) of ``merge``."""
        return list(self.states[merge]), list(self.left[merge])

    def handed_over(self, merge: str) -> list[bytes]:
        return list(self.states[merge].values())


@dataclass
class MergeRecord:
    """A merge of the run: ``trials`` hand over at ``epoch`` and continue as ``trial`` (once started), predicted to
    finish in ``finish_s`` s instead of ``alone_s`` s; ``handed``: trials that handed over (in the order of their
    states), ``members`` theirs; ``left``: trials that left it; ``dropped``: nobody handed over."""

    id: str
    key: object
    trials: tuple[str, ...]
    epoch: int
    finish_s: float
    alone_s: float
    handed: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    configs: dict[str, dict] = field(default_factory=dict)  # handed trial -> its config
    left: list[str] = field(default_factory=list)
    trial: str | None = None
    dropped: bool = False

    @property
    def pending(self) -> bool:
        return self.trial is None and not self.dropped

    @property
    def placeholder(self) -> str:
        """The member ledger's entry holding the handed-over members until the merged trial starts."""
        return f"merge:{self.id}"


class TrialMerging:
    """The merges of one run whose trials ``placement`` places (see the module docstring); ``merges``: every merge
    decided, in order (kept with the run's results)."""

    def __init__(self, placement: TrialPlacement, epochs: int, box_name: str, rule: MergeRule | None = None) -> None:
        self.placement, self.epochs, self.box_name = placement, epochs, box_name
        self.rule = rule or MergeRule()
        self.merges: list[MergeRecord] = []
        self._live: dict[str, tuple[int, int]] = {}  # search trial id -> (live members, last reported epoch)
        self._box = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_box": None}

    def trial_config(self, config: dict) -> dict:
        """A search trial's ``config`` with the box it checks (started here, before the trial looks it up)."""
        self.box()
        return {**config, HANDOVER_KEY: self.box_name}

    def on_result(self, trial_id: str, result: Mapping, driver: SearchDriver) -> None:
        """Trial ``trial_id`` reported ``result`` (being processed now): decide the merges it makes possible."""
        finish = self.placement.finish
        if (finish is None or trial_id not in finish.trials or trial_id not in driver.state.trial_groups
                or self._merging(trial_id)):
            return  # not a running search trial (an ended one's last result comes again at its completion)
        self._live[trial_id] = (int(result.get("live_members", 0)), int(result.get("epoch", 0)))
        candidates = [MergeCandidate(t, driver.state.trial_groups[t], live, epoch, t == trial_id,
                                     finish_alone_s(finish, t, max(1, live)))
                      for t, (live, epoch) in self._live.items() if t in finish.trials and not self._merging(t)]
        pool = driver.state.pool
        horizon = max((finish_alone_s(finish, t, max(1, self._live[t][0]) if t in self._live else None)
                       for t in finish.trials), default=0.0)
        merges = self.rule.plan(candidates, lambda key: min(pool.fusion.get(key, pool.max_fusion), pool.max_fusion),
                                self.epochs, lambda chosen, members, epoch: merged_finish_s(
                                    finish, [c.trial for c in chosen], members, epoch, self.epochs), horizon)
        for merge in merges:
            key = driver.state.trial_groups[merge.trials[0]]
            record = MergeRecord(f"{len(self.merges)}", key, merge.trials, merge.epoch, merge.finish_s, merge.alone_s)
            ray.get(self.box().add.remote(record.id, list(record.trials), record.epoch))
            self.merges.append(record)
            logger.info("merge %s: trials %s (%d members in all, group %s) hand over at epoch %d and continue as one "
                        "trial, freeing %d GPU(s): predicted finish %.3g s (alone: %.3g s)", record.id,
                        ", ".join(merge.trials), merge.members, key, merge.epoch, len(merge.trials) - 1,
                        merge.finish_s, merge.alone_s)

    def on_complete(self, trial_id: str, config: dict | None, driver: SearchDriver) -> None:
        """Trial ``trial_id`` (given ``config``) ended: if it handed over, its unfinished members wait in the member
        ledger for the merged trial; otherwise it leaves its merge."""
        self._live.pop(trial_id, None)
        record = self._merging(trial_id)
        if record is None:
            return
        handed, _ = ray.get(self.box().status.remote(record.id))
        if trial_id not in handed:
            ray.get(self.box().leave.remote(trial_id))
            record.left.append(trial_id)
            logger.warning("merge %s: trial %s ended without handing over its members; they go on without the "
                           "merge", record.id, trial_id)
            return
        ledger = driver.state.ledger
        record.handed.append(trial_id)
        record.configs[trial_id] = config or {}
        record.members += park_members(ledger.trials, ledger.finished, trial_id, record.placeholder)
        driver.state.trial_seconds.pop(trial_id, None)  # its seconds trained members it no longer holds

    def next_config(self, trial_id: str, driver: SearchDriver) -> dict | None:
        """The config of a merge all of whose trials have handed over or left, for new trial ``trial_id``
        (``None``: none is ready)."""
        for record in self.merges:
            if not record.pending:
                continue
            handed, left = ray.get(self.box().status.remote(record.id))
            if any(t not in record.handed and t not in left for t in record.trials):
                continue  # a trial still trains towards the merge's epoch, or has handed over and not ended yet
            record.left = [t for t in record.trials if t in left]
            if not record.handed:
                record.dropped = True
                logger.warning("merge %s dropped: none of its trials handed over", record.id)
                continue
            return self._start(record, trial_id, driver)
        return None

    def pending(self) -> bool:
        """Whether a merge waits for its trials or its start."""
        return any(record.pending for record in self.merges)

    def restart_pending(self) -> list[tuple[str, dict]]:
        """After the run is restored (the states handed over were lost with its session): drop every pending merge,
        and return, per merge whose members some trials had handed over, (its member ledger entry, the config of a
        fresh trial that trains those members again from the start)."""
        restarts = []
        for record in self.merges:
            if not record.pending:
                continue
            record.dropped = True
            if record.members:
                config = self._config(record)
                del config[MERGED_KEY]
                restarts.append((record.placeholder, config))
                logger.warning("merge %s: the states trials %s handed over were lost with the run's earlier session; "
                               "members %s train again from the start", record.id, ", ".join(record.handed),
                               ", ".join(record.members))
        return restarts

    def box(self):
        if self._box is None:
            self._box = HandoverBox.options(name=self.box_name, get_if_exists=True).remote()
        return self._box

    def _start(self, record: MergeRecord, trial_id: str, driver: SearchDriver) -> dict:
        driver.rename_trial(record.placeholder, trial_id)
        driver.state.trial_groups[trial_id] = record.key
        record.trial = trial_id
        logger.info("merge %s: trial %s continues members %s of trials %s from their states at epoch %d%s",
                    record.id, trial_id, ", ".join(record.members), ", ".join(record.handed), record.epoch,
                    f" (trials {', '.join(record.left)} left the merge)" if record.left else "")
        return self._config(record)

    def _config(self, record: MergeRecord) -> dict:
        """The config of the trial that continues ``record``'s handed-over members (placed again by the searcher)."""
        base = record.configs[record.handed[0]]
        configs = {m: c for t in record.handed for m, c in plan_of(record.configs[t]).members}
        plan = dataclasses.replace(plan_of(base), members=[(m, configs[m]) for m in record.members])
        config = {k: v for k, v in base.items() if k != PLACEMENT_KEY}
        return {**config, **plan.to_config(), MERGED_KEY: (self.box_name, record.id)}

    def _merging(self, trial_id: str) -> MergeRecord | None:
        return next((r for r in self.merges if r.pending and trial_id in r.trials and trial_id not in r.left), None)


def hand_over_if_due(config: Mapping, trial: FusedTrial, refused: str | None = None) -> bool:
    """In a search trial of a run that merges (``config`` holds :data:`HANDOVER_KEY`): whether its merge is due at
    the trial's epoch boundary; if so its state is handed over (the trial then ends). A trial whose state cannot
    merge (:func:`~hydro.trial.merge.merge_states` refuses it, alone or with the states handed over before it:
    unfused members, fp16 loss scales, optimizers that differ; or ``refused``: why the caller's own state does not
    merge) leaves its merge and trains on."""
    name = config.get(HANDOVER_KEY)
    if name is None:
        return False
    try:
        box = ray.get_actor(name)
    except ValueError:  # a restored run's trial: its merges ended with the run's earlier session
        return False
    trial_id = tune.get_context().get_trial_id()
    if not ray.get(box.due.remote(trial_id, trial.epoch)):
        return False
    if refused is None:
        buffer = io.BytesIO()
        torch.save(trial.state_dict(), buffer)
        refused = ray.get(box.hand_over.remote(trial_id, buffer.getvalue()))  # when refused, it left the merge
        if refused is None:
            logger.info("trial %s handed over members %s at epoch %d", trial_id, ", ".join(trial.member_ids),
                        trial.epoch)
            return True
    else:
        ray.get(box.leave.remote(trial_id))
    logger.warning("trial %s does not hand over its members (it trains on alone): %s", trial_id, refused)
    return False


def merged_state(config: Mapping) -> dict | None:
    """A merged trial's starting state (``config`` holds :data:`MERGED_KEY`): the states its trials handed over,
    merged; ``None`` for any other trial."""
    if MERGED_KEY not in config:
        return None
    name, merge = config[MERGED_KEY]
    states = ray.get(ray.get_actor(name).handed_over.remote(merge))
    return merge_states([_loaded(s) for s in states])


def _loaded(state: bytes) -> dict:
    """A handed-over ``FusedTrial`` state, on the CPU."""
    return torch.load(io.BytesIO(state), map_location="cpu", weights_only=False)
