"""Energy decisions in plain Python: power-limit optimizer, batch-size bandit, trace simulator, state.

``EnergyScheduler`` (the Ray Tune scheduler) is imported lazily, so importing this package does not
import Ray.
"""
from __future__ import annotations

from typing import Any

from schedulers.energy.batch_size import BanditError, BatchSizeBandit, Observation
from schedulers.energy.power_limit import PowerLimitError, PowerLimitOptimizer, energy_cost
from schedulers.energy.simulator import POLICIES, JobSimulator, SimulationResult, simulate_grid
from schedulers.energy.traces import WORKLOADS, TraceError, Workload, ZeusTraces

__all__ = [
    "POLICIES",
    "WORKLOADS",
    "BanditError",
    "BatchSizeBandit",
    "EnergyScheduler",
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


def __getattr__(name: str) -> Any:
    if name == "EnergyScheduler":
        from schedulers.energy.tune_scheduler import EnergyScheduler

        return EnergyScheduler
    raise AttributeError(f"module 'schedulers.energy' has no attribute {name!r}")
