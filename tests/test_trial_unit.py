"""Members of one trial: fused by default; an unfusable model fails naming the problem, or falls back."""
import pytest
import torch
from torch import nn

from hydro.binder import FuseError
from hydro.trial.members import FusedMembers, LoopedMembers, build_members
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial, Observer, batch_order
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
    workload = spec()
    members = list(zip(["a", "b"], CONFIGS))
    fused = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, members), small_digits())
    looped = FusedTrial(workload, TrialPlan(TrialKind.PLAIN, members), small_digits())
    assert isinstance(fused.members, FusedMembers) and isinstance(looped.members, LoopedMembers)
    losses = [t.train_epoch() for t in (fused, looped)]
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-5)
    fused.keep([1])
    assert fused.member_ids == ["b"] and fused.members.optimizer.num_members == 1
    looped.keep([1])
    torch.testing.assert_close(fused.evaluate()["val_acc"], looped.evaluate()["val_acc"], rtol=1e-4, atol=1e-4)


class Recorder(Observer):
    def __init__(self):
        self.steps, self.epochs = [], []

    def on_step_end(self, trial, losses):
        self.steps.append((trial.epoch, trial.step, losses.shape))

    def on_epoch_end(self, trial, metrics):
        self.epochs.append((trial.epoch, sorted(metrics)))


def test_a_trial_checkpointed_mid_epoch_continues_exactly_and_observers_see_every_step():
    workload = spec(epochs=2)
    plan = TrialPlan(TrialKind.SURROGATE, list(zip(["a", "b"], CONFIGS)))
    recorder = Recorder()
    alone = FusedTrial(workload, plan, small_digits(), observers=[recorder])
    expected = [alone.run_epoch() for _ in range(2)]
    assert len(recorder.steps) == 2 * alone.steps_per_epoch and recorder.steps[0] == (0, 1, (2,))
    assert recorder.epochs == [(1, ["train_loss", "val_acc", "val_loss"]), (2, ["train_loss", "val_acc", "val_loss"])]
    first = FusedTrial(workload, plan, small_digits())
    for _ in range(3):
        first.train_step()
    state = first.state_dict()
    moved = FusedTrial(workload, plan, small_digits(), member_ids=state["member_ids"])
    moved.load_state_dict(state)
    resumed = [moved.run_epoch() for _ in range(2)]
    for got, want in zip(resumed, expected):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)


def test_batch_order_is_a_function_of_seed_and_epoch():
    assert torch.equal(batch_order(3, 2, 50), batch_order(3, 2, 50))
    assert not torch.equal(batch_order(3, 2, 50), batch_order(3, 3, 50))
    assert not torch.equal(batch_order(3, 2, 50), batch_order(4, 2, 50))


def test_loading_a_checkpoint_of_other_members_names_both():
    workload = spec()
    plan = TrialPlan(TrialKind.SURROGATE, list(zip(["a", "b"], CONFIGS)))
    state = FusedTrial(workload, plan, small_digits()).state_dict()
    with pytest.raises(ValueError, match=r"\['a', 'b'\].*\['b'\].*member_ids="):
        FusedTrial(workload, plan, small_digits(), member_ids=["b"]).load_state_dict(state)
