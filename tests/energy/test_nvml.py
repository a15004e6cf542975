"""NVML backend against a fake pynvml module: counters, sampling, CUDA_VISIBLE_DEVICES, typed errors."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pynvml as real
import pytest

from hydro.energy import DeviceNotFound, LibraryNotFound, NotSupported, PermissionDenied
from hydro.energy.monitor import EnergyMonitor
from hydro.energy.nvml import nvml_devices
from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml

VOLTA, PASCAL = real.NVML_DEVICE_ARCH_VOLTA, real.NVML_DEVICE_ARCH_PASCAL


def _install(monkeypatch, gpus, **kw):
    fake = make_fake_pynvml(gpus, **kw)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_volta_uses_energy_counter_and_power_limits(monkeypatch):
    gpu = FakeGPU("GPU-aaaa", VOLTA)
    _install(monkeypatch, [gpu])
    (dev,) = nvml_devices(env={})
    assert dev.name == "gpu0" and dev.energy_source == "counter"
    assert dev.power_limit_range_w() == (100.0, 250.0)
    monitor = EnergyMonitor([dev])
    monitor.begin_window("outer")
    gpu.energy_mj += 1500
    monitor.begin_window("inner")
    gpu.energy_mj += 2500
    inner = monitor.end_window("inner")
    outer = monitor.end_window("outer")
    assert inner.energy_j == {"gpu0": 2.5}
    assert outer.total_energy_j == pytest.approx(4.0)
    dev.set_power_limit_w(175)
    assert gpu.limit_mw == 175_000 and dev.get_power_limit_w() == 175.0
    with pytest.raises(ValueError, match="outside the supported range"):
        dev.set_power_limit_w(300)


def test_pre_volta_integrates_power_samples(monkeypatch):
    gpu = FakeGPU("GPU-pppp", PASCAL, power_mw=150_000)
    _install(monkeypatch, [gpu])
    (dev,) = nvml_devices(env={}, sample_interval_s=0.005)
    try:
        assert dev.energy_source == "sampled"
        start = dev.energy_j()
        t0 = time.monotonic()
        time.sleep(0.2)
        energy = dev.energy_j() - start
        assert energy == pytest.approx(150.0 * (time.monotonic() - t0), rel=0.1)
    finally:
        dev.close()


def test_cuda_visible_devices_by_index_and_uuid(monkeypatch):
    gpus = [FakeGPU(f"GPU-{c * 4}-uuid", VOLTA) for c in "abcd"]
    _install(monkeypatch, gpus)
    devs = nvml_devices(env={"CUDA_VISIBLE_DEVICES": "2,GPU-aaaa,dddd"})
    assert [d.name for d in devs] == ["gpu0", "gpu1", "gpu2"]
    assert [d._handle.uuid for d in devs] == ["GPU-cccc-uuid", "GPU-aaaa-uuid", "GPU-dddd-uuid"]
    assert nvml_devices(env={"CUDA_VISIBLE_DEVICES": ""}) == []
    assert len(nvml_devices(env={})) == 4
    with pytest.raises(DeviceNotFound, match="only 4 GPUs"):
        nvml_devices(env={"CUDA_VISIBLE_DEVICES": "7"})
    with pytest.raises(DeviceNotFound, match="matches 0 GPUs"):
        nvml_devices(env={"CUDA_VISIBLE_DEVICES": "GPU-zzzz"})


def test_cuda_order_mig_instances_and_torch_uuids_map_to_cards(monkeypatch):
    """CUDA numbers different GPU models fastest first, which NVML's PCI order does not show: indices are refused
    there unless CUDA_DEVICE_ORDER=PCI_BUS_ID (UUIDs always work); a MIG instance is measured as its card; the
    UUIDs torch reports (no prefix) select the cards in torch's order."""
    import hydro.energy.nvml as nvml

    gpus = [FakeGPU("GPU-aaaa-uuid", VOLTA, name="NVIDIA A10"), FakeGPU("GPU-bbbb-uuid", VOLTA, name="NVIDIA H100",
                                                                       migs=("MIG-m1", "MIG-m2"))]
    _install(monkeypatch, gpus)
    with pytest.raises(DeviceNotFound, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        nvml_devices(env={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(DeviceNotFound, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        nvml_devices(env={})
    pci = nvml_devices(env={"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d._handle.uuid for d in pci] == ["GPU-bbbb-uuid", "GPU-aaaa-uuid"]
    by_uuid = nvml_devices(env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb,aaaa"})
    assert [d._handle.uuid for d in by_uuid] == ["GPU-bbbb-uuid", "GPU-aaaa-uuid"]
    (mig,) = nvml_devices(env={"CUDA_VISIBLE_DEVICES": "MIG-m2"})
    assert mig._handle is gpus[1] and mig.name == "gpu0"
    monkeypatch.setattr(nvml, "_torch_cuda_uuids", lambda: ["BBBB-uuid", "aaaa-uuid"])  # torch's spelling
    assert [d._handle.uuid for d in nvml_devices()] == ["GPU-bbbb-uuid", "GPU-aaaa-uuid"]
    monkeypatch.setattr(nvml, "_torch_cuda_uuids", lambda: ["MIG-m1"])
    assert [d._handle for d in nvml_devices()] == [gpus[1]]
    same = [FakeGPU(f"GPU-{c * 4}-uuid", VOLTA) for c in "xy"]  # one model: CUDA's order is the PCI order
    _install(monkeypatch, same)
    assert [d._handle.uuid for d in nvml_devices(env={"CUDA_VISIBLE_DEVICES": "1"})] == ["GPU-yyyy-uuid"]


def test_missing_permission_is_typed(monkeypatch):
    _install(monkeypatch, [FakeGPU("GPU-aaaa", VOLTA)], can_set=False)
    (dev,) = nvml_devices(env={})
    with pytest.raises(PermissionDenied, match="CAP_SYS_ADMIN"):
        dev.set_power_limit_w(200)


def test_missing_library_and_driver_are_typed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with pytest.raises(LibraryNotFound, match="nvidia-ml-py"):
        nvml_devices(env={})
    _install(monkeypatch, [], init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(LibraryNotFound, match="driver"):
        nvml_devices(env={})


def test_unsupported_call_is_typed(monkeypatch):
    fake = _install(monkeypatch, [FakeGPU("GPU-aaaa", VOLTA)])

    def unsupported(_):
        raise fake.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceGetPowerManagementLimitConstraints = unsupported
    (dev,) = nvml_devices(env={})
    with pytest.raises(NotSupported, match="not supported"):
        dev.power_limit_range_w()


def _has_nvidia_driver() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/proc/driver/nvidia/version"))


def test_real_nvml_on_this_machine_reports_a_typed_error_or_devices():
    """The real pynvml: without an NVIDIA driver, one typed error naming the cause (not a raw NVMLError);
    with one, every visible GPU as a device whose energy counter and power limits read."""
    if not _has_nvidia_driver():
        with pytest.raises(LibraryNotFound, match="NVML library or NVIDIA driver not found.*is this a GPU machine"):
            nvml_devices()
        return
    devices = nvml_devices(env={})
    try:
        assert devices, "an NVIDIA driver is loaded but NVML lists no GPU"
        assert [d.name for d in devices] == [f"gpu{i}" for i in range(len(devices))]
        for d in devices:
            low, high = d.power_limit_range_w()
            assert d.energy_j() >= 0 and 0 < low <= d.get_power_limit_w() <= high
    finally:
        for d in devices:
            d.close()


def test_the_e2e_benchmarks_gpu_usage_reads_utilisation_and_energy(monkeypatch):
    """``benchmarks/e2e_tuning.py``'s GPU columns: every GPU's utilisation sampled over the block and their
    energy over it (a pre-Volta GPU's integrated from power samples); ``None`` where NVML finds no driver."""
    from benchmarks.e2e_tuning import GpuUsage

    volta, pascal = FakeGPU("GPU-aaaa", VOLTA), FakeGPU("GPU-bbbb", PASCAL, power_mw=100_000)
    volta.util_pct, pascal.util_pct = 80, 40
    _install(monkeypatch, [volta, pascal])
    started = time.monotonic()
    with GpuUsage(interval_s=0.01) as usage:
        volta.energy_mj += 2500
        time.sleep(0.2)
    elapsed = time.monotonic() - started
    assert usage.util_pct == pytest.approx(60)
    assert 2.5 + 100 * 0.2 <= usage.energy_j <= 2.5 + 100 * elapsed  # 2.5 J counted, the block at 100 W sampled
    _install(monkeypatch, [volta], init_error=real.NVML_ERROR_LIBRARY_NOT_FOUND)
    with GpuUsage() as usage:
        pass
    assert usage.util_pct is None and usage.energy_j is None
