"""Results of a tuning run: one row per member (and the target), the best configuration, files on disk."""
from __future__ import annotations

import json
import logging
import math
import os

from collections.abc import Mapping

import pandas as pd
import torch
from ray import cloudpickle
from ray.tune import Result, ResultGrid
from torch import nn

from hydro.atomic_write import atomic_write
from hydro.binder import FusedModel, unfuse
from hydro.trial.members import build_members
from hydro.trial.plan import TrialKind, TrialPlan, plan_of
from hydro.trial.spec import TuneSpec
from hydro.tune.search.session import ERROR_KEY, MEMBERS_KEY
from hydro.tune.search.trainable import STATE_FILE

MEMBER_TABLE_FILE, BEST_FILE, MODEL_FILE = "hydro_members.csv", "hydro_best.json", "hydro_model.pt"
ENERGY_COLUMNS = ("energy_j", "cost")  # each member's share (J) when trials are energy-tuned

logger = logging.getLogger(__name__)


FUSED = "fused"  # the member table's kind of a fused trial's full-size members (scale 1): they are no surrogates


def member_kind(plan: TrialPlan) -> str:
    """A member's ``kind`` in the member table: its trial plan's, but :data:`FUSED` for the members of a fused trial
    at full size (``scale`` 1), which stand for themselves, not for a larger model."""
    return FUSED if plan.kind == TrialKind.SURROGATE and plan.scale == 1 else str(plan.kind)


def member_table(results: ResultGrid, spec: TuneSpec) -> pd.DataFrame:
    """One row per member: ``member``, ``kind`` (surrogate: shrunk, fused; fused: full size, fused; target; plain:
    full size, unfused), ``trial`` (the fused trial),
    ``config/<key>`` values, final metrics, ``epochs`` trained, ``stop_epoch`` (early-stopped members) and
    ``error`` (its trial failed while it trained). The full-size targets come first (the returned one, the best,
    first), then the other rows, each best first by ``spec.metric``; members that failed after their targets'
    and other rows of their kind."""
    rows = []
    for result in current_results(results):
        plan = plan_of(result.config)
        trial = _trial_id(result)
        history = result.metrics_dataframe
        failed = result.error is not None or bool((result.metrics or {}).get(ERROR_KEY))
        for member, config in plan.members:
            row = {"member": trial if plan.kind == TrialKind.PLAIN else member,
                   "kind": member_kind(plan), "trial": trial, **{f"config/{k}": v for k, v in config.items()}}
            row.update(_final(history, spec, f"{MEMBERS_KEY}/{member}/" if plan.kind == TrialKind.SURROGATE else ""))
            row["error"] = failed and row["stop_epoch"] is None  # stopped before its trial failed: it finished
            rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and spec.metric in table:
        table = table.assign(_other=table["kind"] != TrialKind.TARGET)
        table = table.sort_values(["_other", "error", spec.metric], ascending=[True, True, spec.mode == "min"],
                                  na_position="last", kind="stable").drop(columns="_other")
    return table.reset_index(drop=True)


def current_results(results: ResultGrid) -> list[Result]:
    """The results of the run's trials that reported (a trial of an interrupted run may not have), less those of
    lost trials whose members a fresh trial trained again (``HydroSearcher(lost_trial_retries=...)``): of trials of
    the same plan, the ones that did not end in a Tune error, else the first."""
    reported = [r for r in results if r.config is not None]
    plans: dict[str, list[Result]] = {}
    for result in reported:
        plan = plan_of(result.config)
        key = result.path if plan.kind == TrialKind.PLAIN else repr((plan.kind, plan.members))
        plans.setdefault(key, []).append(result)
    kept = {id(r) for same in plans.values() for r in ([r for r in same if r.error is None] or same[:1])}
    return [r for r in reported if id(r) in kept]


def _final(history: pd.DataFrame | None, spec: TuneSpec, prefix: str) -> dict:
    """The member's last reported values (retried trials repeat epochs: the last report of each wins)."""
    measured = [n for n in ENERGY_COLUMNS if history is not None and f"{prefix}{n}" in history]  # hydro tune --energy
    names = [*spec.metric_names(), *measured, "epoch", "stopped"]
    empty = {**{n: math.nan for n in [*spec.metric_names(), *measured]}, "epochs": 0, "stop_epoch": None}
    if history is None or f"{prefix}epoch" not in history:
        return empty
    seen = history[history[f"{prefix}epoch"].notna()]
    if seen.empty:
        return empty
    last = seen.iloc[-1]
    values = {n: last.get(prefix + n) for n in names}
    stopped = values.pop("stopped")
    stopped = bool(stopped) if stopped is not None and not pd.isna(stopped) else False
    epochs = int(values.pop("epoch"))
    return {**values, "epochs": epochs, "stop_epoch": epochs if stopped else None}


