"""A fake ``pynvml`` module (as Zeus's tests mock NVML): GPUs with power limits, counters, errors."""
from __future__ import annotations

import types

import pynvml as real


class FakeMIG:
    def __init__(self, uuid: str):
        self.uuid = uuid


class FakeGPU:
    def __init__(self, uuid: str, arch: int, *, min_mw=100_000, max_mw=250_000, power_mw=200_000, deny_set=False,
                 name: str = "NVIDIA H100 80GB HBM3", migs: tuple[str, ...] = ()):
        self.uuid, self.arch, self.name = uuid, arch, name
        self.migs = [FakeMIG(uuid) for uuid in migs]  # MIG instances (MIG mode on when there are any)
        self.deny_set = deny_set  # this GPU alone refuses power-limit changes (NO_PERMISSION)
        self.min_mw, self.max_mw = min_mw, max_mw
        self.limit_mw = max_mw
        self.power_mw = power_mw
        self.energy_mj = 1_000_000
        self.util_pct = 0
        self.set_history: list[int] = []


def make_fake_pynvml(gpus: list[FakeGPU], *, can_set: bool = True, init_error: int | None = None) -> types.ModuleType:
    """A module with pynvml's names used by hydro.energy.nvml; handles are the FakeGPU objects."""
    m = types.ModuleType("pynvml")
    for name in dir(real):
        if name.startswith(("NVML_ERROR_", "NVML_DEVICE_ARCH_")):
            setattr(m, name, getattr(real, name))

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"fake NVML error {value}")
            self.value = value

    m.NVMLError = NVMLError

    def nvmlInit():
        if init_error is not None:
            raise NVMLError(init_error)

    def set_limit(gpu, mw):
        if not can_set or gpu.deny_set:
            raise NVMLError(real.NVML_ERROR_NO_PERMISSION)
        gpu.limit_mw = mw
        gpu.set_history.append(mw)

    def energy(gpu):
        if gpu.arch < real.NVML_DEVICE_ARCH_VOLTA:
            raise NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_mj

    def by_index(i):
        if not 0 <= i < len(gpus):
            raise NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpus[i]

    m.nvmlInit = nvmlInit
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = by_index
    def mig_by_index(gpu, i):
        if i >= len(gpu.migs):
            raise NVMLError(real.NVML_ERROR_NOT_FOUND)
        return gpu.migs[i]

    m.nvmlDeviceGetUUID = lambda g: g.uuid
    m.nvmlDeviceGetName = lambda g: g.name
    m.nvmlDeviceGetMigMode = lambda g: (int(bool(g.migs)), int(bool(g.migs)))
    m.nvmlDeviceGetMaxMigDeviceCount = lambda g: 7
    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_by_index
    m.nvmlDeviceGetArchitecture = lambda g: g.arch
    m.nvmlDeviceGetTotalEnergyConsumption = energy
    m.nvmlDeviceGetPowerUsage = lambda g: g.power_mw
    m.nvmlDeviceGetUtilizationRates = lambda g: types.SimpleNamespace(gpu=g.util_pct, memory=0)
    m.nvmlDeviceGetPowerManagementLimitConstraints = lambda g: (g.min_mw, g.max_mw)
    m.nvmlDeviceGetPowerManagementLimit = lambda g: g.limit_mw
    m.nvmlDeviceSetPowerManagementLimit = set_limit
    return m


def add_fake_clocks(m: types.ModuleType, gpus: list[FakeGPU], graphics_mhz: list[int], *, memory_mhz: int = 1215,
                    can_set: bool = True) -> None:
    """Give the fake module NVML's clock calls: every GPU supports ``graphics_mhz`` (at ``memory_mhz``); it runs
    at the highest by default; each GPU's ``clock_history`` records locks (MHz) and resets (``"reset"``)."""
    default = max(graphics_mhz)
    for gpu in gpus:
        gpu.clock_mhz, gpu.clock_history = default, []

    def locked(gpu, low, high):
        if not can_set:
            raise m.NVMLError(real.NVML_ERROR_NO_PERMISSION)
        if low != high or low not in graphics_mhz:
            raise m.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu.clock_mhz = low
        gpu.clock_history.append(low)

    def reset(gpu):
        if not can_set:
            raise m.NVMLError(real.NVML_ERROR_NO_PERMISSION)
        gpu.clock_mhz = default
        gpu.clock_history.append("reset")

    def graphics(gpu, memory):
        if memory != memory_mhz:
            raise m.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return list(graphics_mhz)

    m.NVML_CLOCK_GRAPHICS = real.NVML_CLOCK_GRAPHICS
    m.nvmlDeviceGetSupportedMemoryClocks = lambda g: [memory_mhz, memory_mhz // 3]
    m.nvmlDeviceGetSupportedGraphicsClocks = graphics
    m.nvmlDeviceGetClockInfo = lambda g, kind: g.clock_mhz
    m.nvmlDeviceSetGpuLockedClocks = locked
    m.nvmlDeviceResetGpuLockedClocks = reset
