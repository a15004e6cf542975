"""The Ray Tune function trainable: trains one trial's members and reports per-member metrics every epoch.

Surrogate trials (from a ``HydroSearcher``) train their members fused and shrunk; after each epoch the
run's member-decision service says which members stop, and those are sliced out with their state
(``hydro.keep_members``). Target and plain trials train one full-size model with the user's own torch
optimizer, except the target of a shrunk (µP) run: ``hydro.shrink(model, 1)`` with the translated
``hydro.optim`` optimizer, which applies the µP multipliers. Every epoch ends with a checkpoint: member weights, optimizer state, surviving member ids,
stopped members, epoch and RNG states, so a retried or restored trial resumes where it was.
"""
from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable

import ray
import torch
from ray import tune

from hydro.tune.decisions import lookup_service
from hydro.tune.epoch import evaluate, member_metrics, train_epoch
from hydro.tune.members import Members, build_members
from hydro.tune.spec import TuneSpec
from hydro.tune.trial_config import SURROGATE, TrialPlan, plan_of

STATE_FILE = "hydro_trial.pt"
MEMBERS_KEY = "members"


def trainable(spec: TuneSpec) -> Callable[[dict], None]:
    """A function trainable for ``tune.Tuner``/``tune.run``: Hydro trials when the config comes from a
    ``HydroSearcher``, one plain full-size unfused training otherwise (the stock Ray Tune baseline)."""

    def hydro_trial(config: dict) -> None:
        run_trial(spec, config)

    return hydro_trial


def run_trial(spec: TuneSpec, config: dict) -> None:
    """Train the trial described by ``config`` (see :mod:`hydro.tune.trial_config`) for ``spec.epochs``."""
    plan = plan_of(config)
    train, val = spec.load_data()
    configs = dict(plan.members)
    batch_size = spec.batch_size_of(plan.members[0][1])
    state = _restored_state()
    alive = state["member_ids"] if state else list(configs)
    members, fallback = build_members(spec, [configs[m] for m in alive], alive, plan.scale, fuse=plan.fused,
                                      mup=plan.mup)
    if fallback:
        print(f"hydro: training {len(alive)} members unfused (fallback_unfused): {fallback}")
    data_rng = torch.Generator().manual_seed(spec.seed)
    first_epoch = 1
    if state:
        members.load_state_dict(state["members"])
        data_rng.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        first_epoch = state["epoch"] + 1
    decisions = lookup_service(plan.decisions) if plan.decisions else None
    for epoch in range(first_epoch, spec.epochs + 1):
        train_loss = train_epoch(members, train, batch_size, spec.loss, data_rng)
        evaluated = evaluate(members, val, batch_size, spec.loss, spec.metrics)
        results = {m: {**member_metrics(train_loss, evaluated, i), "epoch": epoch, "training_iteration": epoch}
                   for i, m in enumerate(members.member_ids)}
        final = epoch == spec.epochs
        stop = set(ray.get(decisions.decide.remote(epoch, results, final))) if decisions else set()
        for member, result in results.items():
            result.update(done=final or member in stop, stopped=member in stop)
        survivors = [i for i, m in enumerate(members.member_ids) if m not in stop]
        if survivors and len(survivors) < len(members.member_ids):
            members.keep(survivors)
        report = _report(spec, plan, results, members, epoch, len(survivors))
        with tempfile.TemporaryDirectory() as directory:
            torch.save({"member_ids": members.member_ids, "members": members.state_dict(), "epoch": epoch,
                        "data_rng": data_rng.get_state(), "torch_rng": torch.get_rng_state()},
                       os.path.join(directory, STATE_FILE))
            tune.report(report, checkpoint=tune.Checkpoint.from_directory(directory))
        if not survivors:
            return


def _restored_state() -> dict | None:
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), weights_only=False)


def _report(spec: TuneSpec, plan: TrialPlan, results: dict[str, dict], members: Members, epoch: int,
            live: int) -> dict:
    """Trial-level result. Surrogates: per-member results under ``members/<id>/...`` and the best member's
    objective as ``best_member_<metric>``; the objective itself only if the run has no target (else NaN,
    so the run's best result is the target's). Target and plain trials: their metrics at the top level."""
    report = {"epoch": epoch, "hydro_kind": plan.kind, "fused": members.fused, "live_members": live}
    if plan.kind != SURROGATE:
        (result,) = results.values()
        return {**report, **{k: result[k] for k in spec.metric_names()}}
    values = [r[spec.metric] for r in results.values() if math.isfinite(r[spec.metric])]
    best = (max(values) if spec.mode == "max" else min(values)) if values else math.nan
    report[MEMBERS_KEY] = results
    report[f"best_member_{spec.metric}"] = best
    report[spec.metric] = best if plan.reports_objective else math.nan
    return report