def best_configuration(results: ResultGrid, spec: TuneSpec) -> dict | None:
    """The run's best result: the full-size target's when it trained, else the best member's; its configuration
    and metrics. ``None`` when no member or target ended with a finite objective (e.g. every member failed:
    a member whose trial failed while it trained has no result, whatever it reported before)."""
    table = member_table(results, spec)
    if table.empty or spec.metric not in table:
        return None
    finite = table[[_finite(v) and not error
                    for v, error in zip(table[spec.metric], table["error"])]]  # a failed member's last value
    if finite.empty:                                                        # is not its result
        return None
    targets = finite[finite["kind"] == TrialKind.TARGET]
    row = (targets if not targets.empty else finite).iloc[0]
    result = _result_of(results, row["trial"])
    plan = plan_of(result.config)
    # the configuration as the member trained with it (the table's columns are floats where a key is missing)
    (config,) = [c for m, c in plan.members if m == row["member"] or plan.kind == TrialKind.PLAIN]
    config, source = {k: _plain(v) for k, v in config.items()}, plan.source
    checkpoint = result.checkpoint if result is not None and row["kind"] in (TrialKind.TARGET, TrialKind.PLAIN) \
        else None  # a fused trial's checkpoint holds several members, not the user's model
    return {"config": config, "kind": row["kind"], "metric": spec.metric, "mode": spec.mode,
            "value": float(row[spec.metric]), "metrics": {k: _plain(row.get(k)) for k in spec.metric_names()},
            "member": row["member"], "source": source, "trial": row["trial"],
            "checkpoint": None if checkpoint is None else checkpoint.path}


def failures(results: ResultGrid, rejected: Mapping[str, tuple[dict, str]] | None = None) -> dict[str, list[str]]:
    """Why members failed: cause -> the members (or trials) it failed. ``rejected``: members rejected before
    training (``HydroSearcher.rejected_members()``)."""
    causes: dict[str, list[str]] = {}
    for member, (_, why) in (rejected or {}).items():
        causes.setdefault(why, []).append(member)
    for result in current_results(results):
        cause = (result.metrics or {}).get(ERROR_KEY) or (_first_line(result.error) if result.error else None)
        if cause:
            causes.setdefault(cause, []).extend(plan_of(result.config).member_ids)
    return causes


def failures_line(results: ResultGrid, rejected: Mapping[str, tuple[dict, str]] | None = None) -> str | None:
    """One line on the members that failed in a run that has a result (``None``: none failed)."""
    causes = failures(results, rejected)
    if not causes:
        return None
    return f"hydro: {sum(map(len, causes.values()))} members failed: " + "; ".join(
        f"{cause} (members {', '.join(members)})" for cause, members in causes.items())


def failure_summary(results: ResultGrid, rejected: Mapping[str, tuple[dict, str]] | None = None) -> str:
    """One message for a run in which no member ended with a finite objective."""
    causes = failures(results, rejected)
    lines = [f"  {len(members)} x {cause} (members {', '.join(members[:6])}{', ...' if len(members) > 6 else ''})"
             for cause, members in causes.items()]
    return "hydro: no member ended with a finite objective" + (":\n" + "\n".join(lines) if lines else
                                                              " (every member diverged: NaN or inf)")


def write_results(results: ResultGrid, spec: TuneSpec, directory: str | None = None) -> tuple[str, str | None]:
    """Write the member table (CSV), the best configuration (JSON, with the returned full-size model's
    checkpoint) and that trained model (``hydro_model.pt``, for :func:`load_model` of the run directory) to
    ``directory`` (default: the run directory); returns the first two paths (the JSON's ``None`` when there is no
    best configuration: no file)."""
    directory = directory or results.experiment_path
    table_path, best_path = os.path.join(directory, MEMBER_TABLE_FILE), os.path.join(directory, BEST_FILE)
    with atomic_write(table_path) as f:
        member_table(results, spec).to_csv(f, index=False)
    best = best_configuration(results, spec)
    if best is None:
        return table_path, None
    with atomic_write(best_path) as f:
        json.dump(best, f, indent=2, default=str)
    if best["checkpoint"] is not None:
        _write_model(_result_of(results, best["trial"]), spec, os.path.join(directory, MODEL_FILE))
    return table_path, best_path


