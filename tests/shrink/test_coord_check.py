"""Coordinate check: mean |activation| of every layer after a few Adam steps, at widths 64...1024.

Under µP (``hydro.shrink`` of the width-1024 model) it stays within a factor 2 across widths; under the
standard parametrization (the same architecture built at each width) the output grows with width.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from shrink_models import MLP, CharTransformer, RecurrentLM
from torch import Tensor, nn

import hydro
from hydro.shrink import mup_param_groups

BASE = 1024
SCALES = (16, 8, 4, 2, 1)  # widths 64 ... 1024
LR, STEPS = 3e-3, 4


def mean_abs_activations(model: nn.Module, x: Tensor, y: Tensor, *, mup: bool) -> dict[str, float]:
    """Train ``STEPS`` Adam steps on (x, y), then mean |output| of every Linear/LayerNorm/Embedding/attention/
    recurrent layer."""
    groups = mup_param_groups(model.parameters(), "adam", LR) if mup else model.parameters()
    optimizer = torch.optim.Adam(groups, lr=LR)
    for _ in range(STEPS):
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    acts: dict[str, float] = {}

    def record(name: str):
        def hook(module, inputs, output):
            output = output[0] if isinstance(output, tuple) else output
            acts[name] = output.abs().mean().item()
        return hook

    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.LayerNorm, nn.Embedding, nn.MultiheadAttention, nn.RNNBase)):
            module.register_forward_hook(record(name))
    with torch.no_grad():
        model(x)
    return acts


def coordinates(make: Callable[[int], nn.Module], x: Tensor, y: Tensor, *, mup: bool) -> dict[str, list[float]]:
    """Per layer, mean |activation| at each width of ``SCALES`` (narrowest first)."""
    rows = []
    for scale in SCALES:
        torch.manual_seed(0)
        model = hydro.shrink(make(BASE), scale) if mup else make(BASE // scale)
        rows.append(mean_abs_activations(model, x, y, mup=mup))
    assert all(row.keys() == rows[0].keys() for row in rows)
    return {name: [row[name] for row in rows] for name in rows[0]}


def mlp_data() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(32, 16, generator=g), torch.randint(0, 10, (32,), generator=g)


def lm_data() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 32, (8, 16), generator=g), torch.randint(0, 32, (8, 16), generator=g)


CASES = {"mlp": (lambda w: MLP(w), mlp_data, 3), "transformer": (lambda w: CharTransformer(w, layers=1), lm_data, 8),
         "gru": (lambda w: RecurrentLM(w), lm_data, 3)}


@pytest.mark.parametrize("case", CASES)
def test_mup_coordinates_stay_flat_across_widths(case):
    make, data, layers = CASES[case]
    coords = coordinates(make, *data(), mup=True)
    assert len(coords) == layers
    for name, values in coords.items():
        assert max(values) / min(values) <= 2.0, f"{name}: {values}"


@pytest.mark.parametrize("case", CASES)
def test_standard_parametrization_output_grows_with_width(case):
    make, data, _ = CASES[case]
    coords = coordinates(make, *data(), mup=False)
    out = coords["readout"]
    assert all(a < b for a, b in zip(out, out[1:])), out
    assert out[-1] / out[0] >= 3.0, out
