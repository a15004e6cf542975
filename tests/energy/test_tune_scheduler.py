"""EnergyScheduler on a local Ray cluster with simulated GPUs (V100 trace, CIFAR-100 workload)."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402

from hydro.tune.energy.scheduler import EnergyScheduler  # noqa: E402
from schedulers.energy import JobSimulator, ZeusTraces  # noqa: E402
from schedulers.energy.store import EnergyStore  # noqa: E402
from schedulers.energy.traces import WORKLOADS  # noqa: E402
from tests.energy.sim_trainable import train_on_trace  # noqa: E402

SIZES = [256, 512, 1024, 2048]  # 2048 needs > 100 epochs: never converges, must be stopped by the bound
# Training-trace runs a trial may draw. Runs 0 and 5 are left out: there 256 needs 40 epochs (78.7 kJ) and 512 49
# (82.3 kJ), and with those the bound, β=2 times the least converged cost, reaches the 2048 trial's whole 100-epoch
# cost (158.7 kJ), so that trial ends unstopped at its last epoch (a flake of the epoch assertion below). With
# these, the 256 and 512 trials converge within 31 and 43 epochs: the bound is at most about 145 kJ.
RUNS = [1, 2, 3, 4, 6, 7, 8, 9]


def _tune(tmp_path, zeus_traces, name, samples):
    scheduler = EnergyScheduler(
        job="cifar100-v100", store_path=tmp_path / "energy.db", energy_tuned=True,
        batch_sizes=SIZES, default_batch_size=1024, seed=0,
    )
    tuner = tune.Tuner(
        train_on_trace,
        param_space={
            "workload": "cifar100", "gpu": "v100", "traces": str(zeus_traces), "store": str(tmp_path / "energy.db"),
            "run": tune.choice(RUNS), "batch_size": 1024,
        },
        tune_config=tune.TuneConfig(scheduler=scheduler, num_samples=samples, reuse_actors=True),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path / "ray"), verbose=0),
    )
    return scheduler, tuner.fit()


def test_scheduler_profiles_once_applies_limits_stops_and_learns(ray_cluster, tmp_path, zeus_traces, monkeypatch):
    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # create trials lazily so the bandit learns in-run
    sim = JobSimulator(ZeusTraces("v100", zeus_traces), WORKLOADS["cifar100"])

    scheduler, results = _tune(tmp_path, zeus_traces, "first", 7)
    rows = [r.metrics for r in results]
    assert not results.errors and len(rows) == 7
    # The bandit chose the batch sizes: pruning from the default 1024 goes smaller first.
    chosen = [r.config["batch_size"] for r in results]
    assert all(r.metrics["batch_size"] == r.config["batch_size"] for r in results)
    assert {1024, 512, 256, 2048} <= set(chosen), chosen
    # Each batch size was profiled by exactly one trial; every trial ran at the trace's JIT choice.
    profiled = [r["batch_size"] for r in rows if r["profiled_here"]]
    assert sorted(profiled) == sorted(set(chosen))
    for r in rows:
        assert r["power_limit_w"] == sim.power_limit[r["batch_size"]]
    # 2048 never converges: once a converged trial exists, it is stopped at the bound.
    store = EnergyStore(tmp_path / "energy.db")
    history = store.observations("cifar100-v100")
    assert len(history) == 7
    for obs in history:
        if obs.batch_size == 2048:
            assert not obs.converged
            assert obs.cost <= scheduler.stop_cost * 1.05 + 1e-9  # stopped at the first epoch past the bound
            epochs = next(r["epoch"] for r in rows if r["batch_size"] == 2048)
            assert epochs < WORKLOADS["cifar100"].max_epochs

    # A second run of the recurring job resumes from the stored state: no re-profiling, no re-pruning.
    scheduler2, results2 = _tune(tmp_path, zeus_traces, "second", 3)
    assert scheduler2.bandit.history[:7] == history  # restored by replaying the store
    assert not scheduler2.bandit.pruning
    second = [r.metrics for r in results2]
    assert all(r["batch_size"] in scheduler2.bandit.arms and r["batch_size"] != 2048 for r in second)
    assert not any(r["profiled_here"] for r in second)
    assert len(store.observations("cifar100-v100")) == 10
