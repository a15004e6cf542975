"""JIT power-limit profiling on real devices, driven by the training loop.

For each candidate limit, from the highest to the lowest (25 W steps): set it on every device, run
``warmup_steps`` steps, then measure ``window_steps`` steps; the same work per window makes the
windows comparable, and :class:`schedulers.energy.PowerLimitOptimizer` picks the limit of minimum
cost. The maximum limit is restored on every exit path: ``close()``, leaving the ``with`` block
(normally or by an exception) and interpreter exit (``atexit``).
"""
from __future__ import annotations

import atexit
import time
import warnings
from collections.abc import Callable, Sequence

from hydro.energy.device import EnergyDevice, EnergyError, PermissionDenied
from hydro.energy.monitor import EnergyMonitor
from schedulers.energy.power_limit import PowerLimitOptimizer

_WINDOW = "__hydro_power_limit_{}"


class PowerLimitWarning(UserWarning):
    """Power limits cannot be set here; training continues at the current limit, still measured."""


def candidate_limits(devices: Sequence[EnergyDevice], step_w: int = 25) -> list[int]:
    """Limits (W) every device supports: from the lowest common maximum down to the highest minimum."""
    ranges = [d.power_limit_range_w() for d in devices]
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    return list(range(int(high), int(low) - 1, -step_w))


class PowerLimitProfiler:
    """Profiles and applies the power limit for one training job on ``devices``.

    Call :meth:`on_step` after every training step. With ``known_limit`` (a profile from an earlier
    run), that limit is applied at once and nothing is profiled. ``on_chosen(limit, optimizer)``
    is called once profiling has picked a limit (e.g. to store the windows).
    """

    def __init__(
        self,
        devices: Sequence[EnergyDevice],
        *,
        eta: float = 0.5,
        warmup_steps: int = 10,
        window_steps: int = 40,
        step_w: int = 25,
        known_limit: int | None = None,
        on_chosen: Callable[[int, PowerLimitOptimizer], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not devices:
            raise ValueError("no devices to profile; pass at least one EnergyDevice.")
        if warmup_steps < 0 or window_steps < 1:
            raise ValueError(f"need warmup_steps >= 0 and window_steps >= 1, got {warmup_steps}, {window_steps}.")
        self.devices = list(devices)
        self._max_limits = [d.power_limit_range_w()[1] for d in self.devices]
        limits = candidate_limits(self.devices, step_w)
        self.optimizer = PowerLimitOptimizer(limits, eta=eta, max_power_w=max(limits) * len(self.devices))
        self._monitor = EnergyMonitor(self.devices, clock)
        self._warmup, self._window = warmup_steps, window_steps
        self._on_chosen = on_chosen
        self._steps = 0
        self._measuring: int | None = None
        self._changed = False
        self.chosen_limit: int | None = None
        self.controllable = True
        atexit.register(self.restore)
        self._start(known_limit)

    # ------------------------------------------------------------ control
    def _set_all(self, watts: float) -> bool:
        """Set ``watts`` on every device; on missing permission warn once and stop controlling."""
        try:
            for d in self.devices:
                d.set_power_limit_w(watts)
                self._changed = True
        except PermissionDenied as err:
            self.controllable = False
            warnings.warn(f"{err} Training continues at the current power limit; energy is still measured.", PowerLimitWarning, stacklevel=3)
            self.restore()
            return False
        return True

    def _start(self, known_limit: int | None) -> None:
        if known_limit is not None:
            if self._set_all(known_limit):
                self.chosen_limit = known_limit
            return
        self._profile(self.optimizer.next_limit())

    def _profile(self, limit: int) -> None:
        if self._set_all(limit):
            self._limit, self._steps = limit, 0
            if self._warmup == 0:
                self._begin()

    def _begin(self) -> None:
        self._measuring = self._limit
        self._steps = 0
        self._monitor.begin_window(_WINDOW.format(self._limit))

    @property
    def profiling(self) -> bool:
        """True while windows are still being measured."""
        return self.controllable and self.chosen_limit is None

    def on_step(self) -> None:
        """Advance profiling by one finished training step."""
        if not self.profiling:
            return
        self._steps += 1
        if self._measuring is None:
            if self._steps >= self._warmup:
                self._begin()
            return
        if self._steps < self._window:
            return
        m = self._monitor.end_window(_WINDOW.format(self._measuring))
        self.optimizer.observe(self._measuring, m.time_s, m.total_energy_j)
        self._measuring = None
        nxt = self.optimizer.next_limit()
        if nxt is not None:
            self._profile(nxt)
            return
        best = self.optimizer.best()
        if self._set_all(best):
            self.chosen_limit = best
            if self._on_chosen:
                self._on_chosen(best, self.optimizer)

    # ------------------------------------------------------------ cleanup
    def restore(self) -> None:
        """Put every device back to its maximum limit if this profiler changed anything."""
        if not self._changed:
            return
        self._changed = False
        for d, high in zip(self.devices, self._max_limits):
            try:
                d.set_power_limit_w(high)
            except EnergyError as err:
                warnings.warn(f"could not restore {d.name} to {high} W: {err}", PowerLimitWarning, stacklevel=2)

    def close(self) -> None:
        """Restore the maximum limits and drop the ``atexit`` hook."""
        self.restore()
        atexit.unregister(self.restore)

    def __enter__(self) -> PowerLimitProfiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
