"""Merging fused trials whose optimizer states hold different entries (``hydro.trial.merge``): members without a
momentum buffer beside members with one, a parameter one trial has not stepped yet; each member of the merged
optimizer steps bit for bit as it does in its own trial, or the merge is refused before anything changes."""
import copy

import pytest
import torch

from hydro.optim import SGD, Adam, AdamW
from hydro.trial.merge import merge_states

SHAPES = [(4, 3), (3,), (2, 3, 2)]


def _params(members: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(members, *shape, generator=g).requires_grad_() for shape in SHAPES]


def _step(params, optimizer, g: torch.Generator, skip=()) -> None:
    """One step on random gradients (none for the parameters at the indices in ``skip``)."""
    for i, p in enumerate(params):
        p.grad = None if i in skip else torch.randn(p.shape, generator=g)
    optimizer.step()


def _trained(cls, kwargs: dict, members: int, seed: int, skip=()) -> tuple[list[torch.Tensor], object]:
    """Fused parameters of ``members`` members and their optimizer after 3 steps (without gradients for the
    parameters at ``skip``: a parameter not stepped yet)."""
    params = _params(members, seed)
    optimizer = cls(params, **kwargs)
    g = torch.Generator().manual_seed(seed + 100)
    for _ in range(3):
        _step(params, optimizer, g, skip)
    return params, optimizer


def _state(ids: list[str], params, optimizer) -> dict:
    """The state a one-chunk FusedTrial of these members saves at an epoch boundary."""
    return {"member_ids": ids, "chunks": [len(ids)], "max_fusion": len(ids), "epoch": 1, "step": 0,
            "members": [{"modules": [{f"p{i}": p.detach().clone() for i, p in enumerate(params)}],
                         "optimizers": [copy.deepcopy(optimizer.state_dict())], "schedulers": []}],
            "loss_sum": None, "seen": 0, "torch_rng": torch.get_rng_state(), "scaler": None}


def _merged_goes_on_as_each_alone(cls, parts: list[tuple[list[str], dict, tuple]], flags: dict) -> None:
    """Trials ``parts`` (member ids, optimizer hyperparameters, parameters not stepped) trained apart, merged in
    the given order, then stepped on the same gradients as each trial alone: every tensor stays bit-identical."""
    trials = [(ids, *_trained(cls, {**flags, **kwargs}, len(ids), seed, skip))
              for seed, (ids, kwargs, skip) in enumerate(parts)]
    merged_state = merge_states([_state(ids, params, optimizer) for ids, params, optimizer in trials])
    params = [torch.cat([t[1][i] for t in trials]).detach().requires_grad_() for i in range(len(SHAPES))]
    merged = cls(params, **flags)
    merged.load_state_dict(merged_state["members"][0]["optimizers"][0])
    g = torch.Generator().manual_seed(7)
    for _ in range(3):
        _step(params, merged, g)
        start = 0
        for ids, own, optimizer in trials:
            for p, q in zip(own, params):
                p.grad = q.grad[start:start + len(ids)].clone()
            optimizer.step()
            start += len(ids)
    for i, p in enumerate(params):
        assert torch.equal(p, torch.cat([t[1][i] for t in trials])), f"parameter {i}"
        start = 0
        for ids, own, optimizer in trials:  # where a trial alone keeps the entry (not: members without momentum)
            for key, value in optimizer.state[own[i]].items():
                assert torch.equal(merged.state[p][key][start:start + len(ids)], value), f"state[{i}].{key} of {ids}"
            start += len(ids)


