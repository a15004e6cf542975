"""One real pipeline stage with emulated neighbours (the one-device method of ``benchmarks/bubble_squeeze.py``), on
the CPU through the same code as on a GPU: the emulated stages answer when the full 1F1B pipeline would, the stage
measures its bubbles with its device timer and synchronises with the device only where it waits."""
import pytest
import torch

from hydro.pipeline import BubbleRecorder, PipelineSpec, PipelineStage
from hydro.pipeline.emulated import EmulatedNeighbours
from hydro.pipeline.schedule import one_f_one_b, simulate

SPEC = PipelineSpec(width=32, depth=6, microbatches=4, microbatch_size=8)


@pytest.mark.parametrize("stage, num_stages", [(0, 2), (1, 3), (3, 4)])
def test_emulated_stages_send_when_the_full_pipeline_would(stage, num_stages):
    """Given the real stage's sends at the simulated times, every emulated message is due exactly when the simulated
    full pipeline (forward 1 s, backward 2 s per stage) produces it."""
    ops, _ = simulate(one_f_one_b(num_stages, 5), [1.0] * num_stages, [2.0] * num_stages)
    ends = {(o.stage, o.label[0], int(o.label[1:])): o.end for o in ops}
    neighbours = EmulatedNeighbours(stage, num_stages, 5)
    neighbours.set_times(1.0, 2.0)
    done = neighbours._play({key: end for key, end in ends.items() if key[0] == stage})
    assert done == ends


def test_a_receive_out_of_order_is_reported_not_waited_for_forever():
    neighbours = EmulatedNeighbours(0, 2, 2)
    with pytest.raises(RuntimeError, match="out of 1F1B order"):
        neighbours.due((1, "B", 0))  # stage 0 has not sent F0 yet


@pytest.mark.parametrize("stage", [0, 1])
def test_one_real_stage_has_the_pipelines_bubbles_measured_on_its_device_with_one_sync_per_wait(stage, monkeypatch):
    torch.manual_seed(0)
    recorder = BubbleRecorder()
    real = PipelineStage(SPEC, stage, 3, recorder, "cpu",
                         transport=EmulatedNeighbours(stage, 3, SPEC.microbatches, "cpu"))
    forward, backward = real.profile(2)
    assert forward > 0 and backward > 0 and real.transport.forward_s == [forward] * 3
    waits = []
    monkeypatch.setattr(real.timer, "wait", waits.append)  # the stage's own synchronisations with its device
    recorder.bubbles.clear()
    for _ in range(3):
        real.run_iteration()
    receives = sum(1 for op in real.schedule if (op.kind == "F" and stage > 0) or (op.kind == "B" and stage < 2))
    assert len(real.device_bubbles) == len(recorder.bubbles) == 3 * receives  # every receive is a bubble
    assert all(b.length >= 0 for b in real.device_bubbles)
    assert sum(b.length for b in real.device_bubbles) > 0  # the emulated neighbours kept it waiting
    # Host-device synchronisations: two per wait (the stage's work drained, the answer there) and two per iteration
    # (the optimizer step's, the timer's anchor) — none per microbatch besides the waits.
    assert len(waits) == 3 * (2 * receives + 2)
    assert [o.label for o in real.timeline[:len(real.schedule)]] == [f"{o.kind}{o.microbatch}" for o in real.schedule]


def test_the_bubble_benchmark_runs_on_the_cpu():
    """``benchmarks/bubble_squeeze.py``'s measurement, tiny: every mode measured, the gated fill's bubbles real."""
    from benchmarks.bubble_squeeze import MODES, measure

    results = measure("cpu", rounds=1, iterations=2, stages=2, members=1, scale=4,
                      spec=PipelineSpec(width=32, depth=4, microbatches=4, microbatch_size=8))
    assert [r["mode"] for r in results] == list(MODES)
    alone, gated, naive = results
    assert alone["slowdown"] == 0.0 and alone["fill_member_steps_per_s"] == 0.0
    for r in results:
        assert r["iteration_s"] > 0 and 0 < r["bubble_fraction"] < 1 and r["rounds"] == 1
    assert gated["bubble_use"] >= 0 and naive["fill_member_steps_per_s"] >= 0
    assert gated["last"]["reports"][0]["bubbles"]  # the device's waits, as the plot draws them
