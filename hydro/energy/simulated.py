"""A device driven by a power trace, with a virtual clock: fast, deterministic, no hardware.

The trace gives, per power limit (W), the time of one training step (s) and the average power (W)
while training. Training code calls :meth:`SimulatedDevice.step` where it would run a step; the
virtual clock advances and the energy counter grows by power × time.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hydro.energy.device import EnergyDevice, PermissionDenied


class VirtualClock:
    """A clock (s) that only moves when told; pass ``clock.now`` to :class:`EnergyMonitor`."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = start_s

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move the clock back by {seconds} s.")
        self._t += seconds


@dataclass(frozen=True)
class StepProfile:
    """One training step at a power limit: duration (s) and average power (W)."""

    step_time_s: float
    power_w: float


class SimulatedDevice(EnergyDevice):
    """A GPU whose step time and power follow ``profile`` (power limit W -> StepProfile).

    ``allow_set=False`` simulates a process without the privilege to set power limits; ``model`` names the
    simulated hardware (its :attr:`kind` is ``simulated:<model>``, never a real device's).
    """

    def __init__(
        self,
        name: str,
        profile: Mapping[int, StepProfile],
        clock: VirtualClock,
        *,
        allow_set: bool = True,
        model: str = "trace",
    ) -> None:
        if not profile:
            raise ValueError(f"{name}: the power profile is empty; give at least one power limit.")
        self.name, self.model = name, model
        self.profile = dict(profile)
        self.clock = clock
        self.allow_set = allow_set
        self._limit = max(self.profile)
        self._energy = 0.0
        self.set_calls: list[int] = []

    @classmethod
    def from_epoch_trace(
        cls, name: str, per_epoch: Mapping[int, tuple[float, float]], steps_per_epoch: int, clock: VirtualClock, **kw
    ) -> SimulatedDevice:
        """From a ``summary_power_*.csv`` slice: limit W -> (seconds per epoch, average W)."""
        profile = {int(k): StepProfile(t / steps_per_epoch, p) for k, (t, p) in per_epoch.items()}
        return cls(name, profile, clock, **kw)

    @property
    def kind(self) -> str:
        return f"simulated:{self.model}"

    def step(self, n: int = 1) -> None:
        """Run ``n`` training steps at the current limit: the clock advances, energy accumulates."""
        at = self.profile[self._limit]
        self.clock.advance(n * at.step_time_s)
        self._energy += n * at.step_time_s * at.power_w

    def energy_j(self) -> float:
        return self._energy

    def power_limit_range_w(self) -> tuple[float, float]:
        return float(min(self.profile)), float(max(self.profile))

    def get_power_limit_w(self) -> float:
        return float(self._limit)

    def set_power_limit_w(self, watts: float) -> None:
        if not self.allow_set:
            raise PermissionDenied(f"{self.name}: simulated missing permission to set power limits.")
        if int(watts) not in self.profile:
            raise ValueError(f"{self.name}: power limit {watts} W not in the trace {sorted(self.profile)}.")
        self._limit = int(watts)
        self.set_calls.append(self._limit)
