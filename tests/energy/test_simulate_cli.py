"""``hydro energy simulate`` (through the benchmark entry point): table, JSON and PNG; trace errors."""
from __future__ import annotations

import json

import pytest

from benchmarks.energy_simulation import main
from hydro.cli import main as hydro_main
from schedulers.energy.simulator import JobSimulator
from schedulers.energy.traces import WORKLOADS, TraceError, ZeusTraces, traces_dir


def test_simulate_writes_consistent_json_and_png(tmp_path, zeus_traces, capsys):
    rc = main(["--gpus", "v100", "--workloads", "squad", "movielens-1m", "--seeds", "2",
               "--recurrences", "20", "--traces", str(zeus_traces), "--out", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "movielens-1m" in out and "hydro" in out and "zeus" in out
    data = json.loads((tmp_path / "energy_simulation.json").read_text())
    assert data["simulated"] and len(data["summary"]) == 4 and len(data["runs"]) == 8
    assert (tmp_path / "energy_cumulative_cost.png").stat().st_size > 10_000
    run = data["runs"][0]
    assert len(run["recurrences"]) == 20
    cost = sum(r["cost"] for r in run["recurrences"])
    assert run["totals"]["regret"] == pytest.approx(cost - run["oracle_cost"])
    assert run["totals"]["cost_savings"] == pytest.approx(1 - cost / run["default_cost"])
    # The default and oracle references agree with the simulator's own expectation at b0 / best arm.
    sim = JobSimulator(ZeusTraces("v100", zeus_traces), WORKLOADS[run["workload"]])
    assert run["default_cost"] == pytest.approx(20 * sim.expected(sim.default_batch_size, 250)[0])
    assert run["oracle_cost"] == pytest.approx(20 * sim.oracle()[1])


def test_cli_writes_next_to_the_run_not_into_the_current_directory(tmp_path, zeus_traces, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")  # help lines unwrapped
    monkeypatch.chdir(tmp_path)
    rc = hydro_main(["energy", "simulate", "--gpus", "v100", "--workloads", "squad", "--policies", "hydro",
                     "--seeds", "1", "--recurrences", "3", "--traces", str(zeus_traces)])
    assert rc == 0
    (run,) = (tmp_path / "home" / "hydro_results").iterdir()
    assert run.name.startswith("energy_simulate_")
    assert sorted(p.name for p in run.iterdir()) == ["energy_cumulative_cost.png", "energy_simulation.json"]
    assert str(run / "energy_simulation.json") in capsys.readouterr().out
    assert not (tmp_path / "benchmarks").exists()
    config = json.loads((run / "energy_simulation.json").read_text())["config"]
    assert config["recurrences"] == 3 and "command" not in config
    with pytest.raises(SystemExit):
        hydro_main(["energy", "simulate", "--help"])
    help_text = capsys.readouterr().out
    for default in ("(default: v100 p100)", "(default: 10)", "(default: 50)", "(default: 0.5)", "(default: 2.0)",
                    "energy_simulate_<UTC time>", "$HYDRO_ZEUS_TRACES"):
        assert default in help_text, default


def test_missing_traces_name_the_fix(tmp_path, monkeypatch, zeus_traces):
    with pytest.raises(TraceError, match="available"):
        ZeusTraces("a100", zeus_traces)
    monkeypatch.setenv("HYDRO_ZEUS_TRACES", str(tmp_path / "nowhere"))
    with pytest.raises(TraceError, match="HYDRO_ZEUS_TRACES"):
        traces_dir()