def target_result(results: ResultGrid, spec: TuneSpec | None = None) -> Result | None:
    """The returned full-size target's result: of several (fallback targets), the best on the objective, the one
    :func:`best_configuration` reports (``spec``'s; without ``spec``, the run's ``TuneConfig`` metric and mode); a
    lone target as it ended. ``None`` if the run trained none (with ``spec`` or of several: none that ended with a
    finite objective). Raises ``ValueError`` for several targets, no ``spec`` and no ``TuneConfig`` metric."""
    targets = [r for r in current_results(results) if plan_of(r.config).kind == TrialKind.TARGET]
    if spec is not None:
        best = best_configuration(results, spec)
        return None if best is None or best["kind"] != TrialKind.TARGET else _result_of(results, best["trial"])
    if len(targets) <= 1:
        return targets[0] if targets else None
    metric, mode = results._experiment_analysis.default_metric, results._experiment_analysis.default_mode
    if metric is None:
        raise ValueError("hydro.tune.target_result: the run trained several full-size targets and its TuneConfig "
                         "names no metric to choose the returned one by; pass the spec: target_result(results, spec)")
    finished = [r for r in targets if r.error is None and not (r.metrics or {}).get(ERROR_KEY)
                and _finite((r.metrics or {}).get(metric))]
    return max(finished, key=lambda r: r.metrics[metric] * (1 if mode == "max" else -1), default=None)


def load_model(source: Result | str | os.PathLike, spec: TuneSpec | None = None) -> nn.Module:
    """The trained full-size model as ``spec.model(config)`` builds it: the user's class, in eval mode. ``source``:
    a run directory (``hydro tune`` prints it; the returned model that :func:`write_results` saved there, no
    ``spec`` needed), or a trial's ``Result`` with the ``spec`` (the target's, e.g. ``target_result(results,
    spec)``, or a plain trial's; its last checkpoint)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.path.join(source, MODEL_FILE)
        if not os.path.exists(path):
            raise ValueError(f"hydro.tune.load_model: {source} holds no trained full-size model ({MODEL_FILE}): "
                             f"give a run directory of hydro tune / hydro.tune.fit whose full-size target trained, "
                             f"or load a trial's result: load_model(target_result(results, spec), spec)")
        return torch.load(path, weights_only=False).eval()
    if spec is None:
        raise TypeError("hydro.tune.load_model: loading a trial's result needs the workload: load_model(result, spec)")
    result = source
    plan = plan_of(result.config)
    if plan.kind == TrialKind.SURROGATE:
        raise ValueError(f"hydro.tune.load_model: trial {result.path} trains fused surrogate members (scale "
                         f"{plan.scale}), not the full-size model; pass the target's result "
                         f"(hydro.tune.search.results.target_result(results, spec)), in a run with a transfer_fraction, "
                         f"or the run directory: load_model(results.experiment_path)")
    if result.checkpoint is None:
        raise ValueError(f"hydro.tune.load_model: trial {result.path} has no checkpoint (it failed before its "
                         f"first, or was stopped before it)")
    with result.checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, STATE_FILE), weights_only=False)
    (member, config), = plan.members
    members, _ = build_members(spec, [config], [member], 1, fuse=False, mup=plan.mup)
    members.load_state_dict(state["members"][0])  # the target trains as one chunk
    trained = members.modules()[0]
    if isinstance(trained, FusedModel):  # a µP target (F=1): its weights go into the user's own model
        trained = unfuse(trained)[0]
    model = spec.model(config)
    model.load_state_dict(trained.state_dict())
    return model.eval()


def _write_model(result: Result, spec: TuneSpec, path: str) -> None:
    """Save the trained model of ``result`` whole (its class by value where cloudpickle pickles it so, e.g. a
    ``hydro tune`` workload file's), for :func:`load_model` in another process; a model that cannot be loaded
    from its checkpoint (e.g. a custom training loop's) or pickled is logged and left out."""
    try:
        torch.save(load_model(result, spec), path, pickle_module=cloudpickle)
    except Exception as error:  # noqa: BLE001 - the checkpoint still holds what the trial saved
        logger.warning("hydro: the trained full-size model could not be saved whole to %s (%s: %s); load it from its "
                       "checkpoint with hydro.tune.load_model(target_result(results, spec), spec)", path,
                       type(error).__name__, error)


def _result_of(results: ResultGrid, trial: str) -> Result | None:
    """The result of the trial with id ``trial``."""
    return next((r for r in current_results(results) if _trial_id(r) == trial), None)


def _trial_id(result: Result) -> str:
    return (result.metrics or {}).get("trial_id", os.path.basename(result.path))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _first_line(error: BaseException) -> str:
    cause = error.as_instanceof_cause() if hasattr(error, "as_instanceof_cause") else error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def _plain(value):
    """A table value as a plain Python value (numpy scalars print as ``np.float64(...)``)."""
    return value.item() if hasattr(value, "item") else value
