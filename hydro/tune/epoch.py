"""One epoch of training and one validation pass of a trial's members (no Ray here)."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from hydro.loss import trial_losses
from hydro.tune.members import Members
from hydro.tune.spec import VAL_LOSS, Batch, MetricFn


def train_epoch(members: Members, train: Batch, batch_size: int, loss_fn: Callable, generator: torch.Generator
                ) -> Tensor:
    """One pass over ``train`` in shuffled batches shared by all members; the members' mean loss ``[F]``."""
    x, y = train
    members.train(True)
    total, seen = None, 0
    for index in torch.randperm(len(y), generator=generator).split(batch_size):
        members.zero_grad()
        losses = trial_losses(loss_fn, members(x[index]), y[index])  # [F]
        losses.sum().backward()  # member i's gradient is exactly that of its own loss
        members.step()
        batch_total = losses.detach() * len(index)
        total = batch_total if total is None else total + batch_total
        seen += len(index)
    return total / seen


@torch.no_grad()
def evaluate(members: Members, val: Batch, batch_size: int, loss_fn: Callable, metrics: Mapping[str, MetricFn]
             ) -> dict[str, Tensor]:
    """``val_loss`` and every metric of ``metrics`` per member, each ``[F]``: means over ``val`` in chunks
    (weighted by chunk size, so exact for metrics that are means over samples)."""
    x, y = val
    members.train(False)
    sums: dict[str, Tensor] = {}
    for index in torch.arange(len(y)).split(max(batch_size, 256)):
        output, target = members(x[index]), y[index]  # [F, n, ...], [n, ...]
        values = {VAL_LOSS: trial_losses(loss_fn, output, target)}
        for name, fn in metrics.items():
            values[name] = torch.stack([torch.as_tensor(fn(out, target), dtype=torch.float64) for out in output])
        for name, value in values.items():
            sums[name] = sums.get(name, 0) + value.double() * len(index)
    return {name: total / len(y) for name, total in sums.items()}

