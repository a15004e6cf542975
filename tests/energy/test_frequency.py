"""Frequency control: NVML clock calls (mocked), the simulated DVFS device, the profiler's downward scan,
and a pipeline stage running a frequency plan; the default clock comes back on every exit path."""
from __future__ import annotations

import socket
import sys

import pynvml as real
import pytest
import torch

from hydro.pipeline.stage import PipelineSpec, PipelineStage
from hydro.pipeline.hooks import BubbleRecorder
from hydro.energy import NotSupported, PermissionDenied, SimulatedDevice, VirtualClock
from hydro.energy.frequency import DVFSModel, SimulatedDVFSDevice, restoring_default_clock
from hydro.energy.nvml import nvml_devices
from hydro.pipeline.profiler import blocking_power_w, profile_pipeline, reference_instructions, scan_instruction
from schedulers.pipeline_energy import DownwardScan, Instruction
from tests.energy.fake_nvml import FakeGPU, add_fake_clocks, make_fake_pynvml

CLOCKS = list(range(1740, 645, -15))


def _fake_gpu(monkeypatch, *, can_set=True):
    gpu = FakeGPU("GPU-aaaa", real.NVML_DEVICE_ARCH_AMPERE)
    fake = make_fake_pynvml([gpu])
    add_fake_clocks(fake, [gpu], CLOCKS, can_set=can_set)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (device,) = nvml_devices(env={})
    return gpu, device


def test_nvml_clock_calls_and_typed_errors(monkeypatch):
    gpu, device = _fake_gpu(monkeypatch)
    assert device.supported_frequencies_mhz() == CLOCKS
    device.set_frequency_mhz(1200)
    assert gpu.clock_mhz == 1200 == device.get_frequency_mhz()
    with pytest.raises(ValueError, match="not a supported graphics clock"):
        device.set_frequency_mhz(1201)
    device.reset_frequency()
    assert gpu.clock_mhz == 1740 and gpu.clock_history == [1200, "reset"]
    _, locked_out = _fake_gpu(monkeypatch, can_set=False)
    with pytest.raises(PermissionDenied, match="CAP_SYS_ADMIN"):
        locked_out.set_frequency_mhz(1200)


def test_devices_without_clocks_say_so():
    device = SimulatedDevice("sim0", {200: None}, VirtualClock())
    with pytest.raises(NotSupported, match="no settable clock"):
        device.set_frequency_mhz(1000)


@pytest.mark.parametrize("backend", ["nvml", "simulated"])
def test_default_clock_restored_when_the_body_fails(monkeypatch, backend):
    if backend == "nvml":
        gpu, device = _fake_gpu(monkeypatch)
        history = gpu.clock_history
    else:
        device = SimulatedDVFSDevice("sim0", DVFSModel(tuple(CLOCKS)), VirtualClock())
        history = device.clock_history
    with pytest.raises(RuntimeError, match="boom"), restoring_default_clock(device):
        device.set_frequency_mhz(900)
        raise RuntimeError("boom")
    assert history == [900, "reset"] and device.get_frequency_mhz() == 1740


def test_dvfs_model_follows_perseus_profile_shape():
    model = DVFSModel(tuple(CLOCKS))
    times = [model.time_s(0.245, f) for f in CLOCKS]
    energies = [t * model.power_w(f) for t, f in zip(times, CLOCKS)]
    assert all(b > a for a, b in zip(times, times[1:]))  # slower as the clock drops
    lowest = energies.index(min(energies))
    assert 0 < lowest < len(CLOCKS) - 1  # energy falls, then rises again
    assert all(b < a for a, b in zip(energies[:lowest], energies[1:lowest + 1]))
    assert all(b > a for a, b in zip(energies[lowest:], energies[lowest + 1:]))


