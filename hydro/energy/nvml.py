"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Energy: the hardware counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ) on Volta and newer;
before Volta, a background thread integrates ``nvmlDeviceGetPowerUsage`` samples (mW) with the
trapezoid rule. Devices follow ``CUDA_VISIBLE_DEVICES`` in CUDA's order (indices, GPU UUIDs / UUID prefixes, MIG
instance UUIDs), matched by UUID.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from hydro.energy.device import DeviceNotFound, EnergyDevice, EnergyError, LibraryNotFound, NotSupported, PermissionDenied

_PERMISSION_HINT = (
    "setting GPU power limits needs root or CAP_SYS_ADMIN (e.g. run the trial in a container started with "
    "--cap-add SYS_ADMIN), or turn power-limit tuning off"
)

_CLOCK_HINT = (
    "locking GPU clocks needs root or CAP_SYS_ADMIN; Hydro sets clocks only on mocked or simulated devices in its "
    "tests, so run frequency plans on a GPU machine you administer"
)


def load_pynvml() -> ModuleType:
    """Import ``pynvml`` and initialise NVML; typed errors if the package or the driver is missing."""
    try:
        pynvml = importlib.import_module("pynvml")
    except ImportError as err:
        raise LibraryNotFound("pynvml is not importable: install nvidia-ml-py (pip install nvidia-ml-py).") from err
    with nvml_errors(pynvml, "nvmlInit"):
        pynvml.nvmlInit()
    return pynvml


def _typed(pynvml: ModuleType, err: Exception, what: str) -> EnergyError:
    code = getattr(err, "value", None)
    if code in (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED):
        return LibraryNotFound(f"{what}: NVML library or NVIDIA driver not found ({err}); is this a GPU machine?")
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return PermissionDenied(f"{what}: permission denied ({err}); {_PERMISSION_HINT}.")
    if code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND):
        return NotSupported(f"{what}: not supported by this GPU or driver ({err}).")
    if code in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
        return DeviceNotFound(f"{what}: no such GPU ({err}); check CUDA_VISIBLE_DEVICES.")
    return EnergyError(f"{what}: NVML error {err}.")


@contextmanager
def nvml_errors(pynvml: ModuleType, what: str) -> Iterator[None]:
    """Translate ``pynvml.NVMLError`` raised inside into the typed :class:`EnergyError` subclasses."""
    try:
        yield
    except pynvml.NVMLError as err:
        raise _typed(pynvml, err, what) from err


