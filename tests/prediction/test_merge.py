"""Merging the survivors of fused trials into one trial (no Ray): they continue as in their own trials."""
import pytest
import torch

from hydro.trial.merge import merge_states
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.prediction.workload import mlp_without_input_bias
from tests.tune.workload import small_digits, spec

A = [("a1", {"lr": 0.1, "momentum": 0.9}), ("a2", {"lr": 0.05, "momentum": 0.0}), ("a3", {"lr": 0.2, "momentum": 0.9})]
B = [("b1", {"lr": 0.02, "momentum": 0.9}), ("b2", {"lr": 0.3, "momentum": 0.9})]


def trained(workload, members, keep):
    trial = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, members), small_digits())
    trial.run_epoch()
    trial.keep([trial.member_ids.index(m) for m in keep])
    return trial


def merged_and_separate(workload):
    a, b = trained(workload, A, ["a3", "a2"]), trained(workload, B, ["b1"])
    state = merge_states([a.state_dict(), b.state_dict()])
    merged = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, A + B), small_digits(), member_ids=state["member_ids"])
    merged.load_state_dict(state)
    return merged, a, b


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_merged_survivors_continue_bit_identically(one_thread):
    merged, a, b = merged_and_separate(spec(model=mlp_without_input_bias))
    assert merged.member_ids == ["a3", "a2", "b1"]
    for _ in range(2):
        together, alone = merged.run_epoch(), [a.run_epoch(), b.run_epoch()]
        for name, values in together.items():
            assert torch.equal(values, torch.cat([alone[0][name], alone[1][name]])), name
    weights = [t.state_dict()["members"][0]["modules"][0] for t in (merged, a, b)]
    momentum = [t.state_dict()["members"][0]["optimizers"][0]["state"] for t in (merged, a, b)]
    for key in weights[0]:
        assert torch.equal(weights[0][key], torch.cat([weights[1][key], weights[2][key]])), key
    for index, state in momentum[0].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.dim():
                assert torch.equal(value, torch.cat([momentum[1][index][key], momentum[2][index][key]]))


def test_a_shared_input_bias_differs_only_in_the_last_bits(one_thread):
    merged, a, b = merged_and_separate(spec())
    together, alone = merged.run_epoch(), [a.run_epoch(), b.run_epoch()]
    for name, values in together.items():
        assert torch.allclose(values, torch.cat([alone[0][name], alone[1][name]]), rtol=1e-5, atol=0), name


def test_only_trials_at_one_epoch_boundary_with_distinct_members_merge():
    workload = spec()
    a = trained(workload, A, ["a1"])
    b = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, B), small_digits())
    with pytest.raises(ValueError, match="same epoch boundary"):
        merge_states([a.state_dict(), b.state_dict()])
    with pytest.raises(ValueError, match="more than one trial"):
        merge_states([a.state_dict(), a.state_dict()])
    with pytest.raises(ValueError, match="no trial states"):
        merge_states([])
