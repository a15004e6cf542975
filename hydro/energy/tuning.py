"""The energy settings of a tuning run (``hydro tune --energy``) and the observer each of its trials attaches.

Power-limit profiles are stored per (``job``/F<members>, device, batch size): a fused trial of F members at batch
size b profiles once on its hardware, and every later trial with the same (F, b) on the same hardware — in this
run or a later one sharing ``store_path`` — applies the stored choice; a simulated device, another GPU model or
another share of a card profiles anew (:func:`hydro.energy.trial.device_key`).
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from hydro.checks import check, is_count
from hydro.energy.detect import detect_devices
from hydro.energy.device import EnergyError
from hydro.energy.nvml import NVMLDevice
from hydro.energy.observer import EnergyObserver
from hydro.energy.share import CardShare
from hydro.energy.simulated import VirtualClock
from hydro.energy.simulated_gpu import simulated_trial_gpu
from hydro.energy.trial import TrialEnergy
from hydro.trial.unit import FusedTrial
from schedulers.energy.store import EnergyStore


class DeviceSource(enum.StrEnum):
    DETECT = "detect"        # this host's NVIDIA GPUs (NVML) and RAPL CPU packages
    SIMULATED = "simulated"  # one simulated GPU per trial (hydro.energy.simulated_gpu), on a virtual clock


@dataclass(frozen=True)
class EnergySettings:
    """``store_path``: the SQLite store of profiles and bandit observations; ``job``: the recurring tuning job's
    name in it; ``eta``: energy weight of the cost in [0, 1]; ``beta`` > 1: a trial whose cost per member-epoch
    passes β·(the least of a finished trial) is stopped; ``batch_sizes``: the bandit's arms (empty: the bandit is
    off); ``warmup_steps``/``window_steps``: steps per profiled limit; ``max_power_w``: MaxPower (W) of the cost when
    no device has a power limit (e.g. RAPL only)."""

    store_path: str
    job: str
    devices: DeviceSource = DeviceSource.DETECT
    eta: float = 0.5
    beta: float = 2.0
    batch_sizes: tuple[int, ...] = ()
    warmup_steps: int = 10
    window_steps: int = 40
    max_power_w: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"hydro.energy: eta={self.eta} is outside [0, 1] (0: time only, 1: energy only)")
        if not self.beta > 1.0:
            raise ValueError(f"hydro.energy: beta={self.beta} must be > 1 (trials stop at beta x the least cost)")
        if not all(is_count(b) for b in self.batch_sizes):
            raise ValueError(f"hydro.energy: batch sizes must be ints >= 1, got {list(self.batch_sizes)}")
        check("hydro.energy: ", ("warmup_steps", self.warmup_steps, lambda v: is_count(v, 0), "an int >= 0"),
              ("window_steps", self.window_steps, is_count, "an int >= 1 (steps per profiled power limit)"),
              ("max_power_w", self.max_power_w, lambda v: v is None or v > 0, "None or > 0 (W)"))
        if self.devices not in {d.value for d in DeviceSource}:
            raise ValueError(f"hydro.energy: devices must be one of {[d.value for d in DeviceSource]}, "
                             f"got {self.devices!r}")
        object.__setattr__(self, "devices", DeviceSource(self.devices))

    def profile_key(self, members: int) -> str:
        """The store's model key of a fused trial of ``members`` members (the device is added by the trial)."""
        return f"{self.job}/F{members}"


def trial_observer(settings: EnergySettings, trial: FusedTrial, gpu_share: float = 1.0) -> EnergyObserver:
    """The energy observer of ``trial`` (not started), on the devices ``settings.devices`` names; a trial given
    ``gpu_share`` < 1 of a GPU (Ray's fractional GPUs) is charged that share of its cards' energy."""
    members, batch_size = len(trial.member_ids), trial.batch_size
    if settings.devices is DeviceSource.SIMULATED:
        clock = VirtualClock()
        gpu = simulated_trial_gpu(batch_size, members, clock)
        devices, stepped, now = [gpu], [gpu], clock.now
    else:
        devices, stepped, now = detect_devices(), [], time.monotonic
        if gpu_share < 1:
            devices = [CardShare(d, gpu_share) if isinstance(d, NVMLDevice) else d for d in devices]
        if not devices:
            raise EnergyError("hydro.energy: --energy found no device to measure on this host (no NVIDIA GPU "
                              "through NVML, no readable RAPL); use --energy-devices simulated on a CPU-only "
                              "machine, or make RAPL readable (see the warning above)")
    energy = TrialEnergy(devices, store=EnergyStore(settings.store_path), model=settings.profile_key(members),
                         batch_size=batch_size, eta=settings.eta, max_power_w=settings.max_power_w,
                         warmup_steps=settings.warmup_steps, window_steps=settings.window_steps,
                         poll_steps=trial.steps_per_epoch or 100, clock=now)  # iterable data: unknown
    return EnergyObserver(energy, stepped=stepped)
