"""CPU package energy through Linux RAPL (``/sys/class/powercap/intel-rapl:N``).

Each top-level zone is one device (sub-zones such as ``core`` or ``dram`` are inside the package and
would double count). ``energy_uj`` wraps around at ``max_energy_range_uj``; a wrap is detected when a
read is smaller than the previous one, so reads must be closer together than one wrap period (minutes
to hours depending on the CPU). RAPL power limits are not set by Hydro.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from hydro.energy.device import DeviceNotFound, EnergyDevice, LibraryNotFound, PermissionDenied

POWERCAP_ROOT = Path("/sys/class/powercap")
_ZONE = re.compile(r"^intel-rapl:\d+$")


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except PermissionError as err:
        raise PermissionDenied(
            f"cannot read {path}: RAPL energy is root-only on most kernels; run as root or "
            f"`sudo chmod o+r {path}`."
        ) from err
    except FileNotFoundError as err:
        raise DeviceNotFound(f"{path} does not exist; is this RAPL zone gone?") from err


class RaplDevice(EnergyDevice):
    """One RAPL zone (a CPU package); energy only."""

    def __init__(self, zone: str | os.PathLike[str]) -> None:
        self._zone = Path(zone)
        self.name = f"rapl:{self._zone.name.split(':', 1)[1]}:{(self._zone / 'name').read_text().strip()}"
        self._max_uj = _read_int(self._zone / "max_energy_range_uj")
        self._last_uj = _read_int(self._zone / "energy_uj")
        self._wraps = 0

    def energy_j(self) -> float:
        raw = _read_int(self._zone / "energy_uj")
        if raw < self._last_uj:
            self._wraps += 1
        self._last_uj = raw
        return (self._wraps * self._max_uj + raw) / 1e6


def rapl_devices(root: str | os.PathLike[str] = POWERCAP_ROOT) -> list[RaplDevice]:
    """All readable top-level RAPL zones under ``root``; typed errors if RAPL is absent or unreadable."""
    base = Path(root)
    zones = sorted(p for p in base.glob("intel-rapl:*") if _ZONE.match(p.name)) if base.is_dir() else []
    if not zones:
        raise LibraryNotFound(f"no RAPL zones under {base}: not an Intel/AMD Linux host with powercap, or a VM.")
    return [RaplDevice(z) for z in zones]
