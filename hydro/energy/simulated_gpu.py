"""A simulated 250 W GPU standing in for a real one when trials train on CPU (``--energy-devices simulated``).

An analytic model, not a measurement: one training step of ``members`` × ``batch_size`` samples takes
``t0 = 5 ms + 20 µs × samples`` and draws ``P0 = 170 W + 80 W × u`` with utilisation
``u = samples / (samples + 512)``. Below a limit ``p < P0`` the GPU draws ``p`` and the step takes
``t0 × (P0 / p) ** 0.3`` (slower, less energy per step). Small batches pay the fixed per-step time more
often per epoch, so they cost more per sample; the power limit of least cost lies inside the range.
"""
from __future__ import annotations

from hydro.energy.simulated import SimulatedDevice, StepProfile, VirtualClock

LIMITS_W = tuple(range(100, 251, 25))  # settable power limits (W)


def step_profile(batch_size: int, members: int) -> dict[int, StepProfile]:
    """Time (s) and power (W) of one step of ``members`` fused members at ``batch_size``, per limit (W)."""
    samples = batch_size * members
    t0 = 0.005 + 20e-6 * samples
    p0 = 170.0 + 80.0 * samples / (samples + 512)
    return {p: StepProfile(t0 * (p0 / p) ** 0.3, float(p)) if p < p0 else StepProfile(t0, p0) for p in LIMITS_W}


def simulated_trial_gpu(batch_size: int, members: int, clock: VirtualClock, name: str = "gpu0") -> SimulatedDevice:
    """The stand-in GPU for a fused trial of ``members`` members at ``batch_size``; advance it with ``step()``."""
    return SimulatedDevice(name, step_profile(batch_size, members), clock, model="analytic-250W")
