"""A checkpoint of a shrunk model restores its µP shapes: its state_dict loads into ``shrink(target, S)``
(deterministic structure and µP shapes), and a pickled or deep-copied model keeps them."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from shrink_models import CharTransformer

import hydro
import hydro.optim


def mu_shapes(model):
    return {name: p.hydro_mup for name, p in model.named_parameters()}


def effective_lrs(model):
    optimizer = hydro.optim.Adam(hydro.fuse([model]).parameters(), lr=1.0)
    return sorted(float(g["lr_mult"]) for g in optimizer.param_groups)


def trained(model):
    optimizer = torch.optim.Adam(hydro.shrink.mup_param_groups(model.parameters(), "adam", 1e-2))
    tokens = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        optimizer.zero_grad()
        out = model(tokens)
        F.cross_entropy(out.reshape(-1, 32), tokens.reshape(-1)).backward()
        optimizer.step()
    return model, tokens


def test_state_dict_round_trip(tmp_path):
    target = CharTransformer(64, head_dim=8)
    model, tokens = trained(hydro.shrink(target, 4))
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    torch.manual_seed(123)  # a different initialisation, replaced by the checkpoint
    restored = hydro.shrink(target, 4)
    restored.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    torch.testing.assert_close(restored(tokens), model(tokens))
    assert mu_shapes(restored) == mu_shapes(model)
    assert effective_lrs(restored) == effective_lrs(model)
    assert restored.readout.output_mult == 4.0
    with pytest.raises(RuntimeError, match="size mismatch"):  # a checkpoint of another scale does not load
        hydro.shrink(target, 2).load_state_dict(torch.load(tmp_path / "ckpt.pt"))


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_whole_model_keeps_mu_shapes(tmp_path, how):
    model, tokens = trained(hydro.shrink(CharTransformer(64, head_dim=8), 4))
    if how == "pickle":
        torch.save(model, tmp_path / "model.pt")
        restored = torch.load(tmp_path / "model.pt", weights_only=False)
    else:
        restored = copy.deepcopy(model)
    assert mu_shapes(restored) == mu_shapes(model)
    assert len(set(effective_lrs(restored))) > 1 and effective_lrs(restored) == effective_lrs(model)
    torch.testing.assert_close(restored(tokens), model(tokens))
