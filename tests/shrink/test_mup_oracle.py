"""hydro.shrink's µP against microsoft/mup (installed with ``pip install --no-deps mup``) as the oracle:
µP shapes, per-parameter learning rates and weight decays of MuAdam/MuAdamW/MuSGD, initialisation
scales and the readout multiplier, for an MLP."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import hydro
import hydro.optim
from hydro.shrink import mup_param_groups

mup = pytest.importorskip("mup")

D_IN, D_OUT, BASE, SCALE = 300, 300, 1024, 4
LR, WD = 0.01, 0.1


class MuMLP(nn.Module):
    """The test MLP with mup's readout (the same parameter names as ``shrink(MLP)``)."""

    def __init__(self, width: int, zero_init: bool) -> None:
        super().__init__()
        self.readout = mup.MuReadout(width, D_OUT, readout_zero_init=zero_init)
        self.input = nn.Linear(D_IN, width)
        self.hidden = nn.ModuleList([nn.Linear(width, width)])

    def forward(self, x):
        return self.readout(torch.relu(self.hidden[0](torch.relu(self.input(x)))))


def oracle(zero_init: bool = False) -> nn.Module:
    model = MuMLP(BASE // SCALE, zero_init)
    mup.set_base_shapes(model, MuMLP(BASE, zero_init))
    return model


def ours(zero_init: bool | None = None) -> nn.Module:
    """``hydro.shrink`` of the test MLP; ``zero_init=None``: its default readout init."""
    from shrink_models import MLP
    options = {} if zero_init is None else {"readout_zero_init": zero_init}
    return hydro.shrink(MLP(BASE, D_IN, D_OUT, depth=3), SCALE, **options)


def per_name(model: nn.Module, groups: list[dict]) -> dict[str, float]:
    """``{'<param name> <lr|weight_decay>': value}`` from optimizer groups."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {f"{names[id(p)]} {k}": float(g[k]) for g in groups for p in g["params"] for k in ("lr", "weight_decay")}


def test_mu_shapes_match_infshapes():
    mine, ref = dict(ours().named_parameters()), dict(oracle().named_parameters())
    assert mine.keys() == ref.keys()
    for name, p in ref.items():
        assert mine[name].hydro_mup.base == tuple(p.infshape.base_shape()), name
        assert mine[name].hydro_mup.shape == tuple(p.infshape.shape()), name
        assert mine[name].hydro_mup.width_mult() == p.infshape.width_mult(), name


@pytest.mark.parametrize("rule,mu_optimizer", [("adam", "MuAdam"), ("adam", "MuAdamW"), ("sgd", "MuSGD")])
def test_torch_param_groups_match_mu_optimizers(rule, mu_optimizer):
    mine, ref = ours(), oracle()
    expected = per_name(ref, getattr(mup, mu_optimizer)(ref.parameters(), lr=LR, weight_decay=WD).param_groups)
    got = per_name(mine, mup_param_groups(mine.parameters(), rule, LR, WD))
    assert got == pytest.approx(expected)
    assert len({v for v in expected.values()}) > 1  # the rule does distinguish parameters here


@pytest.mark.parametrize("optimizer,mu_optimizer", [("Adam", "MuAdam"), ("AdamW", "MuAdamW"), ("SGD", "MuSGD")])
def test_hydro_optim_effective_rates_match_mu_optimizers(optimizer, mu_optimizer):
    ref = oracle()
    expected = per_name(ref, getattr(mup, mu_optimizer)(ref.parameters(), lr=LR, weight_decay=WD).param_groups)
    fused = hydro.fuse([ours(), ours()])
    groups = getattr(hydro.optim, optimizer)(fused.parameters(), lr=LR, weight_decay=WD).param_groups
    effective = [{"params": g["params"], "lr": g["lr"][0] * g["lr_mult"],
                  "weight_decay": g["weight_decay"][0] * g["wd_mult"]} for g in groups]
    assert per_name(fused, effective) == pytest.approx(expected)


def test_init_scales_match_set_base_shapes():
    torch.manual_seed(0)
    mine = dict(ours().named_parameters())
    torch.manual_seed(0)
    ref = dict(oracle().named_parameters())
    for name, p in ref.items():  # SCALE=4: a wrong rescaling is off by a factor 2 (default: MuReadout's init)
        assert mine[name].std().item() == pytest.approx(p.std().item(), rel=0.15), name


def test_zero_readout_and_output_multiplier_match_mu_readout():
    mine, ref = ours(zero_init=True), oracle(zero_init=True)
    assert torch.count_nonzero(mine.readout.weight) == torch.count_nonzero(ref.readout.weight) == 0
    mine = ours()
    ref.load_state_dict(mine.state_dict())
    x = torch.randn(4, D_IN)
    torch.testing.assert_close(mine(x), ref(x))
