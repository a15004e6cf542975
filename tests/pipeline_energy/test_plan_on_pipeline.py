"""A Perseus plan run by a real 2-stage 1F1B pipeline on a local Ray cluster, each stage on a wall-clock
simulated DVFS device: the planned clocks change speed and energy, not training, and come back to default."""
import pytest
import ray
import torch

from hydro.pipeline import PipelineSpec
from hydro.energy.frequency import DVFSModel, SimulatedDVFSDevice
from hydro.pipeline.profiler import simulated_pipeline_profile
from hydro.tune.pipeline.job import PipelineJob
from schedulers.pipeline_energy import Instruction
from tests.bubbles.alone import train_unsplit
from tests.pipeline_energy.plans import solve

SPEC = PipelineSpec(width=64, depth=3, microbatches=4, microbatch_size=16)
MODEL = DVFSModel(tuple(range(1740, 645, -15)))


def test_zero_slowdown_plan_runs_on_the_pipeline_and_restores_clocks(ray_cluster):
    # Stage 1 has half the work: the zero-slowdown plan slows some of its instructions.
    host_s = [{Instruction.FORWARD: 0.02, Instruction.BACKWARD: 0.04},
              {Instruction.FORWARD: 0.01, Instruction.BACKWARD: 0.02}]
    dag, _, baseline, free = solve(simulated_pipeline_profile(host_s, MODEL), SPEC.microbatches)
    plans = dag.stage_plans(free.frequencies)
    assert free.time_s <= baseline.time_s and min(plans[1]) < MODEL.max_mhz
    job = PipelineJob(SPEC, num_stages=2, num_cpus_per_stage=0.5)
    try:
        with pytest.raises(ValueError, match="one per instruction"):  # refused before any stage starts
            job.run_frequency_plan(1, [plans[0], plans[1][:-1]], [SimulatedDVFSDevice(f"sim{s}", MODEL)
                                                                   for s in range(2)])
        reports = job.run_frequency_plan(2, plans, [SimulatedDVFSDevice(f"sim{s}", MODEL) for s in range(2)])
        weights = ray.get([s.weights.remote() for s in job.stages])
    finally:
        job.shutdown()
    assert [r["frequency_after_mhz"] for r in reports] == [MODEL.max_mhz] * 2
    assert all(r["energy_j"] > 0 for r in reports)
    # Same training as the unsplit model (2 iterations; the refused run did no work).
    model = train_unsplit(SPEC, 2)
    actual = [t for w in weights for t in w.values()]
    for a, e in zip(actual, model.state_dict().values()):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
