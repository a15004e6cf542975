"""Energy accounting and power-limit control for one training run (e.g. one Ray Tune trial).

The power limit of a (model, batch size) is profiled once and reused: the first run claims the
profile in the shared :class:`schedulers.energy.store.EnergyStore`, profiles during its first
steps and stores the windows; later runs apply the stored choice at once. A run that finds the
profile claimed but not finished trains at the maximum limit and checks the store every
``poll_steps`` steps.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hydro.energy.device import EnergyDevice, EnergyError, NotSupported
from hydro.energy.monitor import EnergyMonitor
from hydro.energy.power_limit import PowerLimitProfiler
from schedulers.energy.power_limit import PowerLimitOptimizer, energy_cost
from schedulers.energy.store import EnergyStore

_RUN = "__hydro_trial"


def _controllable(d: EnergyDevice) -> bool:
    try:
        d.power_limit_range_w()
    except NotSupported:
        return False
    return True


class TrialEnergy:
    """``with TrialEnergy(devices, store=..., model=..., batch_size=...) as e:`` call ``e.on_step()``
    after each training step and report ``e.metrics()``: cumulative ``energy_j`` (J), ``time_s`` (s),
    ``cost`` (J, η·E + (1−η)·MaxPower·T) and the applied ``power_limit_w`` (W, None if none).

    All ``devices`` are measured; those with a settable limit are controlled. ``max_power_w``
    defaults to the sum of their maximum limits.
    """

    def __init__(
        self,
        devices: Sequence[EnergyDevice],
        *,
        store: EnergyStore,
        model: str,
        batch_size: int,
        eta: float = 0.5,
        max_power_w: float | None = None,
        warmup_steps: int = 10,
        window_steps: int = 40,
        poll_steps: int = 100,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.control = [d for d in devices if _controllable(d)]
        if max_power_w is None:
            if not self.control:
                raise EnergyError(
                    "no device with a power limit to derive MaxPower from; pass max_power_w (W) for the cost."
                )
            max_power_w = sum(d.power_limit_range_w()[1] for d in self.control)
        self.store, self.model, self.batch_size = store, model, int(batch_size)
        self.eta, self.max_power_w = eta, float(max_power_w)
        self._monitor = EnergyMonitor(devices, clock)
        self._profiling_args = {"eta": eta, "warmup_steps": warmup_steps, "window_steps": window_steps, "clock": clock}
        self._poll_steps = poll_steps
        self._steps = 0
        self._claimed = False
        self.profiler: PowerLimitProfiler | None = None
        self.profiled_here = False

    def _stored_limit(self) -> int | None:
        windows = self.store.load_profile(self.model, self.batch_size)
        if not windows:
            return None
        return PowerLimitOptimizer.from_measurements(windows, eta=self.eta, max_power_w=self.max_power_w).best()

    def _save(self, limit: int, optimizer: PowerLimitOptimizer) -> None:
        self.store.save_profile(self.model, self.batch_size, optimizer.measurements)
        self.profiled_here = True

    def _start_control(self) -> None:
        known = self._stored_limit()
        if known is not None:
            self.profiler = PowerLimitProfiler(self.control, known_limit=known, **self._profiling_args)
        elif self.store.claim_profile(self.model, self.batch_size):
            self._claimed = True
            self.profiler = PowerLimitProfiler(self.control, on_chosen=self._save, **self._profiling_args)

    def __enter__(self) -> TrialEnergy:
        self._monitor.begin_window(_RUN)
        if self.control:
            self._start_control()
        return self

    def on_step(self) -> None:
        """Call after every training step."""
        self._steps += 1
        if self.profiler is not None:
            self.profiler.on_step()
        elif self.control and self._steps % self._poll_steps == 0:
            self._start_control()

    @property
    def power_limit_w(self) -> int | None:
        """The limit (W) applied after profiling or from the store; None while profiling or uncontrolled."""
        return self.profiler.chosen_limit if self.profiler else None

    def metrics(self) -> dict[str, float | int | None]:
        """Cumulative ``energy_j`` (J), ``time_s`` (s), ``cost`` (J) and ``power_limit_w`` (W) so far."""
        m = self._monitor.peek_window(_RUN)
        energy = m.total_energy_j
        return {
            "energy_j": energy,
            "time_s": m.time_s,
            "cost": energy_cost(energy, m.time_s, self.eta, self.max_power_w),
            "power_limit_w": self.power_limit_w,
        }

    def __exit__(self, *exc) -> None:
        self._monitor.cancel_window(_RUN)
        if self.profiler is not None:
            self.profiler.close()
        if self._claimed and not self.profiled_here:
            self.store.release_claim(self.model, self.batch_size)