def test_simulated_device_counts_busy_and_blocking_energy():
    clock = VirtualClock()
    model = DVFSModel(tuple(CLOCKS))
    device = SimulatedDVFSDevice("sim0", model, clock)
    device.set_frequency_mhz(900)
    took = device.finish_instruction(0.1)
    assert took == pytest.approx(model.time_s(0.1, 900)) and clock.now() == pytest.approx(took)
    assert blocking_power_w(device, lambda: (clock.advance(2.0), 2.0)[1]) == pytest.approx(model.blocking_w)
    assert device.energy_j() == pytest.approx(took * model.power_w(900) + 2.0 * model.blocking_w)


def test_scan_stops_after_five_energy_rises_and_resets_the_clock():
    device = SimulatedDVFSDevice("sim0", DVFSModel(tuple(CLOCKS)), VirtualClock())
    host = VirtualClock()  # an instruction whose host side takes exactly 10 ms
    rows = scan_instruction(device, lambda: host.advance(0.01), repeats=1, warmup=0, host_clock=host.now)
    energies = [e for _, _, e in rows]
    lowest = energies.index(min(energies))
    assert len(rows) == lowest + 6 < len(CLOCKS)  # five rises past the minimum, then stop
    assert DownwardScan().should_stop(energies) and not DownwardScan().should_stop(energies[:-1])
    assert device.clock_history[-1] == "reset" and device.get_frequency_mhz() == 1740


def test_profile_of_the_reference_pipeline_has_perseus_rows(tmp_path):
    spec = PipelineSpec(width=64, depth=4, microbatch_size=16)
    clock = VirtualClock()
    devices = [SimulatedDVFSDevice(f"sim{s}", DVFSModel(tuple(CLOCKS)), clock) for s in range(2)]
    runs = [reference_instructions(spec, s, 2) for s in range(2)]
    profile = profile_pipeline(runs, devices, p2p_power_w=75.0, repeats=3)
    assert profile.num_stages == 2
    for stage in range(2):
        for kind in Instruction:
            rows = profile.options(stage, kind)  # host times are real CPU times (noisy): check the structure
            assert [r.frequency_mhz for r in rows] == CLOCKS[:len(rows)] and len(rows) >= 6
            assert all(r.time_s > 0 and r.energy_j > 0 for r in rows)
    path = tmp_path / "profile.csv"
    profile.write_csv(path)
    assert path.read_text().splitlines()[0] == "stage,instruction,frequency,time,energy"
    assert all(d.get_frequency_mhz() == 1740 for d in devices)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_stage():
    """A one-stage pipeline (the whole schedule, no P2P) in this process."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        spec = PipelineSpec(width=32, depth=2, microbatches=3, microbatch_size=8)
        yield spec, PipelineStage(spec, 0, 1, BubbleRecorder())
    finally:
        torch.distributed.destroy_process_group()


def test_stage_applies_the_plan_per_instruction_and_restores_the_clock(single_stage):
    spec, stage = single_stage
    device = SimulatedDVFSDevice("sim0", DVFSModel(tuple(CLOCKS)))
    plan = [1740, 900, 1500, 705, 1200, 660]  # F0 B0 F1 B1 F2 B2
    original = stage.model
    losses = stage.run_frequency_plan(2, plan, device)
    assert len(losses) == 2 and stage.model is original
    assert device.clock_history == plan * 2 + ["reset"]
    assert device.get_frequency_mhz() == 1740
    # The same weights as the plain schedule: frequencies change speed, not results.
    reference = PipelineStage(spec, 0, 1, BubbleRecorder())
    assert [reference.run_iteration() for _ in range(2)] == pytest.approx(losses, rel=1e-6)


def test_stage_restores_the_clock_when_an_instruction_fails(single_stage, monkeypatch):
    _, stage = single_stage
    gpu, device = _fake_gpu(monkeypatch)
    with pytest.raises(ValueError, match="not a supported graphics clock"):
        stage.run_frequency_plan(1, [1740, 900, 1500, 1, 1200, 660], device)  # fails at B1
    assert gpu.clock_history == [1740, 900, 1500, "reset"] and gpu.clock_mhz == 1740
    with pytest.raises(ValueError, match="one per instruction"):
        stage.run_frequency_plan(1, [1740], device)
