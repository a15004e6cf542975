"""Measurement windows over a set of devices: named, nestable, returning time (s) and energy (J).

Every read first synchronises the devices (:meth:`EnergyDevice.synchronize`), so a window covers the work
queued inside it, not just the time it took to queue it."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from hydro.energy.device import EnergyDevice, EnergyError


class WindowError(EnergyError):
    """A window was begun twice or ended without being begun."""


@dataclass(frozen=True)
class Measurement:
    """A closed window: duration ``time_s`` (s) and energy per device name (J)."""

    time_s: float
    energy_j: dict[str, float]

    @property
    def total_energy_j(self) -> float:
        """Energy summed over devices (J)."""
        return sum(self.energy_j.values())


@dataclass
class WindowResult:
    """Filled when a :meth:`EnergyMonitor.window` block exits."""

    measurement: Measurement | None = field(default=None)


class EnergyMonitor:
    """Measures windows over ``devices``; ``clock`` returns seconds (default ``time.monotonic``)."""

    def __init__(self, devices: Sequence[EnergyDevice], clock: Callable[[], float] = time.monotonic) -> None:
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise ValueError(f"device names must be unique, got {names}.")
        self.devices = list(devices)
        self._clock = clock
        self._open: dict[str, tuple[float, list[float]]] = {}

    def _read(self) -> tuple[float, list[float]]:
        """Time (s) and energy per device (J), after the devices finished their queued work."""
        for d in self.devices:
            d.synchronize()
        return self._clock(), [d.energy_j() for d in self.devices]

    def begin_window(self, name: str) -> None:
        """Start window ``name``; windows may nest or overlap as long as names differ."""
        if name in self._open:
            raise WindowError(f"window {name!r} is already open; end it first or use another name.")
        self._open[name] = self._read()

    def peek_window(self, name: str) -> Measurement:
        """Time (s) and energy per device (J) of open window ``name`` so far; it stays open."""
        if name not in self._open:
            raise WindowError(f"window {name!r} was not begun (open: {sorted(self._open)}).")
        start, before = self._open[name]
        now, after = self._read()
        return Measurement(now - start, {d.name: a - b for d, a, b in zip(self.devices, after, before)})

    def end_window(self, name: str) -> Measurement:
        """Close window ``name`` and return its time (s) and energy per device (J)."""
        measurement = self.peek_window(name)
        del self._open[name]
        return measurement

    def cancel_window(self, name: str) -> None:
        """Drop window ``name`` without measuring (e.g. when the measured code raised)."""
        self._open.pop(name, None)

    @contextmanager
    def window(self, name: str) -> Iterator[WindowResult]:
        """``with monitor.window("epoch") as w: ...`` then ``w.measurement``."""
        result = WindowResult()
        self.begin_window(name)
        try:
            yield result
        except BaseException:
            self.cancel_window(name)
            raise
        result.measurement = self.end_window(name)
