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
from hydro.energy.monitor import EnergyMonitor, Measurement
from hydro.energy.simulated import SimulatedDevice, VirtualClock

__all__ = [
    "DeviceNotFound",
    "EnergyDevice",
    "EnergyError",
    "EnergyMonitor",
    "LibraryNotFound",
    "Measurement",
    "NotSupported",
    "PermissionDenied",
    "SimulatedDevice",
    "VirtualClock",
]
