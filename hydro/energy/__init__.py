"""Energy measurement and control inside a trial: devices (NVML, RAPL, simulated), measurement
windows, and the JIT power-limit driver. Decisions live in :mod:`schedulers.energy`."""
from __future__ import annotations

from hydro.energy.device import (
    DeviceNotFound,
    EnergyDevice,
    EnergyError,
    LibraryNotFound,
    NotSupported,
    PermissionDenied,
)
from hydro.energy.card_lock import CardBusy
from hydro.energy.monitor import EnergyMonitor, Measurement
from hydro.energy.detect import EnergyWarning, detect_devices
from hydro.energy.power_limit import PowerLimitProfiler, PowerLimitWarning
from hydro.energy.simulated import SimulatedDevice, VirtualClock
from hydro.energy.trial import TrialEnergy

__all__ = [
    "CardBusy",
    "DeviceNotFound",
    "EnergyDevice",
    "EnergyError",
    "EnergyMonitor",
    "EnergyWarning",
    "LibraryNotFound",
    "Measurement",
    "NotSupported",
    "PermissionDenied",
    "PowerLimitProfiler",
    "PowerLimitWarning",
    "SimulatedDevice",
    "TrialEnergy",
    "VirtualClock",
    "detect_devices",
]
