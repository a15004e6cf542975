"""The Ray Tune function trainable: trains one trial's members and reports per-member metrics every epoch.

Surrogate trials (from a ``HydroSearcher``) train their members fused and shrunk; after each epoch the
run's member-decision service says which members stop, and those are sliced out with their state
(``hydro.keep_members``). Target and plain trials train one full-size model with the user's own torch
optimizer, except the target of a shrunk (µP) run: ``hydro.shrink(model, 1)`` with the translated
``hydro.optim`` optimizer, which applies the µP multipliers. Every ``TuneSpec.checkpoint_every`` epochs,
and after the last, a checkpoint holds member weights, optimizer state, surviving member ids, epoch and
RNG states, so a retried or restored trial resumes from there: it replays the epochs after it exactly
(same batches, same decisions), and the searcher keeps the first report of each member's epoch.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable

import torch
from ray import tune

from hydro.tune.epoch import evaluate, train_epoch
from hydro.tune.members import build_members
from hydro.tune.session import MemberSession
from hydro.tune.spec import TRAIN_LOSS, Batch, TuneSpec

STATE_FILE = "hydro_trial.pt"


def trainable(spec: TuneSpec, data: tuple[Batch, Batch] | None = None) -> Callable[[dict], None]:
    """A function trainable for ``tune.Tuner``/``tune.run``: Hydro trials when the config comes from a
    ``HydroSearcher``, one plain full-size unfused training otherwise (the stock Ray Tune baseline).

    ``data``: ``spec.load_data()`` already loaded by the driver; it is put in Ray's object store once
    (``tune.with_parameters``, so Ray must be initialised) instead of every trial loading it. Without it,
    each trial calls ``spec.load_data()``."""
    if data is None:
        def hydro_trial(config: dict) -> None:
            run_trial(spec, config)

        return hydro_trial

    def hydro_trial(config: dict, data: tuple[Batch, Batch]) -> None:  # the same name: restorable either way
        run_trial(spec, config, data)

    return tune.with_parameters(hydro_trial, data=data)


def run_trial(spec: TuneSpec, config: dict, data: tuple[Batch, Batch] | None = None) -> None:
    """Train the trial described by ``config`` (see :mod:`hydro.tune.trial_config`) for ``spec.epochs`` on
    ``data`` (default: ``spec.load_data()``)."""
    state = _restored_state()
    session = MemberSession(config, spec.metric, spec.mode, state["member_ids"] if state else None)
    train, val = data if data is not None else spec.load_data()
    batch_size = spec.batch_size_of(session.configs[0])
    members, fallback = build_members(spec, session.configs, session.member_ids, session.scale,
                                      fuse=session.plan.fused, mup=session.mup)
    if fallback:
        print(f"hydro: training {len(session.member_ids)} members unfused (fallback_unfused): {fallback}")
    data_rng = torch.Generator().manual_seed(spec.seed)
    first_epoch = 1
    if state:
        members.load_state_dict(state["members"])
        data_rng.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        first_epoch = state["epoch"] + 1
    for epoch in range(first_epoch, spec.epochs + 1):
        train_loss = train_epoch(members, train, batch_size, spec.loss, data_rng)
        evaluated = evaluate(members, val, batch_size, spec.loss, spec.metrics)
        keep = session.step(epoch, {TRAIN_LOSS: train_loss, **evaluated}, final=epoch == spec.epochs,
                            extra={"fused": members.fused})
        if keep and len(keep) < len(members.member_ids):
            members.keep(keep)
        if keep and epoch % spec.checkpoint_every:  # keep is empty after the trial's last epoch
            session.report()
        else:
            with tempfile.TemporaryDirectory() as directory:
                torch.save({"member_ids": members.member_ids, "members": members.state_dict(), "epoch": epoch,
                            "data_rng": data_rng.get_state(), "torch_rng": torch.get_rng_state()},
                           os.path.join(directory, STATE_FILE))
                session.report(checkpoint=tune.Checkpoint.from_directory(directory))
        if not keep:
            return


def _restored_state() -> dict | None:
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), weights_only=False)
