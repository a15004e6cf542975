"""Energy decisions in plain Python: power-limit optimizer, batch-size bandit, trace simulator, state.

The Ray Tune scheduler that applies them is :class:`hydro.tune.energy.scheduler.EnergyScheduler`.
"""
from __future__ import annotations

from schedulers.energy.batch_size import BanditError, BatchSizeBandit, Observation
from schedulers.energy.power_limit import PowerLimitError, PowerLimitOptimizer, energy_cost
from schedulers.energy.simulator import POLICIES, JobSimulator, SimulationResult, simulate_grid
from schedulers.energy.traces import WORKLOADS, TraceError, Workload, ZeusTraces

__all__ = [
    "POLICIES",
    "WORKLOADS",
    "BanditError",
    "BatchSizeBandit",
    "JobSimulator",
    "Observation",
    "PowerLimitError",
    "PowerLimitOptimizer",
    "SimulationResult",
    "TraceError",
    "Workload",
    "ZeusTraces",
    "energy_cost",
    "simulate_grid",
]

