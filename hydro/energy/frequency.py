"""GPU frequency (DVFS) control: a guard that restores the default clock on every exit path, a module
wrapper that applies a per-instruction frequency plan, and a simulated DVFS device that executes
frequencies on a CPU-only machine.

The simulated device follows a standard DVFS model: an instruction that takes ``base_s`` at the highest
clock takes ``base_s * (c * f_max / f + 1 - c)`` at clock ``f`` (``c``: its compute-bound share; memory-bound
work does not slow down), and the device draws ``static_w + dynamic_w * (f / f_max) * (V(f) / V(f_max))**2``
watts while computing, the voltage ``V`` falling linearly with the clock down to a floor. Below the knee
where the voltage stops falling, static power over a longer time outweighs the dynamic saving, so energy
rises again — the shape of Perseus's profiles. Between instructions it draws ``blocking_w``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hydro.energy.device import EnergyDevice, PermissionDenied
from hydro.energy.simulated import VirtualClock

logger = logging.getLogger(__name__)


@contextmanager
def restoring_default_clock(device: EnergyDevice) -> Iterator[EnergyDevice]:
    """Run the body, then reset ``device``'s clock to the driver default however the body exits."""
    try:
        yield device
    finally:
        device.reset_frequency()
        logger.debug("%s: clock reset to the default", device.name)


class _Boundary(torch.autograd.Function):
    """Identity whose backward calls ``callback``: marks where a backward instruction starts or ends."""

    @staticmethod
    def forward(ctx, callback: Callable[[], None], x: Tensor, anchor: Tensor) -> Tensor:  # noqa: ARG004
        ctx.callback = callback
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, None]:
        ctx.callback()
        return None, grad, None


class FrequencyPlanned(nn.Module):
    """A stage's model that runs its instructions at planned clocks: ``frequencies[i]`` (MHz) is set on
    ``device`` before the stage's i-th instruction of an iteration (forward: the call; backward: when the
    gradient reaches the output) and the instruction is completed on the device after it (its input, or a
    zero-size anchor on the first stage, marks the end of the backward)."""

    def __init__(self, model: nn.Module, frequencies: Sequence[int], device: EnergyDevice) -> None:
        super().__init__()
        if not frequencies:
            raise ValueError("energy.frequency: the frequency plan is empty; give one MHz per instruction.")
        self.model, self.frequencies, self.device = model, list(frequencies), device
        self.instructions = 0  # instructions run so far (the plan repeats every iteration)
        self._anchor = torch.zeros((), requires_grad=True)
        self._started = 0.0

    def _begin(self) -> None:
        self.device.set_frequency_mhz(self.frequencies[self.instructions % len(self.frequencies)])
        self._started = time.perf_counter()

    def _end(self) -> None:
        self.device.synchronize()
        self.device.finish_instruction(time.perf_counter() - self._started)
        self.instructions += 1

    def forward(self, x: Tensor) -> Tensor:
        self._begin()
        out = self.model(_Boundary.apply(self._end, x, self._anchor))
        self._end()
        return _Boundary.apply(self._begin, out, self._anchor)


@dataclass(frozen=True)
class DVFSModel:
    """Time and power of one simulated GPU at each clock (MHz); see the module docstring for the formulas.

    ``voltage_floor``: V(f_min) / V(f_max) reached at ``knee_mhz`` and below."""

    frequencies_mhz: tuple[int, ...]
    compute_share: float = 0.55
    static_w: float = 120.0
    dynamic_w: float = 180.0
    voltage_floor: float = 0.75
    knee_mhz: int = 1200
    blocking_w: float = 75.0

    def __post_init__(self) -> None:
        if not self.frequencies_mhz:
            raise ValueError("energy.frequency: DVFSModel needs at least one frequency.")
        if not 0 <= self.compute_share <= 1:
            raise ValueError(f"energy.frequency: compute_share {self.compute_share} must be in [0, 1].")

    @property
    def max_mhz(self) -> int:
        return max(self.frequencies_mhz)

    def time_s(self, base_s: float, mhz: int) -> float:
        """Duration (s) at ``mhz`` of work that takes ``base_s`` at the highest clock."""
        return base_s * (self.compute_share * self.max_mhz / mhz + 1 - self.compute_share)

    def power_w(self, mhz: int) -> float:
        """Power (W) while computing at ``mhz``."""
        top = self.max_mhz
        if mhz <= self.knee_mhz:
            voltage = self.voltage_floor
        else:
            voltage = self.voltage_floor + (1 - self.voltage_floor) * (mhz - self.knee_mhz) / (top - self.knee_mhz)
        return self.static_w + self.dynamic_w * (mhz / top) * voltage**2


class SimulatedDVFSDevice(EnergyDevice):
    """A GPU stand-in whose clock changes how long instructions take and how much energy they use.

    With a :class:`VirtualClock` nothing waits (profiles and plans are evaluated instantly); without one
    the device lives on the wall clock and :meth:`finish_instruction` sleeps the slowdown, so a real pipeline
    on CPU runs at the planned speed. ``allow_set=False`` simulates a process without clock privileges.
    """

    def __init__(self, name: str, model: DVFSModel, clock: VirtualClock | None = None, *,
                 allow_set: bool = True) -> None:
        self.name, self.model, self.clock, self.allow_set = name, model, clock, allow_set
        self._mhz = model.max_mhz
        self._start = self.now()
        self._busy_s = 0.0
        self._busy_j = 0.0
        self.clock_history: list[int | str] = []  # locked MHz, or "reset"

    def now(self) -> float:
        return self.clock.now() if self.clock is not None else time.perf_counter()

    def energy_j(self) -> float:
        idle_s = self.now() - self._start - self._busy_s
        return self._busy_j + self.model.blocking_w * max(idle_s, 0.0)

    def supported_frequencies_mhz(self) -> list[int]:
        return sorted(self.model.frequencies_mhz, reverse=True)

    def get_frequency_mhz(self) -> int:
        return self._mhz

    def set_frequency_mhz(self, mhz: int) -> None:
        if not self.allow_set:
            raise PermissionDenied(f"{self.name}: simulated missing permission to lock clocks.")
        if mhz not in self.model.frequencies_mhz:
            raise ValueError(f"{self.name}: {mhz} MHz is not a supported clock ({min(self.model.frequencies_mhz)}.."
                             f"{self.model.max_mhz} MHz); plan with the profiled frequencies.")
        self._mhz = mhz
        self.clock_history.append(mhz)

    def reset_frequency(self) -> None:
        if not self.allow_set:
            raise PermissionDenied(f"{self.name}: simulated missing permission to reset clocks.")
        self._mhz = self.model.max_mhz
        self.clock_history.append("reset")

    def finish_instruction(self, host_s: float) -> float:
        """Stretch ``host_s`` of work to the current clock (advancing the virtual clock, or sleeping the
        difference on the wall clock) and count its energy; returns its duration (s)."""
        duration = self.model.time_s(host_s, self._mhz)
        if self.clock is not None:
            self.clock.advance(duration)
        else:
            time.sleep(duration - host_s)
        self._busy_s += duration
        self._busy_j += duration * self.model.power_w(self._mhz)
        return duration
