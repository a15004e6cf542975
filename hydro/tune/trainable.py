"""The Ray Tune function trainable: trains one trial's members (the fused-trial unit,
:class:`hydro.trial.unit.FusedTrial`) and reports per-member metrics every epoch.

Surrogate trials (from a ``HydroSearcher``) train their members fused and shrunk; after each epoch the
run's member-decision service says which members stop, and those are sliced out with their state
(``hydro.keep_members``). Target and plain trials train one full-size model with the user's own torch
optimizer, except the target of a shrunk (µP) run: ``hydro.shrink(model, 1)`` with the translated
``hydro.optim`` optimizer, which applies the µP multipliers. Every ``TuneSpec.checkpoint_every`` epochs,
and after the last, a checkpoint holds the unit's state (member weights, optimizer state, surviving member
ids, epoch, RNG state), so a retried or restored trial resumes from there: it replays the epochs after it exactly
(same batches, same decisions), and the searcher keeps the first report of each member's epoch.
"""
from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable

import torch
from ray import tune

from hydro.energy.observer import EnergyObserver
from hydro.energy.tuning import EnergySettings, trial_observer
from hydro.trial.check import CONFIG_ERRORS
from hydro.trial.spec import Batch, TuneSpec
from hydro.trial.unit import FusedTrial
from hydro.tune.session import MemberSession

logger = logging.getLogger(__name__)

STATE_FILE = "hydro_trial.pt"


def trainable(spec: TuneSpec, data: tuple[Batch, Batch] | None = None,
              energy: EnergySettings | None = None) -> Callable[[dict], None]:
    """A function trainable for ``tune.Tuner``/``tune.run``: Hydro trials when the config comes from a
    ``HydroSearcher``, one plain full-size unfused training otherwise (the stock Ray Tune baseline).

    ``data``: ``spec.load_data()`` already loaded by the driver; it is put in Ray's object store once
    (``tune.with_parameters``, so Ray must be initialised) instead of every trial loading it. Without it,
    each trial calls ``spec.load_data()``. ``energy``: measure each trial's energy (``hydro tune --energy``)."""
    if data is None:
        def hydro_trial(config: dict) -> None:
            run_trial(spec, config, energy=energy)

        return hydro_trial

    def hydro_trial(config: dict, data: tuple[Batch, Batch]) -> None:  # the same name: restorable either way
        run_trial(spec, config, data, energy)

    return tune.with_parameters(hydro_trial, data=data)


def run_trial(spec: TuneSpec, config: dict, data: tuple[Batch, Batch] | None = None,
              energy: EnergySettings | None = None) -> None:
    """Train the trial described by ``config`` (see :mod:`hydro.trial.plan`) for ``spec.epochs`` on ``data``
    (default: ``spec.load_data()``). With ``energy``, an :class:`~hydro.energy.observer.EnergyObserver` measures
    it: each member reports its ``energy_j``/``cost`` share, the trial its totals and ``member_epoch_cost``."""
    state = _restored_state()
    session = MemberSession(config, spec.metric, spec.mode, state["member_ids"] if state else None)
    try:
        trial = FusedTrial(spec, session.plan, data if data is not None else spec.load_data(),
                           member_ids=session.member_ids)
    except CONFIG_ERRORS as error:  # deterministic: reported as failed members, not raised for Tune to retry
        session.fail(error)
        return
    if trial.fallback:
        logger.warning("training %d members unfused (fallback_unfused): %s", len(trial.member_ids), trial.fallback)
    if state:
        trial.load_state_dict(state)
    meter = None if energy is None else trial_observer(energy, trial).start()
    try:
        if meter is not None:
            trial.observers.append(meter)
            if state and "energy" in state:
                meter.load_state_dict(state["energy"])
        _train(spec, trial, session, meter)
    finally:
        if meter is not None:
            meter.close()


def _train(spec: TuneSpec, trial: FusedTrial, session: MemberSession, meter: EnergyObserver | None) -> None:
    while trial.epoch < spec.epochs:
        metrics, extra = trial.run_epoch(), {"fused": trial.fused}
        if meter is not None:
            metrics = {**metrics, **meter.member_metrics(trial.member_ids)}
            extra.update(meter.trial_metrics())
        keep = session.step(trial.epoch, metrics, final=trial.epoch == spec.epochs, extra=extra)
        if keep and len(keep) < len(trial.member_ids):
            trial.keep(keep)
        if keep and trial.epoch % spec.checkpoint_every:  # keep is empty after the trial's last epoch
            session.report()
        else:
            with tempfile.TemporaryDirectory() as directory:
                state = trial.state_dict() if meter is None else {**trial.state_dict(), "energy": meter.state_dict()}
                torch.save(state, os.path.join(directory, STATE_FILE))
                session.report(checkpoint=tune.Checkpoint.from_directory(directory))
        if not keep:
            return


def _restored_state() -> dict | None:
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), weights_only=False)
