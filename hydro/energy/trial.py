"""Energy accounting and power-limit control for one training run (e.g. one Ray Tune trial).

The power limit of a (model, device, batch size) is profiled once and reused: the first run claims the
profile in the shared :class:`schedulers.energy.store.EnergyStore` (a lease it renews while profiling),
profiles during its first steps and stores the windows; later runs on the same hardware (:func:`device_key`)
apply the stored choice at once. A run that finds the profile claimed but not finished, or its card's power
limit controlled by another process (:mod:`hydro.energy.card_lock`), trains at the limit it found and tries
again every ``poll_steps`` steps; a claim whose lease ran out (its owner was killed) is taken over.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence

from hydro.energy.card_lock import DEFAULT_WAIT_S, CardBusy
from hydro.energy.device import EnergyDevice, EnergyError, NotSupported
from hydro.energy.monitor import EnergyMonitor
from hydro.energy.power_limit import PowerLimitProfiler, PowerLimitWarning, power_ceiling_w
from schedulers.energy.power_limit import PowerLimitOptimizer, energy_cost
from schedulers.energy.store import DEFAULT_LEASE_S, ClaimOwner, EnergyStore, ProfileKey

logger = logging.getLogger(__name__)

_RUN = "__hydro_trial"


def device_key(devices: Sequence[EnergyDevice]) -> str:
    """The hardware ``devices`` are, as the store keys profiles: each kind with its count, and its share where
    a trial has part of a card, e.g. ``2x nvml:NVIDIA A100-SXM4-40GB`` or ``1x nvml:NVIDIA H100 80GB HBM3*0.25``."""
    kinds = Counter(d.kind if d.share == 1 else f"{d.kind}*{d.share:g}" for d in devices)
    return "+".join(f"{n}x {kind}" for kind, n in sorted(kinds.items()))


def _controllable(d: EnergyDevice) -> bool:
    try:
        d.power_limit_range_w()
        d.get_power_limit_w()
    except NotSupported:
        return False
    return True


class TrialEnergy:
    """``with TrialEnergy(devices, store=..., model=..., batch_size=...) as e:`` call ``e.on_step()``
    after each training step and report ``e.metrics()``: cumulative ``energy_j`` (J), ``time_s`` (s),
    ``cost`` (J, η·E + (1−η)·MaxPower·T) and the applied ``power_limit_w`` (W, None if none).

    All ``devices`` are measured; those with a settable limit are controlled, never above ``ceiling_w``
    (W; default: the lowest limit they have at start), and key the stored profile (:func:`device_key`).
    ``max_power_w`` defaults to the ceiling times their summed ``share`` (a quarter of a card: a quarter of its
    MaxPower, so the cost is that share of the card's). A profiling claim holds a lease of ``lease_s`` (s),
    renewed every third of it while profiling. A card whose limit another process controls is waited for at
    most ``lock_wait_s`` (s) the first time control is tried, and not at all at the later polls (training goes
    on meanwhile, measured, at the card's current limit).
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
        ceiling_w: float | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        lock_wait_s: float = DEFAULT_WAIT_S,
    ) -> None:
        self.control = [d for d in devices if _controllable(d)]
        self.ceiling_w = power_ceiling_w(self.control, ceiling_w) if self.control else None
        if max_power_w is None:
            if not self.control:
                raise EnergyError(
                    "no device with a power limit to derive MaxPower from; pass max_power_w (W) for the cost."
                )
            max_power_w = self.ceiling_w * sum(d.share for d in self.control)
        self.store, self.model, self.batch_size = store, model, int(batch_size)
        self.key = ProfileKey(model, device_key(self.control), self.batch_size)
        self.eta, self.max_power_w = eta, float(max_power_w)
        self._monitor = EnergyMonitor(devices, clock)
        self._profiling_args = {"eta": eta, "warmup_steps": warmup_steps, "window_steps": window_steps, "clock": clock,
                                "ceiling_w": self.ceiling_w, "max_power_w": self.max_power_w}
        self._lock_wait_s = lock_wait_s
        self._poll_steps = poll_steps
        self._steps = 0
        self.owner = ClaimOwner.this_process()
        self._lease_s = lease_s
        self._claimed = False
        self._renewed_at = 0.0
        self.profiler: PowerLimitProfiler | None = None
        self.profiled_here = False
        self.card_busy: str | None = None  # why the last try to control the cards failed, if it did

    def _stored_limit(self) -> int | None:
        """The cheapest stored limit not above the ceiling, or None if the key is not profiled."""
        windows = [w for w in self.store.load_profile(self.key) if w.power_limit_w <= self.ceiling_w]
        if not windows:
            return None
        return PowerLimitOptimizer.from_measurements(windows, eta=self.eta, max_power_w=self.max_power_w).best()

    def _save(self, limit: int, optimizer: PowerLimitOptimizer) -> None:
        self.profiled_here = self.store.save_profile(self.key, optimizer.measurements)
        self._release()

    def _release(self) -> None:
        if self._claimed:
            self.store.release_claim(self.key, self.owner)
            self._claimed = False

    def _start_control(self) -> None:
        wait = {"lock_wait_s": self._lock_wait_s if self.card_busy is None else 0.0}
        try:
            known = self._stored_limit()
            if known is not None:
                self.profiler = PowerLimitProfiler(self.control, known_limit=known, **self._profiling_args, **wait)
            elif self.store.claim_profile(self.key, self.owner, self._lease_s):
                self._claimed, self._renewed_at = True, self.store.clock()
                self.profiler = PowerLimitProfiler(self.control, on_chosen=self._save, **self._profiling_args, **wait)
        except CardBusy as busy:
            self._release()
            message = (f"{busy}; this trial keeps the card's current limit, is still measured, and tries again "
                       f"every {self._poll_steps} steps")
            if self.card_busy is None:
                warnings.warn(message, PowerLimitWarning, stacklevel=3)
            else:
                logger.info("%s", message)
            self.card_busy = message
            return
        self.card_busy = None

    def _renew(self) -> None:
        """Keep the profiling claim's lease alive (every third of the lease)."""
        now = self.store.clock()
        if self._claimed and now - self._renewed_at >= self._lease_s / 3:
            self._renewed_at = now
            self.store.renew_claim(self.key, self.owner, self._lease_s)

    def __enter__(self) -> TrialEnergy:
        self._monitor.begin_window(_RUN)
        if self.control:
            self._start_control()
        return self

    def on_step(self) -> None:
        """Call after every training step."""
        self._steps += 1
        if self.profiler is not None:
            self._renew()
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
        self._release()