class _PowerIntegrator:
    """Background thread integrating power samples (W) over time into energy (J)."""

    def __init__(self, read_power_w, interval_s: float) -> None:
        self._read = read_power_w
        self._interval = interval_s
        self._lock = threading.Lock()
        self._last_t = time.monotonic()
        self._last_p = read_power_w()
        self._energy = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-power-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> float:
        now, power = time.monotonic(), self._read()
        with self._lock:
            self._energy += 0.5 * (power + self._last_p) * (now - self._last_t)
            self._last_t, self._last_p = now, power
            return self._energy

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def energy_j(self) -> float:
        return self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class NVMLDevice(EnergyDevice):
    """One GPU. ``index`` is its NVML index; ``name`` is ``gpu<i>`` with i the CUDA-visible index."""

    def __init__(self, pynvml: ModuleType, handle: Any, name: str, *, sample_interval_s: float = 0.1,
                 cuda_index: int | None = None) -> None:
        self._nvml = pynvml
        self._handle = handle
        self.name = name
        self.cuda_index = cuda_index
        with nvml_errors(pynvml, f"{name}: nvmlDeviceGetArchitecture"):
            arch = pynvml.nvmlDeviceGetArchitecture(handle)
        with nvml_errors(pynvml, f"{name}: nvmlDeviceGetName"):
            self.model = _text(pynvml.nvmlDeviceGetName(handle))
        with nvml_errors(pynvml, f"{name}: nvmlDeviceGetUUID"):
            self.card_id = _text(pynvml.nvmlDeviceGetUUID(handle))
        self._integrator: _PowerIntegrator | None = None
        if arch < pynvml.NVML_DEVICE_ARCH_VOLTA:
            self._integrator = _PowerIntegrator(self._power_w, sample_interval_s)

    @property
    def kind(self) -> str:
        """``nvml:<model name>``, e.g. ``nvml:NVIDIA H100 80GB HBM3``."""
        return f"nvml:{self.model}"

    @property
    def energy_source(self) -> str:
        """``counter`` (hardware energy counter) or ``sampled`` (integrated power samples)."""
        return "sampled" if self._integrator else "counter"

    def _power_w(self) -> float:
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceGetPowerUsage"):
            return self._nvml.nvmlDeviceGetPowerUsage(self._handle) / 1000.0

    def energy_j(self) -> float:
        if self._integrator:
            return self._integrator.energy_j()
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceGetTotalEnergyConsumption"):
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0

    def utilization_pct(self) -> float:
        """Share of the last sample period (1/6 s to 1 s, by GPU) in which a kernel ran, in % (read only)."""
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceGetUtilizationRates"):
            return float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def power_limit_range_w(self) -> tuple[float, float]:
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceGetPowerManagementLimitConstraints"):
            low, high = self._nvml.nvmlDeviceGetPowerManagementLimitConstraints(self._handle)
        return low / 1000.0, high / 1000.0

    def get_power_limit_w(self) -> float:
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceGetPowerManagementLimit"):
            return self._nvml.nvmlDeviceGetPowerManagementLimit(self._handle) / 1000.0

    def set_power_limit_w(self, watts: float) -> None:
        low, high = self.power_limit_range_w()
        if not low <= watts <= high:
            raise ValueError(f"{self.name}: power limit {watts} W outside the supported range [{low}, {high}] W.")
        with nvml_errors(self._nvml, f"{self.name}: nvmlDeviceSetPowerManagementLimit"):
            self._nvml.nvmlDeviceSetPowerManagementLimit(self._handle, int(round(watts * 1000)))

    def close(self) -> None:
        if self._integrator:
            self._integrator.stop()
            self._integrator = None

    def synchronize(self) -> None:
        """``torch.cuda.synchronize`` this GPU if this process has initialised CUDA (else nothing is queued)."""
        torch = sys.modules.get("torch")
        if torch is not None and self.cuda_index is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize(self.cuda_index)

    def _clock_call(self, what: str, call, *args):
        """One NVML clock call with typed errors (a permission error names the clock privilege)."""
        try:
            with nvml_errors(self._nvml, f"{self.name}: {what}"):
                return call(self._handle, *args)
        except PermissionDenied as err:
            raise PermissionDenied(f"{self.name}: {what}: permission denied; {_CLOCK_HINT}.") from err

    def supported_frequencies_mhz(self) -> list[int]:
        memory = max(self._clock_call("nvmlDeviceGetSupportedMemoryClocks",
                                      self._nvml.nvmlDeviceGetSupportedMemoryClocks))
        graphics = self._clock_call("nvmlDeviceGetSupportedGraphicsClocks",
                                    self._nvml.nvmlDeviceGetSupportedGraphicsClocks, memory)
        return sorted({int(f) for f in graphics}, reverse=True)

    def get_frequency_mhz(self) -> int:
        return int(self._clock_call("nvmlDeviceGetClockInfo", self._nvml.nvmlDeviceGetClockInfo,
                                    self._nvml.NVML_CLOCK_GRAPHICS))

    def set_frequency_mhz(self, mhz: int) -> None:
        supported = self.supported_frequencies_mhz()
        if mhz not in supported:
            raise ValueError(f"{self.name}: {mhz} MHz is not a supported graphics clock ({supported[-1]}.."
                             f"{supported[0]} MHz, {len(supported)} steps); plan with the profiled frequencies.")
        self._clock_call("nvmlDeviceSetGpuLockedClocks", self._nvml.nvmlDeviceSetGpuLockedClocks, mhz, mhz)

    def reset_frequency(self) -> None:
        self._clock_call("nvmlDeviceResetGpuLockedClocks", self._nvml.nvmlDeviceResetGpuLockedClocks)


