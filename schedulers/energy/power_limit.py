"""Zeus's just-in-time power-limit choice as a plain-Python optimizer (no hardware).

Each profiling window runs the same amount of work (the same number of training steps) at one
power limit, so the window's time and energy compare limits directly. The cost of a window is
η·E + (1−η)·MaxPower·T (J), with E in J, T in s and MaxPower in W.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class PowerLimitError(ValueError):
    """Invalid power-limit optimizer input or a query before any window was observed."""


def energy_cost(energy_j: float, time_s: float, eta: float, max_power_w: float) -> float:
    """Zeus cost η·E + (1−η)·MaxPower·T, in J."""
    return eta * energy_j + (1.0 - eta) * max_power_w * time_s


@dataclass(frozen=True)
class LimitMeasurement:
    """Time (s) and energy (J) of one profiling window at ``power_limit_w`` (W)."""

    power_limit_w: int
    time_s: float
    energy_j: float


class PowerLimitOptimizer:
    """Picks the power limit for one (job, batch size) from profiling windows.

    ``power_limits`` are the candidate limits (W); profiling goes from the highest to the lowest
    (:meth:`next_limit`). ``max_power_w`` is MaxPower of the cost (highest limit × number of GPUs).
    """

    def __init__(self, power_limits: Iterable[float], *, eta: float = 0.5, max_power_w: float) -> None:
        limits = sorted({int(p) for p in power_limits}, reverse=True)
        if not limits:
            raise PowerLimitError("power_limits is empty; pass the device's supported limits in W.")
        if not 0.0 <= eta <= 1.0:
            raise PowerLimitError(f"eta={eta} is outside [0, 1]; 0 = time only, 1 = energy only.")
        if max_power_w <= 0:
            raise PowerLimitError(f"max_power_w={max_power_w} must be positive (W).")
        self.power_limits = limits
        self.eta = eta
        self.max_power_w = float(max_power_w)
        self._measurements: dict[int, LimitMeasurement] = {}

    @classmethod
    def from_measurements(
        cls, windows: Iterable[LimitMeasurement], *, eta: float = 0.5, max_power_w: float
    ) -> PowerLimitOptimizer:
        """An optimizer over the limits of stored ``windows``, with all of them observed."""
        windows = list(windows)
        opt = cls([w.power_limit_w for w in windows], eta=eta, max_power_w=max_power_w)
        for w in windows:
            opt.observe(w.power_limit_w, w.time_s, w.energy_j)
        return opt

    def observe(self, power_limit: float, time_s: float, energy_j: float) -> None:
        """Record one profiling window at ``power_limit`` (W): duration ``time_s`` (s), ``energy_j`` (J)."""
        limit = int(power_limit)
        if limit not in self.power_limits:
            raise PowerLimitError(f"power limit {power_limit} W is not a candidate {self.power_limits}.")
        if not (time_s > 0 and energy_j >= 0):
            raise PowerLimitError(f"window at {limit} W needs time_s > 0 and energy_j >= 0, got {time_s}, {energy_j}.")
        self._measurements[limit] = LimitMeasurement(limit, float(time_s), float(energy_j))

    @property
    def measurements(self) -> list[LimitMeasurement]:
        """Observed windows, highest limit first."""
        return [self._measurements[p] for p in self.power_limits if p in self._measurements]

    def next_limit(self) -> int | None:
        """The highest candidate limit (W) not profiled yet, or None when profiling is complete."""
        return next((p for p in self.power_limits if p not in self._measurements), None)

    @property
    def done(self) -> bool:
        """True once every candidate limit has a window."""
        return self.next_limit() is None

    def cost(self, m: LimitMeasurement) -> float:
        """Cost (J) of a window under this optimizer's η and MaxPower."""
        return energy_cost(m.energy_j, m.time_s, self.eta, self.max_power_w)

    def _observed(self) -> list[LimitMeasurement]:
        if not self._measurements:
            raise PowerLimitError("no profiling window observed yet; call observe() first.")
        return self.measurements

    def best(self) -> int:
        """Limit (W) of minimum cost η·E + (1−η)·MaxPower·T; ties go to the higher limit."""
        return min(self._observed(), key=self.cost).power_limit_w

    def best_energy(self) -> int:
        """Limit (W) of minimum energy."""
        return min(self._observed(), key=lambda m: m.energy_j).power_limit_w

    def best_time(self) -> int:
        """Limit (W) of minimum time."""
        return min(self._observed(), key=lambda m: m.time_s).power_limit_w

    def best_within_slowdown(self, max_slowdown: float) -> int:
        """Lowest-energy limit (W) whose time is at most ``max_slowdown`` × the time at the highest
        observed limit (e.g. 1.1 = at most 10% slower)."""
        if max_slowdown < 1.0:
            raise PowerLimitError(f"max_slowdown={max_slowdown} must be >= 1 (1.1 = 10% slower allowed).")
        observed = self._observed()
        budget = observed[0].time_s * max_slowdown
        return min((m for m in observed if m.time_s <= budget), key=lambda m: m.energy_j).power_limit_w
