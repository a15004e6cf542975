"""Results of a tuning run: one row per member (and the target), the best configuration, files on disk."""
from __future__ import annotations

import json
import math
import os

from collections.abc import Mapping

import pandas as pd
import torch
from ray.tune import Result, ResultGrid
from torch import nn

from hydro.atomic_write import atomic_write
from hydro.binder import FusedModel, unfuse
from hydro.trial.members import build_members
from hydro.trial.plan import TrialKind, plan_of
from hydro.trial.spec import TuneSpec
from hydro.tune.session import ERROR_KEY, MEMBERS_KEY
from hydro.tune.trainable import STATE_FILE

MEMBER_TABLE_FILE, BEST_FILE = "hydro_members.csv", "hydro_best.json"
ENERGY_COLUMNS = ("energy_j", "cost")  # each member's share (J) when trials are energy-tuned


def member_table(results: ResultGrid, spec: TuneSpec) -> pd.DataFrame:
    """One row per member: ``member``, ``kind`` (surrogate/target/plain), ``trial`` (the fused trial),
    ``config/<key>`` values, final metrics, ``epochs`` trained, ``stop_epoch`` (early-stopped members) and
    ``error`` (its trial failed while it trained)."""
    rows = []
    for result in current_results(results):
        plan = plan_of(result.config)
        trial = (result.metrics or {}).get("trial_id", os.path.basename(result.path))
        history = result.metrics_dataframe
        failed = result.error is not None or bool((result.metrics or {}).get(ERROR_KEY))
        for member, config in plan.members:
            row = {"member": trial if plan.kind == TrialKind.PLAIN else member,
                   "kind": plan.kind, "trial": trial, **{f"config/{k}": v for k, v in config.items()}}
            row.update(_final(history, spec, f"{MEMBERS_KEY}/{member}/" if plan.kind == TrialKind.SURROGATE else ""))
            row["error"] = failed and row["stop_epoch"] is None  # stopped before its trial failed: it finished
            rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and spec.metric in table:
        table = table.sort_values(spec.metric, ascending=spec.mode == "min", na_position="last")
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
    finite = table[[isinstance(v, (int, float)) and math.isfinite(v) and not error
                    for v, error in zip(table[spec.metric], table["error"])]]  # a failed member's last value
    if finite.empty:                                                        # is not its result
        return None
    targets = finite[finite["kind"] == TrialKind.TARGET]
    row = (targets if not targets.empty else finite).iloc[0]
    config = {k.split("/", 1)[1]: _plain(v) for k, v in row.items() if k.startswith("config/") and _present(v)}
    source = next((plan_of(r.config).source for r in results
                   if r.config is not None and (r.metrics or {}).get("trial_id") == row["trial"]), {})
    return {"config": config, "kind": row["kind"], "metric": spec.metric, "mode": spec.mode,
            "value": float(row[spec.metric]), "metrics": {k: _plain(row.get(k)) for k in spec.metric_names()},
            "member": row["member"], "source": source}


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


def failure_summary(results: ResultGrid, rejected: Mapping[str, tuple[dict, str]] | None = None) -> str:
    """One message for a run in which no member ended with a finite objective."""
    causes = failures(results, rejected)
    lines = [f"  {len(members)} x {cause} (members {', '.join(members[:6])}{', ...' if len(members) > 6 else ''})"
             for cause, members in causes.items()]
    return "hydro: no member ended with a finite objective" + (":\n" + "\n".join(lines) if lines else
                                                              " (every member diverged: NaN or inf)")


def write_results(results: ResultGrid, spec: TuneSpec, directory: str | None = None) -> tuple[str, str | None]:
    """Write the member table (CSV) and the best configuration (JSON) to ``directory`` (default: the run
    directory); returns both paths (the JSON's ``None`` when there is no best configuration: no file)."""
    directory = directory or results.experiment_path
    table_path, best_path = os.path.join(directory, MEMBER_TABLE_FILE), os.path.join(directory, BEST_FILE)
    with atomic_write(table_path) as f:
        member_table(results, spec).to_csv(f, index=False)
    best = best_configuration(results, spec)
    if best is None:
        return table_path, None
    with atomic_write(best_path) as f:
        json.dump(best, f, indent=2, default=str)
    return table_path, best_path


def target_result(results: ResultGrid) -> Result | None:
    """The full-size target trial's result (``None`` if the run trained none)."""
    return next((r for r in current_results(results) if plan_of(r.config).kind == TrialKind.TARGET), None)


def load_model(result: Result, spec: TuneSpec) -> nn.Module:
    """The trained full-size model of ``result`` (the target's, e.g. ``results.get_best_result()``, or a plain
    trial's) from its last checkpoint, as ``spec.model(config)`` builds it: the user's class, in eval mode."""
    plan = plan_of(result.config)
    if plan.kind == TrialKind.SURROGATE:
        raise ValueError(f"hydro.tune.load_model: trial {result.path} trains fused surrogate members (scale "
                         f"{plan.scale}), not the full-size model; pass the target's result "
                         f"(hydro.tune.results.target_result(results)), in a run with a transfer_fraction")
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


def _first_line(error: BaseException) -> str:
    cause = error.as_instanceof_cause() if hasattr(error, "as_instanceof_cause") else error
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[-1] if text else ''}"


def _plain(value):
    """A table value as a plain Python value (numpy scalars print as ``np.float64(...)``)."""
    return value.item() if hasattr(value, "item") else value


def _present(value) -> bool:
    return not (isinstance(value, float) and math.isnan(value))
