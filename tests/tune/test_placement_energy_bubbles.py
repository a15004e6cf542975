"""``hydro tune --placement elastic`` with ``--energy`` and with ``--energy --bubbles``, on a real two-node local Ray
cluster whose nodes declare two GPU types (CPU nodes; simulated energy devices): with energy, the trials' energy
windows fit an energy model per type and, once both types have one, later trials are placed by predicted cost;
with bubbles too, the search's trials fill the placement service's workers while the full-size target is placed
on a type (and metered) as an ordinary trial."""
from __future__ import annotations

import json
import logging

import pytest

from tests.tune.test_placement_tune import TYPES, node_types, two_type_cluster  # noqa: F401 - the fixture

PLACEMENT_LOGGER = "hydro.tune.placement.trial_placement"


def placed_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == PLACEMENT_LOGGER and " placed on " in r.getMessage()]


def hydro_tune(*options: str, name: str, tmp_path) -> int:
    from hydro.cli import main

    return main(["tune", "--example", "digits-mlp", "--fusion", "2", "--epochs", "2", "--placement", "elastic", "--energy", "--energy-devices", "simulated",
                 "--energy-store", str(tmp_path / "energy.db"), "--storage", str(tmp_path / "runs"), "--name", name,
                 *options])


def test_with_energy_later_trials_are_placed_by_predicted_cost(two_type_cluster, tmp_path, capsys, caplog):
    with caplog.at_level(logging.INFO, logger=PLACEMENT_LOGGER):
        code = hydro_tune("--samples", "6", name="placed-energy", tmp_path=tmp_path)
    assert code == 0, capsys.readouterr().err
    assert "best configuration (target" in capsys.readouterr().out
    lines = placed_lines(caplog)
    assert {line.split(" placed on ")[1].split(":")[0] for line in lines} <= set(TYPES)
    by_cost = [line for line in lines if "; predicted cost " in line]
    assert by_cost, lines  # the target comes after both types' search trials measured
    # the V100 (prior: half the A100's speed) got its energy model from a trial placed there to measure it, while
    # the A100 was busy: the one type trials would otherwise all have gone to left no model to rank by
    explored = [i for i, line in enumerate(lines) if "; no energy model of V100 yet: this trial measures it" in line]
    assert explored and " placed on V100: " in lines[explored[0]] and explored[0] < lines.index(by_cost[0]), lines
    for line in by_cost:  # each went to the type of least cost in its own line
        gpu = line.split(" placed on ")[1].split(":")[0]
        costs = dict(part.rsplit(" ", 2)[:2] for part in line.split("; predicted cost ")[1].split(", "))
        assert float(costs[gpu]) == min(float(c) for c in costs.values())
    assert not any("; predicted cost " in line for line in lines[:2])  # the first trials: nothing measured yet


def test_energy_bubbles_and_placement_in_one_run(two_type_cluster, tmp_path, capsys, caplog):
    ray = two_type_cluster
    from hydro.tune.bubbles.service import placement_service
    from hydro.tune.pipeline.job import start_dedicated_hosts

    service = placement_service(promote_rung=2)
    hosts = start_dedicated_hosts(service, 2, num_cpus=0.25)
    try:
        with caplog.at_level(logging.INFO, logger=PLACEMENT_LOGGER):
            code = hydro_tune("--samples", "4", "--bubbles", "--address", ray.get_runtime_context().gcs_address,
                              name="energy-bubbles-placed", tmp_path=tmp_path)
    finally:
        for actor in [service, *hosts]:
            ray.kill(actor)
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "best configuration (target" in out
    lines = placed_lines(caplog)
    assert lines and all("(1 members)" in line for line in lines), lines  # only the full-size target(s)
    best = json.loads((tmp_path / "runs" / "energy-bubbles-placed" / "hydro_best.json").read_text())
    assert best  # the run wrote its result
    results = [json.loads(line) for path in (tmp_path / "runs" / "energy-bubbles-placed").glob("*/result.json")
               for line in path.read_text().splitlines() if line.strip()]
    targets = [r for r in results if "hydro_gpu" in r.get("config", {})]
    assert targets and all(r["energy_j"] > 0 for r in targets)  # placed targets train metered as ordinary trials
    landed = node_types(ray)
    assert all(landed[r["node_id"]] in TYPES for r in targets)
    fills = [r for r in results if "hydro_gpu" not in r.get("config", {})]
    assert fills and not any("energy_j" in r for r in fills)  # fill trials: in the workers, unmetered

