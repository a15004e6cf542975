"""The device abstraction every energy backend implements, and its typed errors."""
from __future__ import annotations

from abc import ABC, abstractmethod


class EnergyError(RuntimeError):
    """Base class of energy measurement/control errors."""


class LibraryNotFound(EnergyError):
    """The backend library (nvidia-ml-py / libnvidia-ml) or interface (RAPL sysfs) is missing."""


class PermissionDenied(EnergyError):
    """The call needs privileges this process lacks (e.g. setting power limits needs CAP_SYS_ADMIN)."""


class NotSupported(EnergyError):
    """The device does not support the call (e.g. a power limit on a CPU package)."""


class DeviceNotFound(EnergyError):
    """A requested device (CUDA_VISIBLE_DEVICES entry, RAPL zone) does not exist."""


class EnergyDevice(ABC):
    """One device whose energy can be measured and, maybe, whose power limit can be set.

    Units: power in W, energy in J. :meth:`energy_j` is a cumulative counter from an arbitrary origin;
    differences between two reads are the energy used in between.

    ``kind`` names the hardware (``nvml:<GPU model>``, ``simulated:<model>``; by default the class name): stored
    power-limit profiles are reused only on devices of the same kind. ``card_id`` identifies the physical card
    for every process of the host (the NVML UUID; None where no other process can control this device).
    ``share`` (0 < share <= 1) is the part of the card's energy this object counts (see
    :class:`hydro.energy.share.CardShare`).
    """

    name: str
    card_id: str | None = None
    share: float = 1.0

    @property
    def kind(self) -> str:
        """The hardware this device is, for keying stored profiles."""
        return type(self).__name__

    @abstractmethod
    def energy_j(self) -> float:
        """Cumulative energy (J) since an arbitrary origin."""

    def power_limit_range_w(self) -> tuple[float, float]:
        """(minimum, maximum) settable power limit in W."""
        raise NotSupported(f"{self.name} has no settable power limit.")

    def get_power_limit_w(self) -> float:
        """Current power limit in W."""
        raise NotSupported(f"{self.name} has no power limit.")

    def set_power_limit_w(self, watts: float) -> None:
        """Set the power limit (W)."""
        raise NotSupported(f"{self.name} has no settable power limit.")

    def close(self) -> None:
        """Release background resources (samplers); the default has none."""

    def synchronize(self) -> None:
        """Wait until the work queued on the device has finished, so a read covers it; the default has no queue."""

    def supported_frequencies_mhz(self) -> list[int]:
        """Settable graphics clocks (MHz), highest first."""
        raise NotSupported(f"{self.name} has no settable clock frequency.")

    def get_frequency_mhz(self) -> int:
        """Current graphics clock (MHz)."""
        raise NotSupported(f"{self.name} does not report a clock frequency.")

    def set_frequency_mhz(self, mhz: int) -> None:
        """Lock the graphics clock at ``mhz`` (one of :meth:`supported_frequencies_mhz`)."""
        raise NotSupported(f"{self.name} has no settable clock frequency.")

    def reset_frequency(self) -> None:
        """Hand the clock back to the driver's default (undoes :meth:`set_frequency_mhz`)."""
        raise NotSupported(f"{self.name} has no settable clock frequency.")

    def finish_instruction(self, host_s: float) -> float:
        """Complete an instruction whose host-side work took ``host_s`` seconds at the current clock; returns its
        duration (s). A real device already ran at its clock, so this is ``host_s``; a simulated DVFS device
        stretches the work to its clock."""
        return host_s
