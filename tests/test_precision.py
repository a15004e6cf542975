"""TuneSpec.precision: bf16 fused members train like bf16 members trained alone; fp16's loss scale is per
member, so an overflow in one member skips only that member's step."""
from __future__ import annotations

import pytest
import torch

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec

MEMBERS = [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.03, "momentum": 0.9})]
BF16_ULP = 2.0 ** -8  # bfloat16's relative rounding step (8 significand bits)


def member_weights(trial: FusedTrial) -> list[torch.Tensor]:
    """Each parameter as ``[F, ...]``: the fused model's own, or the looped models' stacked."""
    if trial.fused:
        return [p.detach().clone() for p in trial.members.model.parameters()]
    return [torch.stack(ps).detach() for ps in zip(*(m.parameters() for m in trial.members.models))]


def trained(kind: TrialKind, precision: str, epochs: int = 2) -> FusedTrial:
    trial = FusedTrial(spec(precision=precision), TrialPlan(kind, MEMBERS), small_digits())
    for _ in range(epochs):
        trial.run_epoch()
    return trial


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_bf16_fused_members_train_like_bf16_members_alone():
    """Tolerance: one bf16 rounding step of the largest weight (2^-8 relative). bf16 itself moves the weights
    further than that from fp32 (checked), so the bound is tighter than the precision's own effect."""
    fused, alone = (member_weights(trained(k, "bf16")) for k in (TrialKind.SURROGATE, TrialKind.PLAIN))
    fp32 = member_weights(trained(TrialKind.PLAIN, "fp32"))
    for f, a in zip(fused, alone):
        assert relative_gap(f, a) <= BF16_ULP
    assert max(relative_gap(a, w) for a, w in zip(alone, fp32)) > 2 * BF16_ULP


def test_bad_precision_names_the_choices():
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'bf16', 'fp16'\], got 'fp8'"):
        spec(precision="fp8")


@pytest.mark.parametrize("kind", [TrialKind.SURROGATE, TrialKind.PLAIN])
def test_fp16_overflow_in_one_member_skips_only_its_step(kind):
    clean, injected = (FusedTrial(spec(precision="fp16"), TrialPlan(kind, MEMBERS), small_digits()) for _ in range(2))
    for trial in (clean, injected):
        trial.train_step()  # momentum buffers exist from here on
    before = member_weights(injected)
    momentum = [s["momentum_buffer"].clone() for o in injected.members.optimizers() for s in o.state.values()]
    injected.scaler.scale[1] = 2.0 ** 40  # member b's scaled gradients overflow float16 (max 65504)
    for trial in (clean, injected):
        trial.train_step()
    after, reference = member_weights(injected), member_weights(clean)
    for b, a, r in zip(before, after, reference):
        assert torch.equal(a[1], b[1])  # b skipped its step: weights untouched
        assert torch.equal(a[0], r[0]) and not torch.equal(a[0], b[0])  # a stepped exactly as without b's overflow
    buffers = [s["momentum_buffer"] for o in injected.members.optimizers() for s in o.state.values()]
    if kind is TrialKind.SURROGATE:  # fused state [F, ...]; looped: member b's optimizer did not step at all
        assert all(torch.equal(n[1], m[1]) for n, m in zip(buffers, momentum))
    else:
        assert all(torch.equal(n, m) for n, m in zip(buffers[len(buffers) // 2:], momentum[len(momentum) // 2:]))
    assert injected.scaler.scale.tolist() == [2.0 ** 16, 2.0 ** 39]  # only b backed off
    assert torch.isfinite(injected.evaluate()["val_loss"]).all()


def adam(params, config):
    return torch.optim.Adam(params, lr=config["lr"] / 10, betas=(config["momentum"], 0.999))


@pytest.mark.parametrize("overflow_at", [0, 1])
def test_fp16_skipped_adam_step_counts_for_that_member_only_as_torch_skips_it(overflow_at):
    """A member whose step is skipped (fp16 overflow, also on the very first step, where torch's GradScaler skips
    before any optimizer state exists) keeps its Adam step count and moments: fused members then train on like
    members alone, whose own optimizer did not step at all."""
    trials = [FusedTrial(spec(precision="fp16", optimizer=adam), TrialPlan(kind, MEMBERS), small_digits())
              for kind in (TrialKind.SURROGATE, TrialKind.PLAIN)]
    for step in range(4):
        for trial in trials:
            if step == overflow_at:
                trial.scaler.scale[1] = 2.0 ** 40  # member b's scaled gradients overflow float16
            if step == overflow_at + 1:
                trial.scaler.scale[1] = 2.0 ** 15  # and fit again: b steps on from here
            trial.train_step()
    fused, alone = (member_weights(t) for t in trials)
    for f, a in zip(fused, alone):
        assert relative_gap(f, a) < 1e-5


def test_compiled_fused_model_trains_like_the_eager_one():
    eager, compiled = (FusedTrial(spec(compile=c), TrialPlan(TrialKind.SURROGATE, MEMBERS), small_digits())
                       for c in (False, True))
    assert compiled.members.forward is not compiled.members.model  # torch.compile's wrapper runs the steps
    want, got = eager.run_epoch(), compiled.run_epoch()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
