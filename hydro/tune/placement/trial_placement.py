"""Placement of a Ray Tune run's fused trials on the cluster's GPU types (``fit(..., placement="elastic")``).

:class:`TrialPlacement` gives each trial the ``HydroSearcher`` hands to Tune a GPU type
(:class:`~schedulers.placement.predicted_finish.PredictedFinish`: where it is predicted to finish first), and the
trial's config carries the resources to ask for (:class:`~hydro.tune.placement.gpu_types.TypeRequest`, which the
trainable adds to its bundle), so Tune starts it on a node of that type. A trial's step is predicted by a
step-time model fitted once in this process on the first trial's member (its layers' work per member and per-call
overheads), at each type's assumed speed (:func:`~hydro.tune.placement.gpu_types.prior_type`); the step times
the trials report (training seconds per epoch ÷ batches per epoch) correct each type's prediction from then on.

With energy measured (``energy_eta``: ``hydro tune --energy``), the energy windows the trials report fit an MC2
energy model per type (:class:`~schedulers.placement.energy_choice.EnergyChoice`); once every type has one, a trial
goes to the type of least predicted cost ``η·E + (1−η)·MaxPower·T`` instead, and until then to a type not measured
yet where it could cost least (:meth:`~schedulers.placement.energy_choice.EnergyChoice.explore`), so that every
type gets one. With bubble filling (``bubbles``), only the full-size targets are placed: the search's and the
ladder's trials fill the pipeline jobs' bubbles on the jobs' own devices (or the placement service's dedicated
workers), where no GPU type is chosen.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping

import torch

from hydro.profiling import fit_step_time_model, step_features
from hydro.trial.data import DataSource
from hydro.trial.plan import TrialKind, TrialPlan, plan_of, reported_plan
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member
from hydro.tune.placement.gpu_types import (PLACEMENT_KEY, TypeRequest, cluster_gpu_types, prior_type,
                                           require_gpu_types)
from schedulers.placement.energy_choice import EnergyChoice, EpochEnergy, stage_windows
from schedulers.placement.predicted_finish import Choice, PredictedFinish
from schedulers.prediction.step_time import StepTimeModel

logger = logging.getLogger(__name__)

ELASTIC = "elastic"
PLACEMENTS = (ELASTIC,)


def check_placement(placement: str | None, spec: TuneSpec, data: tuple[DataSource, DataSource], *,
                    local_cluster: bool = False) -> None:
    """Raise ``ValueError`` for a ``placement`` that cannot act: an unknown one, one on a cluster Hydro would start
    on this machine (``local_cluster``) when it has no GPU (such a cluster has no GPU type), or a training split
    whose batches per epoch are unknown (an iterable dataset: no trial's steps can be predicted)."""
    if placement is None:
        return
    if placement not in PLACEMENTS:
        raise ValueError(f"hydro: placement must be None or one of {list(PLACEMENTS)}, got {placement!r}")
    if local_cluster and not torch.cuda.is_available():
        raise ValueError("hydro: placement='elastic' (--placement elastic) places trials on the GPU types of a "
                         "cluster's nodes, and the cluster Hydro starts on this machine has none (no GPU here); "
                         "connect to a cluster whose nodes declare them (ray start --resources "
                         "'{\"hydro_gpu:<type>\": <count>}'; --address, or ray.init(address=...) before fit)")
    if data[0].num_batches(spec.batch_size) is None:
        raise ValueError("hydro: placement='elastic' (--placement elastic) predicts each trial's steps from the "
                         "training split's batches per epoch, which an iterable dataset does not know; give a "
                         "sized dataset or leave placement unset")


class TrialPlacement:
    """Chooses the GPU type of each trial of a run of ``spec`` on the connected Ray cluster (see the module
    docstring). ``energy_eta``: the run measures energy (``EnergySettings.eta``), and placement weighs it at that
    weight; ``bubbles``: the run fills pipeline bubbles, and only its targets are placed. ``choices``: trial id ->
    where it was placed, and its predicted finish on each type; ``energy``: the energy windows and models per type
    (``None`` without ``energy_eta``)."""

    def __init__(self, spec: TuneSpec, data: tuple[DataSource, DataSource] | None = None, *,
                 energy_eta: float | None = None, bubbles: bool = False) -> None:
        self.spec, self._data, self.bubbles = spec, data, bubbles
        self.finish: PredictedFinish | None = None
        self.requests: dict[str, TypeRequest] = {}
        self.choices: dict[str, Choice] = {}
        self.model: StepTimeModel | None = None
        self.energy = None if energy_eta is None else EnergyChoice(energy_eta)
        self._reported: dict[str, tuple[int, float]] = {}  # trial id -> (epochs, training seconds) last reported
        self._metered: dict[str, EpochEnergy] = {}  # trial id -> its energy report last seen
        self._batch: dict[str, int] = {}  # trial id -> its batch size

    def place(self, trial_id: str, config: dict) -> dict:
        """``config`` (a trial's, from the searcher) with the GPU type chosen for it (:data:`PLACEMENT_KEY`);
        with ``bubbles``, a trial that fills bubbles as it is."""
        plan = plan_of(config)
        if self.bubbles and plan.kind is not TrialKind.TARGET:
            return config
        if self.finish is None:
            types = require_gpu_types()
            self.requests = {gpu: request for gpu, (_, request) in types.items()}
            self.finish = PredictedFinish({gpu: prior_type(gpu) for gpu in types},
                                          {gpu: count for gpu, (count, _) in types.items()})
        work, overhead = self._work(plan)
        steps, batch = self.spec.epochs * self._steps_per_epoch(plan), self.spec.batch_size_of(plan.members[0][1])
        choice = self.finish.choose(trial_id, work, len(plan.members), steps, overhead)
        why = "predicted finish " + ", ".join(f"{gpu} {s:.3g} s" for gpu, s in sorted(choice.finish_s.items()))
        if self.energy is not None:
            gpu = choice.gpu
            if (ranking := self.energy.rank(choice.finish_s, choice.step_s, steps, batch)) is not None:
                gpu = ranking.gpu
                why += "; predicted cost " + ", ".join(f"{g} {j:.3g} J" for g, j in sorted(ranking.cost_j.items()))
            elif (explored := self.energy.explore(choice.finish_s, {
                    placed.gpu for key, placed in self.finish.trials.items() if key != trial_id})) is not None:
                gpu = explored
                why += f"; no energy model of {gpu} yet: this trial measures it"
            self.finish.move(trial_id, gpu)
            choice = Choice(gpu, choice.finish_s, choice.step_s)
        self.choices[trial_id], self._batch[trial_id] = choice, batch
        logger.info("trial %s (%d members) placed on %s: %s", trial_id, len(plan.members), choice.gpu, why)
        return {**config, PLACEMENT_KEY: self.requests[choice.gpu]}

    def gpus(self) -> int:
        """GPUs of every type in the cluster (each runs one trial at a time)."""
        return sum(count for count, _ in cluster_gpu_types().values())

    def on_result(self, trial_id: str, result: Mapping, members: int) -> None:
        """Trial ``trial_id`` reported ``result`` (its cumulative ``train_s`` after ``training_iteration``
        epochs) with ``members`` live members: its position, and its step time (and energy) over the epochs since
        its last report, trained by the members it had then."""
        if self.finish is None or trial_id not in self.finish.trials or "train_s" not in result:
            return
        trained = self.finish.trials[trial_id].members  # live during the epochs since the last report
        epochs, seconds = int(result.get("training_iteration", 0)), float(result["train_s"])
        last_epochs, last_seconds = self._reported.get(trial_id, (0, 0.0))
        self._reported[trial_id] = (epochs, seconds)
        per_epoch = self.finish.trials[trial_id].steps // self.spec.epochs
        measured = (seconds - last_seconds) / ((epochs - last_epochs) * per_epoch) if epochs > last_epochs else None
        self.finish.progress(trial_id, epochs * per_epoch, max(1, members), measured)
        if self.energy is not None and "energy_j" in result:
            self._record_energy(trial_id, result, epochs, per_epoch, trained)

    def end(self, trial_id: str) -> None:
        """Trial ``trial_id`` ended: its GPU is free."""
        if self.finish is not None:
            self.finish.end(trial_id)
        for held in (self._reported, self._metered, self._batch):
            held.pop(trial_id, None)

    def _record_energy(self, trial_id: str, result: Mapping, epochs: int, per_epoch: int, members: int) -> None:
        """The energy windows of trial ``trial_id`` since its last report, for its type's energy model; its batch
        size (and so its steps per epoch) as it trained: the energy bandit may have changed the one it was placed
        with (the result's config has the trial's own)."""
        batch = self._batch[trial_id]
        if (plan := reported_plan(result)) is not None:
            batch, per_epoch = self.spec.batch_size_of(plan.members[0][1]), self._steps_per_epoch(plan)
        train_s = float(result["train_s"])
        now = EpochEnergy(epochs, float(result["energy_j"]), float(result["time_s"]), train_s,
                          float(result.get("data_wait_fraction", 0.0)) * train_s)
        before = self._metered.get(trial_id, EpochEnergy(0, 0.0, 0.0, 0.0, 0.0))
        self._metered[trial_id] = now
        self.energy.record(self.choices[trial_id].gpu, stage_windows(before, now, per_epoch, batch, members))

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None}  # loaded again where needed

    def _steps_per_epoch(self, plan: TrialPlan) -> int:
        return self._loaded()[0].num_batches(self.spec.batch_size_of(plan.members[0][1]))

    def _work(self, plan: TrialPlan) -> tuple[float, float]:
        """(work per member, per-call overheads) of one step of ``plan``, in seconds on this process's device."""
        config = plan.members[0][1]
        member = build_member(self.spec.model, config, plan.scale, mup=plan.mup or plan.scale > 1,
                              shrink_options=self.spec.shrink_options())
        x, _ = self._loaded()[0].sample(self.spec.batch_size_of(config))
        if self.model is None:
            self.model = fit_step_time_model(member, x, members=(1, 4))
        features = step_features(member, x)
        work = self.model.work_seconds(features, 1)
        return work, self.model.step_seconds(features, 1) - work

    def _loaded(self) -> tuple[DataSource, DataSource]:
        if self._data is None:
            self._data = self.spec.load_data()
        return self._data
