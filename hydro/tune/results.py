"""Results of a tuning run: one row per member (and the target), the best configuration, files on disk."""
from __future__ import annotations

import json
import math
import os

import pandas as pd
from ray.tune import ResultGrid

from hydro.trial.spec import TuneSpec
from hydro.tune.session import MEMBERS_KEY
from hydro.trial.plan import TrialKind, plan_of

MEMBER_TABLE_FILE, BEST_FILE = "hydro_members.csv", "hydro_best.json"
ENERGY_COLUMNS = ("energy_j", "cost")  # each member's share (J) when trials are energy-tuned


def member_table(results: ResultGrid, spec: TuneSpec) -> pd.DataFrame:
    """One row per member: ``member``, ``kind`` (surrogate/target/plain), ``trial`` (the fused trial),
    ``config/<key>`` values, final metrics, ``epochs`` trained and ``stop_epoch`` (early-stopped members)."""
    rows = []
    for result in results:
        if result.config is None:  # a trial that never reported (e.g. the run was interrupted)
            continue
        plan = plan_of(result.config)
        trial = (result.metrics or {}).get("trial_id", os.path.basename(result.path))
        history = result.metrics_dataframe
        for member, config in plan.members:
            row = {"member": trial if plan.kind == TrialKind.PLAIN else member,
                   "kind": plan.kind, "trial": trial, "error": result.error is not None,
                   **{f"config/{k}": v for k, v in config.items()}}
            row.update(_final(history, spec, f"{MEMBERS_KEY}/{member}/" if plan.kind == TrialKind.SURROGATE else ""))
            rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty and spec.metric in table:
        table = table.sort_values(spec.metric, ascending=spec.mode == "min", na_position="last")
    return table.reset_index(drop=True)


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


def best_configuration(results: ResultGrid, spec: TuneSpec) -> dict:
    """The run's best result (the target's, in a run with one): its configuration and metrics."""
    best = results.get_best_result(spec.metric, spec.mode)
    plan = plan_of(best.config)
    config = plan.members[0][1] if plan.kind != TrialKind.SURROGATE else None
    if config is None:  # a run without a target: the best member of the best fused trial
        table = member_table(results, spec)
        top = table[table["kind"] == TrialKind.SURROGATE].iloc[0]
        config = {k.split("/", 1)[1]: v for k, v in top.items() if k.startswith("config/") and _present(v)}
    return {"config": config, "kind": plan.kind, "metric": spec.metric, "mode": spec.mode,
            "value": best.metrics.get(spec.metric), "metrics": {k: best.metrics.get(k) for k in spec.metric_names()},
            "source": plan.source}


def write_results(results: ResultGrid, spec: TuneSpec, directory: str | None = None) -> tuple[str, str]:
    """Write the member table (CSV) and the best configuration (JSON) to ``directory`` (default: the run
    directory); returns both paths."""
    directory = directory or results.experiment_path
    table_path, best_path = os.path.join(directory, MEMBER_TABLE_FILE), os.path.join(directory, BEST_FILE)
    member_table(results, spec).to_csv(table_path, index=False)
    with open(best_path, "w") as f:
        json.dump(best_configuration(results, spec), f, indent=2, default=str)
    return table_path, best_path


def _present(value) -> bool:
    return not (isinstance(value, float) and math.isnan(value))
