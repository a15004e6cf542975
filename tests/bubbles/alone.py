"""References: a fill trial trained alone, single-threaded like a fill process; the unsplit main model."""
import torch
from torch import nn

from hydro.bubbles import FillSpec, FillTrial, PipelineSpec


def train_alone(spec: FillSpec, steps: int) -> FillTrial:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fill processes run single-threaded kernels: bit-comparable results
    try:
        trial = FillTrial(spec)
        for _ in range(steps):
            trial.step()
        return trial
    finally:
        torch.set_num_threads(threads)


def same_state(state: dict, trial: FillTrial) -> bool:
    """``state`` (a checkpoint's model state) equals ``trial``'s weights bit for bit."""
    return all(torch.equal(state[k], v) for k, v in trial.model.state_dict().items())


def train_unsplit(spec: PipelineSpec, iterations: int) -> nn.Module:
    """The pipeline's model unsplit, trained ``iterations`` with microbatch gradient accumulation."""
    model = spec.full_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr)
    for iteration in range(iterations):
        x, y = spec.batch(iteration)
        for i in range(spec.microbatches):
            (nn.functional.cross_entropy(model(x[i]), y[i]) / spec.microbatches).backward()
        optimizer.step()
        optimizer.zero_grad()
    return model
