"""Find the energy devices of this machine, with one clear message for what is missing."""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

from hydro.energy.device import EnergyDevice, EnergyError
from hydro.energy.nvml import nvml_devices
from hydro.energy.rapl import POWERCAP_ROOT, rapl_devices


class EnergyWarning(UserWarning):
    """Some energy measurement is unavailable on this machine."""


def detect_devices(
    env: Mapping[str, str] | None = None, powercap_root: str | os.PathLike[str] = POWERCAP_ROOT
) -> list[EnergyDevice]:
    """Visible NVIDIA GPUs (NVML) and readable RAPL CPU packages. Whatever is unavailable is named in
    a single :class:`EnergyWarning`; what is available is returned and still measured."""
    devices: list[EnergyDevice] = []
    missing = []
    for find in (lambda: nvml_devices(env), lambda: rapl_devices(powercap_root)):
        try:
            devices += find()
        except EnergyError as err:
            missing.append(str(err))
    if missing:
        warnings.warn("energy measurement limited: " + " | ".join(missing), EnergyWarning, stacklevel=2)
    return devices
