"""Shared helpers of the tests: the same batches trained fused and independently."""
from __future__ import annotations

import copy

import torch
from torch import nn

import hydro
from hydro.loss import trial_losses


def batches(kind: str, steps: int, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return [(torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(steps)]
    if kind == "cnn":
        return [(torch.randn(batch, 1, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
                for _ in range(steps)]
    return [(torch.randint(0, 32, (batch, 12), generator=g), torch.randint(0, 4, (batch,), generator=g))
            for _ in range(steps)]


def train_independent(models, make_optimizer, configs, data, loss_fn=nn.CrossEntropyLoss()):
    """Each model alone with its torch optimizer; returns (models, losses [steps, F])."""
    models = [copy.deepcopy(m) for m in models]
    optimizers = [make_optimizer(m.parameters(), **cfg) for m, cfg in zip(models, configs)]
    losses = []
    for x, y in data:
        row = []
        for model, opt in zip(models, optimizers):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            row.append(loss.detach())
        losses.append(torch.stack(row))
    return models, torch.stack(losses)


def train_fused(fused, optimizer, data, loss_fn=nn.CrossEntropyLoss()):
    """Returns the losses [steps, F] of training ``fused`` on the sum of its members' losses."""
    losses = []
    for x, y in data:
        optimizer.zero_grad()
        member_losses = trial_losses(loss_fn, fused(x), y)
        member_losses.sum().backward()
        optimizer.step()
        losses.append(member_losses.detach())
    return torch.stack(losses)


def assert_models_close(actual: nn.Module, expected: nn.Module, rel: float = 1e-5) -> None:
    """Every tensor of ``actual`` within ``rel`` relative (Frobenius) error of ``expected``'s."""
    exp = expected.state_dict()
    for name, tensor in actual.state_dict().items():
        ref = exp[name]
        if not ref.is_floating_point():
            assert torch.equal(tensor, ref), name
            continue
        err = (tensor - ref).norm() / ref.norm().clamp_min(1e-12)
        assert err <= rel, f"{name}: relative error {err:.2e} > {rel:.0e}"


def split_configs(configs: list[dict]) -> dict:
    """Per-member configs as per-member hyperparameter lists for a fused optimizer."""
    return {k: [c[k] for c in configs] for k in configs[0]}


def fuse_copies(models):
    return hydro.fuse([copy.deepcopy(m) for m in models])
