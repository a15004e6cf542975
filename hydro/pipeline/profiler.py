"""Perseus profiles of a pipeline: each stage's forward and backward at every clock, and the power a stage
draws while it blocks on P2P communication, all read through the device layer (:class:`EnergyDevice`).

For each instruction the profiler scans the device's clocks from high to low (set, warm up, run
``repeats`` times; time from :meth:`EnergyDevice.finish_instruction`, energy from the counter) and stops
by Perseus's rule (energy rose ``patience`` times in a row). The clock is reset to the default however
profiling ends. ``reference_instructions`` gives the forward and backward of a stage of the reference
pipeline (:class:`~hydro.pipeline.stage.PipelineSpec`) as callables on real tensors.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from hydro.pipeline.stage import PipelineSpec
from hydro.energy.device import EnergyDevice
from hydro.energy.frequency import DVFSModel, SimulatedDVFSDevice, restoring_default_clock
from hydro.energy.simulated import VirtualClock
from schedulers.pipeline_energy.profile import Instruction, PipelineProfile, ProfileRow
from schedulers.pipeline_energy.scan import DownwardScan

logger = logging.getLogger(__name__)

InstructionRun = Callable[[], None]  # queues one instruction (the device is synchronised after it)


def measure_instruction(device: EnergyDevice, run: InstructionRun, repeats: int,
                        host_clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median duration (s) and energy (J) of ``repeats`` runs of ``run`` at the device's current clock;
    ``host_clock`` times the host side of each run."""
    times, energies = [], []
    for _ in range(repeats):
        energy, start = device.energy_j(), host_clock()
        run()
        device.synchronize()
        times.append(device.finish_instruction(host_clock() - start))
        energies.append(device.energy_j() - energy)
    return statistics.median(times), statistics.median(energies)


def scan_instruction(device: EnergyDevice, run: InstructionRun, *, repeats: int = 3, warmup: int = 1,
                     scan: DownwardScan = DownwardScan(),
                     host_clock: Callable[[], float] = time.perf_counter) -> list[tuple[int, float, float]]:
    """(MHz, s, J) of one instruction from the highest clock down until ``scan`` stops; clock reset after."""
    if repeats < 1:
        raise ValueError(f"energy.pipeline_profiler: repeats must be >= 1, got {repeats}.")
    rows: list[tuple[int, float, float]] = []
    with restoring_default_clock(device):
        for mhz in device.supported_frequencies_mhz():
            device.set_frequency_mhz(mhz)
            for _ in range(warmup):
                run()
            rows.append((mhz, *measure_instruction(device, run, repeats, host_clock)))
            if scan.should_stop([energy for _, _, energy in rows]):
                logger.info("%s: energy rose %d times in a row at %d MHz; scan stopped", device.name,
                            scan.patience, mhz)
                break
    return rows


def blocking_power_w(device: EnergyDevice, wait: Callable[[], float]) -> float:
    """Average power (W) while ``wait`` blocks (e.g. on a P2P receive); ``wait`` returns the seconds waited."""
    energy = device.energy_j()
    seconds = wait()
    if seconds <= 0:
        raise ValueError("energy.pipeline_profiler: the blocking wait took no time; wait longer to measure power.")
    return (device.energy_j() - energy) / seconds


def profile_pipeline(instructions: Sequence[Mapping[Instruction, InstructionRun]], devices: Sequence[EnergyDevice],
                     p2p_power_w: float, **scan_options) -> PipelineProfile:
    """The profile of every stage (``instructions[s]`` run on ``devices[s]``) in Perseus's rows."""
    if len(instructions) != len(devices):
        raise ValueError(f"energy.pipeline_profiler: {len(instructions)} stages but {len(devices)} devices; give "
                         f"one device per stage.")
    rows = [row for stage, (runs, device) in enumerate(zip(instructions, devices))
            for row in profile_stage(stage, runs, device, **scan_options)]
    return PipelineProfile(tuple(rows), p2p_power_w)


def profile_stage(stage: int, runs: Mapping[Instruction, InstructionRun], device: EnergyDevice,
                  **scan_options) -> list[ProfileRow]:
    """Perseus's rows of one stage: each of its instructions (``runs``) scanned on ``device``."""
    return [ProfileRow(stage, kind, mhz, seconds, joules) for kind in Instruction
            for mhz, seconds, joules in scan_instruction(device, runs[kind], **scan_options)]


def simulated_pipeline_profile(host_s: Sequence[Mapping[Instruction, float]], model: DVFSModel) -> PipelineProfile:
    """The profile simulated DVFS devices (one per stage, virtual clocks) give instructions whose host side
    takes ``host_s[stage][instruction]`` seconds at the top clock; P2P power measured on the first device."""
    clock, host = VirtualClock(), VirtualClock()
    devices = [SimulatedDVFSDevice(f"sim-gpu{s}", model, clock) for s in range(len(host_s))]
    runs = [{kind: (lambda s=s: host.advance(s)) for kind, s in stage.items()} for stage in host_s]
    p2p_w = blocking_power_w(devices[0], lambda: (clock.advance(1.0), 1.0)[1])
    return profile_pipeline(runs, devices, p2p_w, repeats=1, warmup=0, host_clock=host.now)


def reference_instructions(spec: PipelineSpec, stage: int, num_stages: int,
                           device: torch.device | str = "cpu") -> dict[Instruction, InstructionRun]:
    """Forward and backward of one microbatch on stage ``stage`` of the reference pipeline (real tensors;
    the backward reuses one retained graph, as a stage's backward follows its forward)."""
    device = torch.device(device)
    model = spec.stage_model(stage, num_stages).to(device)
    generator = torch.Generator().manual_seed(spec.seed + stage)
    width = spec.in_features if stage == 0 else spec.width
    x = torch.randn(spec.microbatch_size, width, generator=generator).to(device).requires_grad_(stage > 0)
    last = stage == num_stages - 1
    y = torch.randint(0, spec.classes, (spec.microbatch_size,), generator=generator).to(device)

    def forward() -> torch.Tensor:
        out = model(x)
        return nn.functional.cross_entropy(out, y) if last else out

    graph = forward()
    grad = None if last else torch.randn(graph.shape, generator=generator).to(device)

    def run_forward() -> None:
        forward()

    def run_backward() -> None:
        graph.backward(grad, retain_graph=True)

    return {Instruction.FORWARD: run_forward, Instruction.BACKWARD: run_backward}
