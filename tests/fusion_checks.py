"""``assert_fused_equals_alone``: a fused model equals its members trained alone, in train and eval mode,
and fusing leaves the members as they were."""
from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import Tensor, nn

import hydro
from hydro.optim import SGD


def _snapshot(model: nn.Module) -> tuple[dict[str, Tensor], list[bool]]:
    return copy.deepcopy(model.state_dict()), [m.training for m in model.modules()]


def _assert_close_state(actual: dict[str, Tensor], expected: dict[str, Tensor], what: str) -> None:
    assert actual.keys() == expected.keys(), what
    for name, tensor in actual.items():
        torch.testing.assert_close(tensor, expected[name], rtol=1e-5, atol=1e-6, msg=f"{what}: {name}")


def assert_fused_equals_alone(make_model: Callable[[], nn.Module],
                              make_batch: Callable[[int], tuple[Tensor, Tensor]], *, members: int = 3,
                              steps: int = 3, random: bool = False,
                              loss_fn: Callable = nn.MSELoss()) -> hydro.FusedModel:
    """Fuse ``members`` models from ``make_model`` and check, on ``make_batch(step)`` batches:

    - train mode: each member's output, loss and state (weights and buffers) after every SGD step equal
      the member trained alone with ``torch.optim.SGD`` (members get different learning rates). With
      ``random=True`` (dropout) train outputs cannot match; the fused model trains and the alone copies
      take its weights, so the eval checks below still compare like with like;
    - eval mode: two calls' outputs equal the members' alone (bitwise equal to each other where alone they
      are: deterministic), and state updates made in eval (e.g. counters) equal; then train mode matches
      again (the graphs switch back);
    - the user's models: state_dict and every module's training flag unchanged, and still usable.
    Returns the fused model.
    """
    torch.manual_seed(0)
    models = [make_model() for _ in range(members)]
    before = [_snapshot(m) for m in models]
    fused = hydro.fuse(models)
    alone = [copy.deepcopy(m) for m in models]
    lrs = [0.01 * (i + 1) for i in range(members)]
    fused_opt = SGD(fused.parameters(), lr=lrs)
    alone_opts = [torch.optim.SGD(m.parameters(), lr=lr) for m, lr in zip(alone, lrs)]

    def train_step(step: int) -> None:
        x, y = make_batch(step)
        fused.train()
        fused_opt.zero_grad()
        out = fused(x)
        hydro.trial_losses(loss_fn, out, y).sum().backward()
        fused_opt.step()
        if random:
            for member, ref in zip(hydro.unfuse(fused), alone):
                ref.load_state_dict(member.state_dict())
            return
        for i, (model, opt) in enumerate(zip(alone, alone_opts)):
            model.train()
            opt.zero_grad()
            ref_out = model(x)
            torch.testing.assert_close(out[i], ref_out, rtol=1e-5, atol=1e-6, msg=f"train output, member {i}")
            loss_fn(ref_out, y).backward()
            opt.step()
        for i, (member, ref) in enumerate(zip(hydro.unfuse(fused), alone)):
            _assert_close_state(member.state_dict(), ref.state_dict(), f"train state, member {i}")

    for step in range(steps):
        train_step(step)
    x, _ = make_batch(steps)
    fused.eval()
    with torch.no_grad():
        first, second = fused(x), fused(x)
        for i, model in enumerate(alone):
            model.eval()
            ref_first, ref_second = model(x), model(x)  # twice, like the fused model
            torch.testing.assert_close(first[i], ref_first, rtol=1e-5, atol=1e-6, msg=f"eval output, member {i}")
            torch.testing.assert_close(second[i], ref_second, rtol=1e-5, atol=1e-6, msg=f"eval output, member {i}")
            if torch.equal(ref_first, ref_second):
                assert torch.equal(first[i], second[i]), f"fused eval is not deterministic (member {i})"
    for i, (member, ref) in enumerate(zip(hydro.unfuse(fused), alone)):
        _assert_close_state(member.state_dict(), ref.state_dict(), f"eval state, member {i}")
    train_step(steps + 1)
    for model, (state, flags) in zip(models, before):
        _assert_close_state(model.state_dict(), state, "the user's model after fusing")
        assert [m.training for m in model.modules()] == flags, "fusing changed the user's training flags"
        model(make_batch(0)[0])  # still usable
    return fused
