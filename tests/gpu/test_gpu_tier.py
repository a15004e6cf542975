"""The GPU code paths run on a GPU: fused = members alone (fp32 as on the CPU; bf16 within bf16's rounding), the
fused optimizers = torch's per member, a real out-of-memory split, the Dataset path with pinned memory, checkpoints
with the CUDA RNG state, loss modules holding tensors, and no host synchronisation in a steady-state step."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import hydro
from hydro.examples.data import SyntheticImages
from hydro.optim import SGD, Adam, AdamW
from hydro.trial.memory import MemoryBudget
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.fusion_checks import assert_fused_equals_alone
from tests.tune.workload import small_digits, spec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda", 0)
CONFIGS = [(f"m{i}", {"lr": 0.02 * (i + 1), "momentum": 0.9 if i % 2 else 0.0}) for i in range(4)]
BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-2  # see test_fused_equals_members_alone_in_bf16


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).to(CUDA)


def images(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 3, 8, 8, generator=g).to(CUDA), torch.randn(16, 10, generator=g).to(CUDA)


def mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 10)).to(CUDA)


def vectors(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 12, generator=g).to(CUDA), torch.randn(16, 10, generator=g).to(CUDA)


@pytest.mark.parametrize("make_model, make_batch", [(cnn, images), (mlp, vectors)])
def test_fused_equals_members_alone_in_fp32(fp32_exact, make_model, make_batch):
    fused = assert_fused_equals_alone(make_model, make_batch, members=4)
    assert next(fused.parameters()).device == CUDA


@pytest.mark.parametrize("make_model, make_batch", [(cnn, images), (mlp, vectors)])
def test_fused_equals_members_alone_in_bf16(make_model, make_batch):
    """Under bf16 autocast fused (one grouped convolution / batched GEMM) and alone (one per member) compute the
    same products with different kernels, each rounding to bf16 (8 significant bits, a relative step of 2^-8 =
    0.4%) at every layer: outputs agree within torch.testing's default bf16 tolerance (rtol 1.6e-2, about 4 bf16
    steps), with atol 1e-2 for outputs near 0. fp32 parameters stay within the same bounds after SGD steps."""
    torch.manual_seed(0)
    models = [make_model() for _ in range(4)]
    fused = hydro.fuse(models)
    alone = [copy.deepcopy(m) for m in models]
    lrs = [0.01 * (i + 1) for i in range(4)]
    fused_opt = SGD(fused.parameters(), lr=lrs)
    alone_opts = [torch.optim.SGD(m.parameters(), lr=lr) for m, lr in zip(alone, lrs)]
    for step in range(3):
        x, y = make_batch(step)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fused(x)
            refs = [m(x) for m in alone]
            losses = hydro.trial_losses(nn.MSELoss(), out, y)
            ref_losses = [nn.functional.mse_loss(r, y) for r in refs]
        for got, want in zip(out, refs):
            torch.testing.assert_close(got.float(), want.float(), rtol=BF16_RTOL, atol=BF16_ATOL)
        torch.testing.assert_close(losses.float(), torch.stack(ref_losses).float(), rtol=BF16_RTOL, atol=BF16_ATOL)
        fused_opt.zero_grad()
        losses.sum().backward()
        fused_opt.step()
        for loss, opt in zip(ref_losses, alone_opts):
            opt.zero_grad()
            loss.backward()
            opt.step()
    for i, member in enumerate(hydro.unfuse(fused)):
        for (name, got), want in zip(member.state_dict().items(), alone[i].state_dict().values()):
            if got.is_floating_point():
                torch.testing.assert_close(got, want, rtol=BF16_RTOL, atol=BF16_ATOL, msg=name)


@pytest.mark.parametrize("hydro_cls, torch_cls, kwargs", [
    (SGD, torch.optim.SGD, dict(lr=[0.1, 0.05, 0.2], momentum=[0.0, 0.9, 0.5], weight_decay=[0.0, 1e-2, 1e-1])),
    (Adam, torch.optim.Adam, dict(lr=[1e-2, 3e-3, 5e-2], weight_decay=[0.0, 1e-2, 1e-1])),
    (AdamW, torch.optim.AdamW, dict(lr=[1e-2, 3e-3, 5e-2], weight_decay=[0.0, 1e-2, 1e-1])),
])
def test_optimizers_step_each_member_as_torch_does(fp32_exact, hydro_cls, torch_cls, kwargs):
    torch.manual_seed(0)
    refs = [nn.Linear(16, 8).to(CUDA) for _ in range(3)]
    fused = hydro.fuse([copy.deepcopy(r) for r in refs])
    fused_opt = hydro_cls(fused.parameters(), **kwargs)
    ref_opts = [torch_cls(r.parameters(), **{k: v[i] for k, v in kwargs.items()}) for i, r in enumerate(refs)]
    g = torch.Generator().manual_seed(1)
    optimizers = [fused_opt, *ref_opts]
    for _ in range(6):
        x = torch.randn(32, 16, generator=g).to(CUDA)
        for opt in optimizers:
            opt.zero_grad()
        # the fused model's and the references' graphs are disjoint: one backward gives each its own gradient
        total = (fused(x) ** 2).mean(dim=(1, 2)).sum() + sum((ref(x) ** 2).mean() for ref in refs)
        total.backward()
        for opt in optimizers:
            opt.step()
    for i, ref in enumerate(refs):
        for got, want in ((fused.weight[i], ref.weight), (fused.bias[i], ref.bias)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def wide_mlp(config):
    return nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))


def wide_data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8192, 64, generator=g), torch.randint(0, 10, (8192,), generator=g)
    return (x, y), (x[:1024], y[:1024])


def test_a_real_out_of_memory_splits_the_members_and_the_trial_finishes(fp32_exact):
    """The allocator's limit (``set_per_process_memory_fraction``, set by the trial's memory budget) below what
    8 fused members need: the unit catches the real CUDA out-of-memory error, splits (copying in host memory,
    so the card never holds the members twice), and trains every member every batch as the unsplit trial does."""
    workload = dict(model=wide_mlp, data=wide_data, batch_size=4096)
    plan = TrialPlan(TrialKind.SURROGATE, [(f"m{i}", {"lr": 0.01, "momentum": 0.9}) for i in range(8)])
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(CUDA)
    whole = FusedTrial(spec(**workload), plan, wide_data(), device=CUDA)
    expected = whole.run_epoch()
    peak, resident = torch.cuda.max_memory_allocated(CUDA), torch.cuda.memory_allocated(CUDA)
    del whole
    torch.cuda.empty_cache()
    budget = int(resident + 0.6 * (peak - resident))  # the members' state fits; 8 members' activations do not
    try:
        split = FusedTrial(spec(**workload, memory_budget_bytes=budget), plan, wide_data(), device=CUDA)
        got = split.run_epoch()
        assert len(split.chunks) >= 2 and split.member_ids == [m for m, _ in plan.members]
    finally:
        MemoryBudget(None, CUDA)  # the process's fraction back as it was
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_the_dataset_path_with_pinned_memory_trains_as_on_the_cpu(fp32_exact):
    def data():
        return SyntheticImages(256, size=8, seed=0), SyntheticImages(64, size=8, seed=0, first=256)

    def conv(config):
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(8, 10))

    runs = {}
    for device in ("cpu", CUDA):
        trial = FusedTrial(spec(model=conv, data=data, metrics={}, metric="val_loss", mode="min"),
                           TrialPlan(TrialKind.SURROGATE, CONFIGS), data(), device=device)
        runs[str(device)] = trial.run_epoch()
    for name, want in runs["cpu"].items():
        torch.testing.assert_close(runs[str(CUDA)][name].cpu(), want, rtol=1e-4, atol=1e-5)


def dropout_mlp(config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 10))


def test_a_checkpoint_continues_with_the_cuda_rng_state():
    """Dropout draws from the CUDA generator: a trial restored from a checkpoint after step 2 draws what the
    original drew in steps 3 and 4, bitwise."""
    plan = TrialPlan(TrialKind.SURROGATE, CONFIGS)
    trial = FusedTrial(spec(model=dropout_mlp), plan, small_digits(), device=CUDA)
    for _ in range(2):
        trial.train_step()
    state = copy.deepcopy(trial.state_dict())
    assert state["cuda_rng"] is not None
    original = [trial.train_step() for _ in range(2)]
    torch.cuda.manual_seed(12345)  # another process's generator state
    restored = FusedTrial(spec(model=dropout_mlp), plan, small_digits(), device=CUDA)
    restored.load_state_dict(state)
    again = [restored.train_step() for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(original, again))


@pytest.mark.parametrize("loss", [nn.CrossEntropyLoss(weight=torch.linspace(0.5, 1.5, 10)),
                                  nn.CrossEntropyLoss(weight=torch.ones(10), ignore_index=3)])
def test_loss_modules_holding_tensors_train_on_the_gpu(loss):
    trial = FusedTrial(spec(loss=loss), TrialPlan(TrialKind.SURROGATE, CONFIGS), small_digits(), device=CUDA)
    metrics = trial.run_epoch()
    assert all(t.device == CUDA and torch.isfinite(t).all() for t in metrics.values())
    assert loss.weight.device.type == "cpu"


def test_bce_with_pos_weight_trains_on_the_gpu():
    def data():
        (x, y), (vx, vy) = small_digits()
        return (x, nn.functional.one_hot(y, 10).float()), (vx, nn.functional.one_hot(vy, 10).float())

    loss = nn.BCEWithLogitsLoss(pos_weight=torch.full((10,), 3.0))
    trial = FusedTrial(spec(loss=loss, data=data, metrics={}, metric="val_loss", mode="min"),
                       TrialPlan(TrialKind.SURROGATE, CONFIGS), data(), device=CUDA)
    assert torch.isfinite(trial.run_epoch()["val_loss"]).all()


def batchnorm_mlp(config):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.BatchNorm1d(32, momentum=None), nn.ReLU(),
                         nn.Linear(32, 10))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_steady_state_step_never_synchronises_with_the_host(precision, optimizer):
    """``set_sync_debug_mode("error")`` raises on any synchronising CUDA call (a scalar read, a blocking copy, a
    data-dependent shape) in steady-state training steps: the batch index, the fp16 loss scale and skipped steps,
    BatchNorm's cumulative average, the fused optimizer."""
    factory = {"sgd": lambda params, config: torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"]),
               "adamw": lambda params, config: torch.optim.AdamW(params, lr=config["lr"])}[optimizer]
    trial = FusedTrial(spec(model=batchnorm_mlp, precision=precision, optimizer=factory),
                       TrialPlan(TrialKind.SURROGATE, CONFIGS), small_digits(), device=CUDA)
    for _ in range(3):
        trial.train_step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            losses = trial.train_step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert losses.device == CUDA and torch.isfinite(losses).all()