SGD_CASES = {  # two trials: member ids, hyperparameters, parameters not stepped before the merge
    "without-momentum-beside-momentum": [(["a1", "a2"], dict(lr=[0.1, 0.05], momentum=0.0), ()),
                                         (["b1", "b2"], dict(lr=0.2, momentum=[0.9, 0.5], dampening=[0.1, 0.0],
                                                             weight_decay=1e-2), ())],
    "momentum-and-none-beside-none": [(["a1", "a2"], dict(lr=0.1, momentum=[0.9, 0.0], dampening=0.3), ()),
                                      (["b1"], dict(lr=0.2, momentum=0.0, dampening=0.3), ())],
    "a-parameter-not-stepped-yet": [(["a1", "a2"], dict(lr=0.1, momentum=[0.9, 0.5]), (0, 2)),
                                    (["b1", "b2"], dict(lr=0.05, momentum=[0.8, 0.0], dampening=0.3), ())],
}


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["cpu-kernel", "multi-tensor"])
@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
@pytest.mark.parametrize("case", list(SGD_CASES))
def test_sgd_trials_with_and_without_momentum_buffers_merge_exactly(case, reverse, cpu_kernel):
    parts = SGD_CASES[case][::-1] if reverse else SGD_CASES[case]
    _merged_goes_on_as_each_alone(SGD, parts, dict(lr=0.1, cpu_kernel=cpu_kernel))


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["cpu-kernel", "multi-tensor"])
@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_trials_one_of_which_has_not_stepped_a_parameter_merge_exactly(cls, amsgrad, reverse, cpu_kernel):
    parts = [(["a1", "a2"], dict(lr=[1e-2, 3e-3], betas=([0.9, 0.8], 0.99)), (1,)),
             (["b1"], dict(lr=5e-2, weight_decay=0.1), ())]
    _merged_goes_on_as_each_alone(cls, parts[::-1] if reverse else parts,
                                  dict(amsgrad=amsgrad, cpu_kernel=cpu_kernel))


def _refused(states: list[dict], match: str) -> None:
    """``merge_states`` refuses ``states`` with a ValueError matching ``match`` and leaves them as they were."""
    before = copy.deepcopy(states)
    with pytest.raises(ValueError, match=match):
        merge_states(states)
    for saved, now in zip(before, states):
        torch.testing.assert_close(now["members"], saved["members"], rtol=0, atol=0)


@pytest.mark.parametrize("reverse", [False, True], ids=["in-order", "reversed"])
def test_a_first_momentum_step_with_dampening_that_a_merge_would_change_is_refused(reverse):
    """A member with momentum and dampening whose buffer has not started (a parameter not stepped yet) would
    take an ordinary momentum step beside buffers of the others: no value of its buffer gives its first step."""
    a = _state(["a1"], *_trained(SGD, dict(lr=0.1, momentum=0.9, dampening=0.1), 1, 0, skip=(1,)))
    b = _state(["b1"], *_trained(SGD, dict(lr=0.1, momentum=0.9), 1, 1))
    _refused([b, a] if reverse else [a, b], r"merge_states: optimizer state\[1\]\.momentum_buffer is held by some "
                                            r"trials only: members with momentum \[0\.9\] and dampening \[0\.1\] "
                                            r"have no momentum buffer yet.*keep them apart")


def test_trials_whose_optimizers_group_parameters_differently_are_refused():
    params, optimizer = _params(2, 0), None
    optimizer = SGD([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                    weight_decay=1e-2)
    split = _state(["a1", "a2"], params, optimizer)
    whole = _state(["b1"], *_trained(SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2), 1, 1))
    for states in ([split, whole], [whole, split]):
        _refused(states, r"merge_states: the trials' optimizers differ in their parameter groups.*keep them apart")
    params = _params(1, 2)
    other = SGD([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}], lr=0.1, momentum=0.9,
                weight_decay=1e-2)
    _refused([split, _state(["c1"], params, other)], r"merge_states: optimizer param_groups\[0\]\.params differs")
    amsgrad = _state(["c1"], *_trained(Adam, dict(amsgrad=True), 1, 2))
    _refused([_state(["b1"], *_trained(Adam, {}, 1, 1)), amsgrad],
             r"merge_states: optimizer param_groups\[0\]\.amsgrad differs")