def _text(value: str | bytes) -> str:
    """An NVML string (older nvidia-ml-py versions return bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _bare(uuid: str | bytes) -> str:
    """A UUID without its ``GPU-``/``MIG-`` prefix, lower case (NVML, CUDA and torch spell them differently)."""
    uuid = _text(uuid)
    for prefix in ("GPU-", "MIG-"):
        uuid = uuid.removeprefix(prefix)
    return uuid.lower()


def _mig_parents(pynvml: ModuleType, handles: list[Any]) -> dict[str, Any]:
    """Bare MIG instance UUID -> the handle of the card holding it (energy is counted per card)."""
    parents = {}
    for handle in handles:
        try:
            if not pynvml.nvmlDeviceGetMigMode(handle)[0]:
                continue
            for i in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                try:
                    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                except pynvml.NVMLError:
                    continue  # an empty slot
                parents[_bare(pynvml.nvmlDeviceGetUUID(mig))] = handle
        except (pynvml.NVMLError, AttributeError):
            continue  # no MIG on this card (or this NVML)
    return parents


def _cuda_order(pynvml: ModuleType, handles: list[Any], env: Mapping[str, str]) -> list[Any]:
    """The cards in CUDA's enumeration order: NVML's (PCI bus) order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or
    when all cards are the same model (CUDA's default, fastest first, then breaks ties by PCI bus)."""
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID" or len(handles) < 2:
        return handles
    with nvml_errors(pynvml, "nvmlDeviceGetName"):
        names = {str(pynvml.nvmlDeviceGetName(h)) for h in handles}
    if len(names) == 1:
        return handles
    raise DeviceNotFound(f"CUDA numbers this node's GPUs of different models ({sorted(names)}) fastest first, which "
                         f"NVML cannot tell; set CUDA_DEVICE_ORDER=PCI_BUS_ID or name the GPUs by UUID in "
                         f"CUDA_VISIBLE_DEVICES")


def _visible_handles(pynvml: ModuleType, env: Mapping[str, str], cuda_uuids: list[str] | None = None) -> list[Any]:
    """The NVML handles of the CUDA devices of this process, in CUDA order: ``cuda_uuids`` (the CUDA devices'
    UUIDs, e.g. from torch) matched by UUID, else ``CUDA_VISIBLE_DEVICES`` of ``env`` (CUDA indices, GPU UUIDs or
    unique prefixes, ``MIG-`` instance UUIDs: a MIG instance is measured as its card)."""
    with nvml_errors(pynvml, "nvmlDeviceGetCount"):
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    with nvml_errors(pynvml, "nvmlDeviceGetUUID"):
        uuids = [_bare(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if cuda_uuids is None and spec is None:
        return _cuda_order(pynvml, handles, env)
    entries = [e.strip() for e in (spec or "").split(",") if e.strip()] if cuda_uuids is None else list(cuda_uuids)
    if entries in ([], ["-1"]):
        return []
    migs = _mig_parents(pynvml, handles) if any(e.startswith("MIG-") for e in entries) or cuda_uuids else {}
    ordered = None
    chosen = []
    for entry in entries:
        if entry.isdigit():
            ordered = ordered or _cuda_order(pynvml, handles, env)
            if int(entry) >= count:
                raise DeviceNotFound(f"CUDA_VISIBLE_DEVICES entry {entry!r}: only {count} GPUs (0..{count - 1}).")
            chosen.append(ordered[int(entry)])
            continue
        bare = _bare(entry)
        if bare in migs:
            chosen.append(migs[bare])
            continue
        matches = [h for h, u in zip(handles, uuids) if u.startswith(bare)]
        if len(matches) != 1:
            raise DeviceNotFound(
                f"CUDA_VISIBLE_DEVICES entry {entry!r} matches {len(matches)} GPUs; use an index or a unique UUID "
                f"prefix (GPUs: {uuids}; MIG instances: {sorted(migs)})."
            )
        chosen.append(matches[0])
    return chosen


def _torch_cuda_uuids() -> list[str] | None:
    """The UUIDs of this process's CUDA devices in CUDA order, when torch has initialised CUDA (asking torch
    earlier would initialise CUDA here, e.g. before a fork)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def nvml_devices(env: Mapping[str, str] | None = None, *, sample_interval_s: float = 0.1) -> list[NVMLDevice]:
    """The GPUs visible to this process (``CUDA_VISIBLE_DEVICES`` in ``env``, default ``os.environ``; with the
    default, once torch has initialised CUDA, torch's devices matched by UUID), named ``gpu0, gpu1, ...`` in CUDA
    order. Two MIG instances of one card are that card twice (NVML counts energy per card).

    Raises:
        DeviceNotFound: an entry of ``CUDA_VISIBLE_DEVICES`` names no GPU, or CUDA's order of different GPU models
            cannot be told (set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
    """
    pynvml = load_pynvml()
    handles = _visible_handles(pynvml, os.environ if env is None else env, _torch_cuda_uuids() if env is None else None)
    return [NVMLDevice(pynvml, h, f"gpu{i}", sample_interval_s=sample_interval_s, cuda_index=i)
            for i, h in enumerate(handles)]
