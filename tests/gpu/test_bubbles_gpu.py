"""The Bubble Squeezer on a GPU: device timing with CUDA events, one real stage with emulated neighbours, a gated
fill whose units run only in the stage's bubbles (skipped without CUDA; the same code runs on the CPU in
tests/bubbles/test_emulated_stage.py)."""
import dataclasses
import time

import pytest
import torch

from hydro.bubbles import BubbleGate, FillProcess
from hydro.pipeline import BubbleRecorder, PipelineSpec, PipelineStage
from hydro.pipeline.emulated import EmulatedNeighbours
from hydro.pipeline.timing import DeviceTimer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_device_timer_measures_gpu_time_not_launch_time():
    timer = DeviceTimer("cuda")
    a = torch.randn(4096, 4096, device="cuda")
    start = timer.mark()
    host_start = time.perf_counter()
    for _ in range(20):
        a = a @ a / 64
    launched = time.perf_counter() - host_start
    end = timer.mark()
    timer.wait(end)
    assert timer.seconds(start, end) > launched  # the kernels ran longer than launching them took
    assert abs(timer.wall(end) - time.time()) < 1.0


def test_one_gpu_stage_with_emulated_neighbours_has_device_bubbles_and_a_gated_fill_trains_in_them():
    from hydro.tune.examples import digits_mlp
    from hydro.tune.pipeline.job import pickled_workload
    from hydro.trial.plan import TrialKind, TrialPlan

    spec = PipelineSpec(width=2048, depth=8, microbatches=4, microbatch_size=64)
    gate = BubbleGate()
    recorder = BubbleRecorder(gate)
    stage = PipelineStage(spec, 0, 4, recorder, "cuda", transport=EmulatedNeighbours(0, 4, spec.microbatches, "cuda"))
    stage.profile(3)
    tune_spec, _ = digits_mlp(epochs=1000)
    plan = TrialPlan(TrialKind.SURROGATE, [("m0", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0})], 4, True)
    fill = FillProcess(gate, None, workload=pickled_workload(dataclasses.replace(tune_spec, device="cuda")), plan=plan,
                       member_ids=["m0"], idle=True)
    try:
        stage.device_bubbles.clear()
        deadline = time.monotonic() + 120
        while fill.completed_steps < 5:
            assert time.monotonic() < deadline, "the gated fill did not train 5 steps in the stage's bubbles"
            stage.run_iteration()
        bubble_s = sum(b.length for b in stage.device_bubbles)
        assert bubble_s > 0 and 0 < fill.compute_s  # device time of its units
    finally:
        fill.kill()
