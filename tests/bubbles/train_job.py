"""The user's Ray Train pipeline job of the Ray Train bubble tests: a TorchTrainer with 2 CPU workers, one
stage of a 2-stage torch.distributed.pipelining schedule each, registered as bubble slots with one call."""
import os
import time
from pathlib import Path

import ray
import torch
from torch import nn

from hydro.tune.bubbles.ray_train import bubble_slots

DEADLINE_S = 300.0  # the job stops by itself after this long (a test that failed to stop it never hangs)
MICROBATCHES, WIDTH = 4, 256


def stage_module(stage: int) -> nn.Module:
    torch.manual_seed(stage)
    layers = [nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers) if stage == 0 else nn.Sequential(*layers, nn.Linear(WIDTH, 4))


def train_loop(config: dict) -> None:
    """The user's train loop: one pipeline stage per worker, stepped until the test's stop file appears (the ranks
    agree on when, so that both run the same steps)."""
    import torch.distributed as dist
    from torch.distributed import pipelining

    rank = ray.train.get_context().get_world_rank()
    torch.set_num_threads(1)
    Path(config["dir"], f"pid-{rank}").write_text(str(os.getpid()))
    module = stage_module(rank)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    stage = pipelining.PipelineStage(module, rank, 2, torch.device("cpu"))
    schedule = getattr(pipelining, config["schedule"])(stage, MICROBATCHES, loss_fn=nn.functional.cross_entropy)
    steps, deadline = 0, time.monotonic() + DEADLINE_S
    with bubble_slots(schedule, job=config["job"]) as pipe:
        while True:
            stop = torch.tensor([float(Path(config["dir"], "stop").exists() or time.monotonic() > deadline)])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
            g = torch.Generator().manual_seed(steps)
            x = torch.randn(16 * MICROBATCHES, WIDTH, generator=g)
            y = torch.randint(0, 4, (16 * MICROBATCHES,), generator=g)
            optimizer.zero_grad()
            if rank == 0:
                pipe.step(x)
            else:
                pipe.step(target=y, losses=[])
            optimizer.step()
            steps += 1
    ray.train.report({"steps": steps, "bubble_fraction": pipe.bubble_fraction})


@ray.remote(num_cpus=0)
def run_job(job: str, schedule: str, directory: str) -> str | None:
    """Run the TorchTrainer job; its error in words, or ``None``."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(train_loop, train_loop_config={"job": job, "schedule": schedule, "dir": directory},
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                           run_config=RunConfig(name=job, storage_path=str(Path(directory, "train"))))
    try:
        result = trainer.fit()
    except Exception as error:  # noqa: BLE001 - reported to the test
        return repr(error)
    return None if result.error is None else repr(result.error)
