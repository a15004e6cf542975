"""JIT power-limit profiling on real devices, driven by the training loop.

For each candidate limit, from the ceiling down to the lowest common limit (25 W steps): set it on every
device, run ``warmup_steps`` steps, then measure ``window_steps`` steps; the same work per window makes the
windows comparable, and :class:`schedulers.energy.PowerLimitOptimizer` picks the limit of minimum cost.

Hydro never raises a limit above what it found: the ceiling is the lowest limit the devices had at start
(an administrator's cap stays in force) unless ``ceiling_w`` overrides it. The limit each device had at start
is put back exactly, per device, on every exit path: ``close()``, leaving the ``with`` block (normally or by
an exception), interpreter exit and SIGTERM/SIGINT (:mod:`hydro.energy.exit_guard`).

A profiler controls its cards only while it holds their locks (:mod:`hydro.energy.card_lock`), from before it
reads their limits until after it restores them: one process controls a card's limit at a time.
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence

from hydro.energy import exit_guard
from hydro.energy.card_lock import DEFAULT_WAIT_S, CardLocks
from hydro.energy.device import EnergyDevice, EnergyError, NotSupported, PermissionDenied
from hydro.energy.monitor import EnergyMonitor
from schedulers.energy.power_limit import PowerLimitOptimizer

_WINDOW = "__hydro_power_limit_{}"


class PowerLimitWarning(UserWarning):
    """Power limits cannot be set here; training continues at the current limit, still measured."""


def power_ceiling_w(devices: Sequence[EnergyDevice], override_w: float | None = None) -> float:
    """The highest limit (W) Hydro may set: ``override_w`` if given, else the lowest current limit."""
    return float(override_w) if override_w is not None else min(d.get_power_limit_w() for d in devices)


def candidate_limits(devices: Sequence[EnergyDevice], step_w: int = 25, ceiling_w: float | None = None) -> list[int]:
    """Limits (W) every device supports, from the lowest common maximum (or ``ceiling_w`` if lower) down to the
    highest minimum."""
    ranges = [d.power_limit_range_w() for d in devices]
    low, high = max(r[0] for r in ranges), min(r[1] for r in ranges)
    if ceiling_w is not None:
        if ceiling_w < low:
            raise ValueError(f"hydro.energy: power ceiling {ceiling_w} W is below the lowest settable limit {low} W "
                             f"of {[d.name for d in devices]}; raise the ceiling (ceiling_w) or the devices' limits.")
        high = min(high, ceiling_w)
    return list(range(int(high), int(low) - 1, -step_w))


class PowerLimitProfiler:
    """Profiles and applies the power limit for one training job on ``devices``.

    Call :meth:`on_step` after every training step. With ``known_limit`` (a profile from an earlier
    run), that limit is applied at once and nothing is profiled. ``on_chosen(limit, optimizer)``
    is called once profiling has picked a limit (e.g. to store the windows). ``ceiling_w`` (W) overrides
    the ceiling, by default the lowest limit the devices have now; ``max_power_w`` (W) is MaxPower of the cost
    (default: the ceiling times the devices' summed ``share``, e.g. 0.25 of it for a quarter of one card).
    ``saved_limits_w`` holds each device's limit at start, which :meth:`restore` puts back.

    Raises:
        CardBusy: another process holds a card's lock after ``lock_wait_s`` seconds (nothing was changed).
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
        ceiling_w: float | None = None,
        max_power_w: float | None = None,
        lock_wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        if not devices:
            raise ValueError("no devices to profile; pass at least one EnergyDevice.")
        if warmup_steps < 0 or window_steps < 1:
            raise ValueError(f"need warmup_steps >= 0 and window_steps >= 1, got {warmup_steps}, {window_steps}.")
        self.devices = list(devices)
        self._locks = CardLocks((d.card_id for d in self.devices if d.card_id is not None), wait_s=lock_wait_s)
        self._changed: set[int] = set()  # positions of the devices whose limit this profiler set
        self._locks.acquire()  # before reading the limits: another process's limit is not this card's own
        try:
            self.saved_limits_w = [d.get_power_limit_w() for d in self.devices]
            limits = candidate_limits(self.devices, step_w, power_ceiling_w(self.devices, ceiling_w))
            if known_limit is not None and known_limit > limits[0]:
                raise ValueError(f"hydro.energy: known_limit {known_limit} W is above the ceiling {limits[0]} W; "
                                 f"pick the stored limit among those <= the ceiling.")
            max_power_w = max(limits) * sum(d.share for d in self.devices) if max_power_w is None else max_power_w
            self.optimizer = PowerLimitOptimizer(limits, eta=eta, max_power_w=max_power_w)
            self._monitor = EnergyMonitor(self.devices, clock)
            self._warmup, self._window = warmup_steps, window_steps
            self._on_chosen = on_chosen
            self._steps = 0
            self._measuring: int | None = None
            self.chosen_limit: int | None = None
            self.controllable = True
            exit_guard.guard(self.restore)
            self._start(known_limit)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ control
    def _set_all(self, watts: float) -> bool:
        """Set ``watts`` on every device; if one refuses (no permission, not supported) warn once, put back the
        devices already set and stop controlling."""
        for i, d in enumerate(self.devices):
            try:
                d.set_power_limit_w(watts)
            except (PermissionDenied, NotSupported) as err:
                self.controllable = False
                warnings.warn(f"hydro.energy: cannot set the power limit of {d.name} ({type(err).__name__}: {err}); "
                              f"power-limit tuning is off for this run, every device keeps the limit it had, and "
                              f"energy is still measured.", PowerLimitWarning, stacklevel=3)
                self.restore()
                self._locks.release()
                return False
            self._changed.add(i)
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
        """Put each device this profiler changed back to the limit it had at start."""
        changed, self._changed = sorted(self._changed), set()
        for i in changed:
            d, saved = self.devices[i], self.saved_limits_w[i]
            try:
                d.set_power_limit_w(saved)
            except EnergyError as err:
                warnings.warn(f"hydro.energy: could not restore {d.name} to {saved} W: {err}", PowerLimitWarning,
                              stacklevel=2)

    def close(self) -> None:
        """Restore the limits found at start, drop the exit hooks and let go of the cards' locks."""
        self.restore()
        exit_guard.release(self.restore)
        self._locks.release()

    def __enter__(self) -> PowerLimitProfiler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
