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
    """

    name: str

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
