"""Hydro's own trials under the energy path, on a local Ray cluster with a simulated GPU per trial:
the bandit picks each fused group's batch size, a costly group is stopped at β·(least cost per member-epoch), the
power-limit profile of each (members, batch size) is measured once and reused from the store by a second run."""
from __future__ import annotations

import pytest

from hydro.energy.tuning import DeviceSource, EnergySettings
from hydro.tune.run import fit
from schedulers.energy.store import EnergyStore, ProfileKey
from tests.tune.workload import SPACE, spec

SIZES = (8, 32, 64)  # 8 costs ~3.3x as much per member-epoch as 32 on the simulated GPU: stopped at beta = 2


def _run(tmp_path, name, samples):
    settings = EnergySettings(str(tmp_path / "energy.db"), "digits", DeviceSource.SIMULATED, beta=2.0,
                              batch_sizes=SIZES, warmup_steps=1, window_steps=1)
    results, _ = fit(spec(epochs=3), SPACE, num_samples=samples, fusion=2, transfer_fraction=None,
                     storage_path=str(tmp_path / "ray"), name=name, max_concurrent_trials=1, max_failures=0,
                     energy=settings, verbose=0)
    assert not results.errors
    return [(r.config, r.metrics) for r in results]


def _batch_size(config):
    sizes = {member_config["batch_size"] for _, member_config in config["hydro"].members}
    assert len(sizes) == 1
    return sizes.pop()


def test_hydro_trials_are_energy_tuned_and_reuse_the_profile(ray_cluster, tmp_path):
    first = _run(tmp_path, "first", 6)
    store = EnergyStore(tmp_path / "energy.db")
    history = store.observations("digits")
    # Pruning from the workload's batch size 32: smaller first (8 fails: stopped), then larger (64).
    assert [(o.batch_size, o.converged) for o in history] == [(32, True), (8, False), (64, True)]
    by_size = {_batch_size(c): m for c, m in first}
    assert sorted(by_size) == [8, 32, 64]
    least = min(o.cost for o in history if o.converged)
    stopped = by_size[8]
    assert stopped["epoch"] == 1 and stopped["member_epoch_cost"] > 2.0 * least  # stopped at its first report
    for size in (32, 64):
        assert by_size[size]["epoch"] == 3
    for config, m in first:
        members = config["hydro"].member_ids
        shares = [m["members"][x]["energy_j"] for x in members]
        assert sum(shares) == pytest.approx(m["energy_j"]) and shares[0] == pytest.approx(shares[1])
        assert m["power_profiled_here"] and m["power_limit_w"] is not None  # each (F=2, b) profiled once
        assert m["cost"] == pytest.approx(m["member_epoch_cost"] * 2 * m["epoch"])
    limits = {b: m["power_limit_w"] for b, m in by_size.items()}
    assert {(w.power_limit_w) for w in store.load_profile(ProfileKey("digits/F2", "1x simulated:analytic-250W", 32))} == {100, 125, 150, 175, 200, 225, 250}

    second = _run(tmp_path, "second", 4)  # a later run of the same job: bandit restored, profiles reused
    assert store.observations("digits")[:3] == history and len(store.observations("digits")) == 5
    for config, m in second:
        size = _batch_size(config)
        assert size in (32, 64)  # 8 did not survive pruning
        assert not m["power_profiled_here"] and m["power_limit_w"] == limits[size]
