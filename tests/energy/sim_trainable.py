"""A Ray Tune trainable that "trains" a Zeus workload on a simulated GPU driven by the V100 trace.

Epochs to reach the target come from a seeded run of the training trace for the trial's batch size;
each epoch is ``STEPS_PER_EPOCH`` simulated steps at the current power limit (virtual clock).
"""
from __future__ import annotations

import math

from ray import tune

from hydro.energy import SimulatedDevice, VirtualClock
from hydro.energy.trial import TrialEnergy
from schedulers.energy.store import EnergyStore
from schedulers.energy.traces import WORKLOADS, ZeusTraces

STEPS_PER_EPOCH = 10


def train_on_trace(config: dict) -> None:
    workload = WORKLOADS[config["workload"]]
    traces = ZeusTraces(config["gpu"], config["traces"])
    batch_size = config["batch_size"]
    paths = traces.epochs_to_target(workload, batch_size)
    epochs_needed = paths[config["run"] % len(paths)]
    per_epoch = {k: (p.time_per_epoch_s, p.average_power_w) for k, p in traces.power(workload, batch_size).items()}
    clock = VirtualClock()
    gpu = SimulatedDevice.from_epoch_trace("gpu0", per_epoch, STEPS_PER_EPOCH, clock)
    store = EnergyStore(config["store"])
    with TrialEnergy(
        [gpu], store=store, model=config["workload"], batch_size=batch_size, clock=clock.now,
        warmup_steps=1, window_steps=2, poll_steps=STEPS_PER_EPOCH,
    ) as energy:
        for epoch in range(1, workload.max_epochs + 1):
            for _ in range(STEPS_PER_EPOCH):
                gpu.step()
                energy.on_step()
            converged = math.isfinite(epochs_needed) and epoch >= epochs_needed
            tune.report({**energy.metrics(), "epoch": epoch, "batch_size": batch_size, "converged": converged,
                         "profiled_here": energy.profiled_here})
            if converged:
                return
