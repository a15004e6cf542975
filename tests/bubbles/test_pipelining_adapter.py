"""The BubbleListener adapter for torch.distributed.pipelining: a real 2-stage Schedule1F1B or ScheduleGPipe over
gloo (two processes) reports every wait as a bubble and trains exactly as without the adapter."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import multiprocessing as mp
from torch import nn

from hydro.pipeline import BubbleRecorder
from hydro.bubbles.pipelining import PipeliningBubbles

MICROBATCHES, ITERATIONS = 4, 3


def _stage_module(stage: int) -> nn.Module:
    torch.manual_seed(stage)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU()) if stage == 0 else nn.Sequential(nn.Linear(32, 4))


def _worker(rank: int, port: int, queue, schedule_name: str) -> None:
    from torch.distributed import pipelining
    from torch.distributed.pipelining import PipelineStage

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        outcome = {}
        for hooked in (False, True):
            module = _stage_module(rank)
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
            stage = PipelineStage(module, rank, 2, torch.device("cpu"))
            schedule = getattr(pipelining, schedule_name)(stage, MICROBATCHES, loss_fn=nn.functional.cross_entropy)
            recorder = BubbleRecorder()
            runner = PipeliningBubbles(schedule, recorder, rank) if hooked else schedule
            losses = []
            for iteration in range(ITERATIONS):
                g = torch.Generator().manual_seed(iteration)
                x, y = torch.randn(8 * MICROBATCHES, 16, generator=g), torch.randint(0, 4, (8 * MICROBATCHES,), generator=g)
                optimizer.zero_grad()
                if rank == 0:
                    runner.step(x)
                else:
                    iteration_losses = []
                    runner.step(target=y, losses=iteration_losses)
                    losses.append([float(loss.detach()) for loss in iteration_losses])
                optimizer.step()
            outcome[hooked] = {"losses": losses, "weights": [p.detach().tolist() for p in module.parameters()],
                               "bubbles": [(b.length, b.predicted_s) for b in recorder.bubbles]}
        queue.put((rank, outcome))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("schedule_name", ["Schedule1F1B", "ScheduleGPipe"])
def test_single_stage_schedule_waits_are_reported_as_bubbles_and_training_is_unchanged(schedule_name):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_worker, args=(rank, port, queue, schedule_name), daemon=True)
                 for rank in range(2)]
    for p in processes:
        p.start()
    outcomes = dict(queue.get(timeout=120) for _ in processes)
    for p in processes:
        p.join(timeout=60)
    for rank, outcome in outcomes.items():
        plain, hooked = outcome[False], outcome[True]
        assert plain["bubbles"] == []  # nothing without the adapter
        assert len(hooked["bubbles"]) >= ITERATIONS * MICROBATCHES  # every receive of the stage, each iteration
        assert all(length >= 0 for length, _ in hooked["bubbles"])
        assert any(predicted > 0 for _, predicted in hooked["bubbles"])  # learned from earlier iterations
        assert hooked["losses"] == plain["losses"]
        assert hooked["weights"] == plain["weights"]  # floats from tensors, compared exactly
    assert len(outcomes[1][True]["losses"]) == ITERATIONS and outcomes[0][True]["losses"] == []


def test_multi_stage_runtime_schedules_are_refused_with_the_reason():
    from torch.distributed.pipelining import schedules

    runtime = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    with pytest.raises(TypeError, match="not a single-stage schedule"):
        PipeliningBubbles(runtime, BubbleRecorder(), 0)
