"""Members of one trial: fused by default; an unfusable model fails naming the problem, or falls back."""
import pytest
import torch
from torch import nn

from hydro.binder import FuseError
from hydro.tune.epoch import evaluate, train_epoch
from hydro.tune.members import FusedMembers, LoopedMembers, build_members
from tests.tune.workload import small_digits, spec


class DataDependent(nn.Module):
    """torch.fx cannot trace Python control flow on tensor values."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


CONFIGS = [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.01, "momentum": 0.0}]


def test_unfusable_model_error_names_the_model_and_the_fallback():
    with pytest.raises(FuseError, match="DataDependent.*fallback_unfused=True"):
        build_members(spec(model=lambda c: DataDependent()), CONFIGS, ["a", "b"], 1, fuse=True)
    members, reason = build_members(spec(model=lambda c: DataDependent(), fallback_unfused=True), CONFIGS,
                                    ["a", "b"], 1, fuse=True)
    assert isinstance(members, LoopedMembers) and "DataDependent" in reason
    assert members(torch.randn(3, 64)).shape == (2, 3, 10)


def test_fused_members_train_like_looped_ones_and_keep_slices_state():
    train, val = small_digits()
    workload = spec()
    fused, _ = build_members(workload, CONFIGS, ["a", "b"], 1, fuse=True)
    looped, _ = build_members(workload, CONFIGS, ["a", "b"], 1, fuse=False)
    assert isinstance(fused, FusedMembers) and isinstance(looped, LoopedMembers)
    losses = [train_epoch(m, train, 32, workload.loss, torch.Generator().manual_seed(0)) for m in (fused, looped)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    fused.keep([1])
    assert fused.member_ids == ["b"] and fused.optimizer.num_members == 1
    after = evaluate(fused, val, 32, workload.loss, workload.metrics)["val_acc"]
    looped.keep([1])
    torch.testing.assert_close(after, evaluate(looped, val, 32, workload.loss, workload.metrics)["val_acc"],
                               rtol=1e-4, atol=1e-4)
