"""Merging the survivors of fused trials into one trial (no Ray): they continue as in their own trials."""
import pytest
import torch

from hydro.trial.merge import merge_states
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.prediction.workload import grouped_sgd, mlp_without_input_bias
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


def assert_go_on_alike(merged, parts, epochs: int = 2) -> None:
    """``merged`` and its trials ``parts`` (in merge order) train ``epochs`` epochs: bit-identical metrics, weights
    and the optimizer state the trials keep."""
    for _ in range(epochs):
        together, alone = merged.run_epoch(), [part.run_epoch() for part in parts]
        for name, values in together.items():
            assert torch.equal(values, torch.cat([metrics[name] for metrics in alone])), name
    weights = [t.state_dict()["members"][0]["modules"][0] for t in (merged, *parts)]
    optimizer = [t.state_dict()["members"][0]["optimizers"][0]["state"] for t in (merged, *parts)]
    for key in weights[0]:
        assert torch.equal(weights[0][key], torch.cat([w[key] for w in weights[1:]])), key
    for index, state in optimizer[0].items():
        start = 0
        for part, kept in zip(parts, optimizer[1:]):  # members without momentum in a trial of their own keep none
            count = len(part.member_ids)
            for key, value in kept.get(index, {}).items():
                if isinstance(value, torch.Tensor) and value.dim():
                    assert torch.equal(state[key][start:start + count], value), (index, key)
            start += count


def test_merged_survivors_continue_bit_identically(one_thread):
    merged, a, b = merged_and_separate(spec(model=mlp_without_input_bias))
    assert merged.member_ids == ["a3", "a2", "b1"]
    assert_go_on_alike(merged, [a, b])


C = [("c1", {"lr": 0.1, "momentum": 0.0}), ("c2", {"lr": 0.3, "momentum": 0.0})]  # no momentum: no buffers


@pytest.mark.parametrize("order", ["without-first", "with-first"])
def test_trials_without_momentum_merge_with_trials_with_it(one_thread, order):
    """A trial whose members have no momentum keeps no momentum buffers; merged with members that have them, in
    either order, every member goes on exactly as in its own trial (none loses its buffer)."""
    workload = spec(model=mlp_without_input_bias)
    c, b = trained(workload, C, ["c1", "c2"]), trained(workload, B, ["b1", "b2"])
    assert not c.state_dict()["members"][0]["optimizers"][0]["state"]
    assert b.state_dict()["members"][0]["optimizers"][0]["state"]
    parts = [c, b] if order == "without-first" else [b, c]
    state = merge_states([part.state_dict() for part in parts])
    merged = FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, C + B), small_digits(), member_ids=state["member_ids"])
    merged.load_state_dict(state)
    assert_go_on_alike(merged, parts)


def test_trials_whose_optimizers_group_parameters_differently_do_not_merge():
    workload = spec(optimizer=grouped_sgd)
    grouped = trained(workload, [("g1", {"lr": 0.1, "groups": True})], ["g1"])
    whole = trained(workload, [("w1", {"lr": 0.1, "groups": False})], ["w1"])
    for parts in ([grouped, whole], [whole, grouped]):
        with pytest.raises(ValueError, match="merge_states: the trials' optimizers differ in their parameter groups"):
            merge_states([part.state_dict() for part in parts])


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
