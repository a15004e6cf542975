"""build_member: the plain model at scale 1, the µP surrogate (hydro.shrink) above."""
import pytest
import torch

import hydro
from hydro.examples.models import MLP
from hydro.trial.surrogate import build_member


def factory(config):
    return MLP((64, 256, 256, 10))


def test_scale_one_is_the_users_model_and_bad_scales_fail():
    model = build_member(factory, {}, 1)
    assert type(model) is MLP and sum(p.numel() for p in model.parameters()) == 64 * 256 + 256 * 256 + 2570 + 512
    with pytest.raises(ValueError, match="scale must be >= 1"):
        build_member(factory, {}, 0)
    with pytest.raises(ValueError, match="needs µP"):
        build_member(factory, {}, 8, mup=False)


def test_scale_eight_builds_a_narrower_fusable_surrogate():
    full = build_member(factory, {}, 1)
    small = build_member(factory, {}, 8)
    assert sum(p.numel() for p in small.parameters()) < sum(p.numel() for p in full.parameters()) / 8
    fused = hydro.fuse([build_member(factory, {}, 8) for _ in range(3)])
    assert fused(torch.randn(5, 64)).shape == (3, 5, 10)
    torch.manual_seed(0)
    full = build_member(factory, {}, 1)
    torch.manual_seed(0)
    target = build_member(factory, {}, 1, mup=True)  # the full-size target of a shrunk run: the user's model in µP
    assert [p.shape for p in target.parameters()] == [p.shape for p in full.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(target.parameters(), full.parameters()))
    assert all(hasattr(p, "hydro_mup") for p in target.parameters())
    assert not any(hasattr(p, "hydro_mup") for p in full.parameters())
