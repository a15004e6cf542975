"""``hydro tune --energy`` as a user types it: a refusal before Ray starts when nothing can be measured, and a run
on simulated GPUs whose member table shows each member's energy and cost."""
from __future__ import annotations

import json
import re

import pandas as pd
import ray

from hydro.cli import main


def test_energy_without_a_measurable_device_is_refused_before_ray_starts(workload_file, tmp_path, monkeypatch, capsys):
    path = workload_file
    monkeypatch.setattr("hydro.tune.energy.options.detect_devices", lambda: [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["tune", "--workload", str(path), "--energy", "--storage", str(tmp_path / "runs")]) == 2
    assert re.search("no device to measure on this host.*--energy-devices simulated", capsys.readouterr().err)
    assert not ray.is_initialized()


def test_energy_run_reports_energy_and_cost_per_member(ray_cluster, workload_file, tmp_path, capsys):
    path = workload_file
    assert main(["tune", "--workload", str(path), "--samples", "4", "--fusion", "2", "--scheduler", "none",
                 "--storage", str(tmp_path / "runs"), "--name", "cli", "--energy", "--energy-devices",
                 "simulated", "--energy-store", str(tmp_path / "energy.db"), "--energy-batch-sizes", "16", "32"]) == 0
    out = capsys.readouterr().out
    assert "energy_j" in out and "cost" in out
    table = pd.read_csv(tmp_path / "runs" / "cli" / "hydro_members.csv")
    assert len(table) == 5  # 4 members and the full-size target
    assert (table["energy_j"] > 0).all() and (table["cost"] > 0).all()
    surrogates = table[table["kind"] == "fused"]  # --scale 1: full-size members of fused trials
    assert set(surrogates["config/batch_size"]) <= {16, 32}  # the bandit's choice, per fused group
    assert surrogates.groupby("trial")["config/batch_size"].nunique().eq(1).all()
    target = table.loc[table["kind"] == "target", "config/batch_size"].item()  # its source member's batch size
    best = json.loads((tmp_path / "runs" / "cli" / "hydro_best.json").read_text())
    assert target == surrogates.set_index("member").loc[best["source"]["member"], "config/batch_size"]
    assert type(best["config"]["batch_size"]) is int  # as the target trained with it, not the table's float
