"""Reference: the pipeline's main model unsplit."""
import torch
from torch import nn

from hydro.pipeline import PipelineSpec


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
