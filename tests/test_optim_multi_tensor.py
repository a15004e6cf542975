"""The multi-tensor fused optimizers: bit-identical to the per-parameter loop they replace (and so to torch per
member, tests/test_optim.py), a few aten operations per step, no host reads of tensor values in steady state; on
the CPU, each member steps with torch's fused kernel, bit-identical to ``torch.optim.SGD/Adam/AdamW(fused=True)``."""
import copy

import pytest
import torch
from torch import Tensor, nn

import hydro
from hydro.examples.models import CNN, ResNet18
from hydro.trial.host_syncs import HostSyncCounter
from hydro.optim import SGD, Adam, AdamW, clip_grad_norm_
from hydro.optim import lr_scheduler as hsched
from tests.loop_optimizers import LOOP

MEMBERS = 3


def _fused_cnn(seed: int = 0):
    """A fused CNN (conv weights [F, O, I, k, k], batch norms, a linear readout): parameters of 2 to 5 dims."""
    torch.manual_seed(seed)
    return hydro.fuse([CNN(channels=(4, 8)) for _ in range(MEMBERS)])


def _train(model, optimizer, steps: int = 6) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(5, 1, 8, 8, generator=g), torch.randint(0, 10, (5,), generator=g)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x).flatten(0, 1), y.repeat(MEMBERS), reduction="sum").backward()
        optimizer.step()


def _new_and_loop(cls, kwargs, steps: int = 6):
    model = _fused_cnn()
    twin = copy.deepcopy(model)
    _train(model, cls(model.parameters(), **kwargs), steps)
    _train(twin, LOOP[cls](twin.parameters(), **kwargs), steps)
    return model, twin


EXACT = [  # each differs per member in what it tunes
    (SGD, dict(lr=[0.1, 0.05, 0.2], momentum=[0.0, 0.9, 0.5])),  # a member without momentum
    (SGD, dict(lr=0.1, momentum=[0.9, 0.5, 0.8], dampening=[0.1, 0.0, 0.5], weight_decay=[0.0, 0.01, 0.1])),
    (SGD, dict(lr=[0.1, 0.05, 0.2], momentum=0.9, nesterov=True, weight_decay=1e-3)),
    (SGD, dict(lr=0.05, momentum=[0.9, 0.0, 0.5], maximize=True)),
    (SGD, dict(lr=0.05, weight_decay=5e-4)),
    (Adam, dict(lr=[1e-2, 3e-3, 5e-2], betas=([0.9, 0.8, 0.95], [0.999, 0.99, 0.9]), eps=[1e-8, 1e-6, 1e-7],
                weight_decay=[0.0, 1e-2, 1e-1])),
    (Adam, dict(lr=[1e-2, 3e-3, 5e-2], amsgrad=True, maximize=True)),
    (AdamW, dict(lr=[1e-2, 3e-3, 5e-2], weight_decay=[0.0, 1e-2, 1e-1])),
    (AdamW, dict(lr=1e-2, betas=([0.9, 0.8, 0.95], 0.999), weight_decay=0.05)),
]


def _multi_tensor(kwargs: dict) -> dict:
    """``kwargs`` with the CPU kernel off: the multi-tensor operations, as on a GPU."""
    return {**kwargs, "cpu_kernel": False}


@pytest.mark.parametrize("cls,kwargs", EXACT)
def test_multi_tensor_step_is_bit_identical_to_the_loop(cls, kwargs):
    model, twin = _new_and_loop(cls, _multi_tensor(kwargs))
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name


def _member_values(kwargs: dict, member: int) -> dict:
    """``kwargs`` of a fused optimizer with member ``member``'s values (scalars kept)."""
    pick = lambda v: v[member] if isinstance(v, list) else v  # noqa: E731
    return {k: tuple(map(pick, v)) if k == "betas" else pick(v) for k, v in kwargs.items()}


TORCH = {SGD: torch.optim.SGD, Adam: torch.optim.Adam, AdamW: torch.optim.AdamW}
KERNEL = EXACT + [  # beside EXACT's: plain SGD, dampening and Nesterov per member, a member without momentum
    (SGD, dict(lr=[0.1, 0.05, 0.2])),
    (SGD, dict(lr=[0.1, 0.05, 0.2], momentum=[0.9, 0.0, 0.5], dampening=[0.0, 0.3, 0.5], weight_decay=1e-2)),
    (SGD, dict(lr=0.1, momentum=[0.9, 0.5, 0.99], nesterov=True, weight_decay=[0.0, 1e-3, 1e-1], maximize=True)),
]


def _members_alone(params: list[Tensor], make) -> tuple[list[list[Tensor]], list]:
    """Each member's slices of ``params`` as its own leaf tensors, and ``make(member, tensors)`` per member."""
    members = [[p[m].detach().clone().requires_grad_() for p in params] for m in range(MEMBERS)]
    return members, [make(m, ts) for m, ts in enumerate(members)]


def _step_alike(params, optimizer, members, plain, steps: int, seed: int = 3, skip=lambda step, i: False) -> None:
    """``steps`` steps of ``optimizer`` over ``params`` and of each member's ``plain`` optimizer over its tensors,
    on the same random gradients (none for parameter ``i`` at step ``s`` where ``skip(s, i)``)."""
    g = torch.Generator().manual_seed(seed)
    for step in range(steps):
        for i, p in enumerate(params):
            grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
            p.grad = None if skip(step, i) else grad
            for m in range(len(members)):
                members[m][i].grad = None if p.grad is None else p.grad[m].clone()
        optimizer.step()
        for o in plain:
            o.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cls,kwargs", KERNEL)
def test_on_the_cpu_each_member_steps_exactly_as_torchs_fused_optimizer(cls, kwargs, dtype):
    model = _fused_cnn().to(dtype)
    params = list(model.parameters())
    optimizer = cls(params, **kwargs)
    members, plain = _members_alone(params, lambda m, ts: TORCH[cls](ts, fused=True, **_member_values(kwargs, m)))
    _step_alike(params, optimizer, members, plain, steps=5)
    for m in range(MEMBERS):
        for p, q in zip(params, members[m]):
            assert torch.equal(p[m], q)


def test_a_parameter_whose_first_gradient_comes_late_starts_its_buffer_then():
    """Torch's fused SGD starts its buffers on a group's first step; a parameter without a gradient then starts
    its own on its first step (here: as a torch parameter group of its own)."""
    model = _fused_cnn()
    params = list(model.parameters())
    kwargs = dict(lr=[0.1, 0.05, 0.2], momentum=[0.9, 0.0, 0.5], dampening=0.1)
    optimizer = SGD(params, **kwargs)
    members, plain = _members_alone(params, lambda m, ts: torch.optim.SGD(
        [{"params": [t]} for t in ts], fused=True, **_member_values(kwargs, m)))
    _step_alike(params, optimizer, members, plain, steps=4, skip=lambda step, i: step < 2 and i % 2 == 0)
    for m in range(MEMBERS):
        for p, q in zip(params, members[m]):
            assert torch.equal(p[m], q)


def _sgd_steps(model, optimizer, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


@pytest.mark.parametrize("first", [True, False], ids=["kernel-then-multi-tensor", "multi-tensor-then-kernel"])
def test_sgd_state_means_the_same_in_both_paths_and_resumes_in_the_other(first):
    """Momentum buffers (a member without momentum's too) are the same whichever path made them, up to rounding
    (the multi-tensor operations fuse some multiply-adds the kernel rounds twice); an optimizer restored from a
    checkpoint and switched to the other path goes on as one that did not switch."""
    kwargs = dict(lr=[0.1, 0.05, 0.2], momentum=[0.9, 0.0, 0.5], dampening=[0.1, 0.0, 0.0], weight_decay=1e-2,
                  maximize=True)
    start = _fused_cnn()
    models = {kernel: copy.deepcopy(start) for kernel in (True, False)}
    optimizers = {kernel: SGD(model.parameters(), **kwargs, cpu_kernel=kernel) for kernel, model in models.items()}
    for kernel, model in models.items():
        _sgd_steps(model, optimizers[kernel], 3, seed=5)
    for p, q in zip(models[True].parameters(), models[False].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(optimizers[True].state[p]["momentum_buffer"],
                                   optimizers[False].state[q]["momentum_buffer"], rtol=1e-6, atol=1e-7)
    restored = copy.deepcopy(models[first])
    optimizer = SGD(restored.parameters(), lr=1.0, cpu_kernel=first)
    optimizer.load_state_dict(copy.deepcopy(optimizers[first].state_dict()))  # (as a checkpoint: not shared)
    for group in optimizer.param_groups:
        assert group["cpu_kernel"] is first
        group["cpu_kernel"] = not first
    _sgd_steps(restored, optimizer, 3, seed=6)
    _sgd_steps(models[first], optimizers[first], 3, seed=6)
    for p, q in zip(restored.parameters(), models[first].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_sgd_members_kept_step_on_exactly_as_torchs_fused_sgd():
    """keep_members slices the kernel's state: the members kept go on as torch's fused SGD on each alone."""
    model = _fused_cnn()
    params = list(model.parameters())
    kwargs = dict(lr=[0.1, 0.05, 0.2], momentum=[0.0, 0.9, 0.5], weight_decay=[1e-2, 0.0, 1e-3])
    optimizer = SGD(params, **kwargs)
    members, plain = _members_alone(params, lambda m, ts: torch.optim.SGD(ts, fused=True, **_member_values(kwargs, m)))
    _step_alike(params, optimizer, members, plain, steps=3)
    keep = [2, 0]
    hydro.keep_members(model, keep, optimizer=optimizer)
    params = list(model.parameters())
    _step_alike(params, optimizer, [members[m] for m in keep], [plain[m] for m in keep], steps=3, seed=4)
    for position, m in enumerate(keep):
        for p, q in zip(params, members[m]):
            assert torch.equal(p[position], q)


def _train_both(models, optimizers, steps: int) -> None:
    """Train each of ``models`` (of 5 inputs) with its optimizer on the same batches."""
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        x = torch.randn(4, 5, generator=g)
        for m, o in zip(models, optimizers):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()


@pytest.mark.parametrize("cls", [Adam, AdamW])
def test_adam_with_shared_step_sizes_is_within_float_roundoff(cls):
    """Members sharing lr and beta1 (one step size): the loop multiplied by it as a host float, the multi-tensor
    step divides by it on the device (torch's capturable Adam): a few float32 ulps apart. (An MLP: a conv bias
    before a batch norm has a gradient of pure rounding noise, which Adam normalises to a full step.)"""
    torch.manual_seed(0)
    model = hydro.fuse([nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)) for _ in range(MEMBERS)])
    twin = copy.deepcopy(model)
    _train_both((model, twin), [c(m.parameters(), lr=1e-2, weight_decay=1e-2)
                                 for c, m in ((cls, model), (LOOP[cls], twin))], steps=6)
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_mup_groups_step_as_the_loop():
    """µP multipliers split the parameters into groups with their own lr/wd multipliers."""
    def build():  # (a copy of a fused model would lose its parameters' µP shapes)
        torch.manual_seed(0)
        wide = nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
        return hydro.fuse([hydro.shrink(copy.deepcopy(wide), 4) for _ in range(MEMBERS)])

    model, twin = build(), build()
    opts = [c(m.parameters(), **_multi_tensor(dict(lr=[0.05, 0.1, 0.2], momentum=0.9, weight_decay=1e-3)))
            for c, m in ((SGD, model), (LOOP[SGD], twin))]
    assert len(opts[0].param_groups) == len(opts[1].param_groups) > 1
    _train_both((model, twin), opts, steps=4)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def _resnet():
    """A fused CIFAR ResNet-18 shrunk S=8 (µP), 4 members: 62 stacked parameters in µP groups (built anew: a copy
    would lose the parameters' µP shapes)."""
    torch.manual_seed(0)
    fused = hydro.fuse([hydro.shrink(ResNet18(), 8) for _ in range(4)])
    assert len(list(fused.parameters())) == 62
    return fused


def _steady_step_counts(fused, optimizer):
    for p in fused.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.step()  # state created, values resolved
    with HostSyncCounter() as counts:
        optimizer.step()
    return counts


@pytest.mark.parametrize("cls,kwargs,limit", [
    (SGD, dict(lr=[0.1, 0.2, 0.05, 0.01], momentum=0.9, weight_decay=5e-4), 40),
    (SGD, dict(lr=[0.1, 0.2, 0.05, 0.01], momentum=[0.9, 0.0, 0.5, 0.9], nesterov=False), 40),
    (AdamW, dict(lr=[1e-3, 2e-3, 3e-3, 4e-3], weight_decay=1e-2), 60),
    (Adam, dict(lr=1e-3, betas=([0.9, 0.8, 0.9, 0.85], 0.999), amsgrad=True), 60),
])
def test_one_step_over_a_resnet18_dispatches_a_few_operations(cls, kwargs, limit):
    fused = _resnet()
    optimizer = cls(fused.parameters(), **_multi_tensor(kwargs))
    assert len(optimizer.param_groups) > 1  # µP's
    new = _steady_step_counts(fused, optimizer)
    old = _steady_step_counts(fused, LOOP[cls](fused.parameters(), **kwargs))
    assert new.total <= limit, new.ops
    assert new.reads == 0
    assert old.total > 5 * limit  # the per-parameter loop it replaces


@pytest.mark.parametrize("cls,kwargs", [(SGD, dict(lr=[0.1, 0.2, 0.05, 0.01], momentum=0.9)),
                                        (AdamW, dict(lr=[1e-3, 2e-3, 3e-3, 4e-3])),
                                        (AdamW, dict(lr=1e-3))])
def test_a_training_step_with_a_per_step_schedule_and_clipping_reads_almost_nothing(cls, kwargs):
    """Steady state: a warm-up + cosine schedule stepped every batch and per-member gradient clipping."""
    fused = _resnet()
    optimizer = cls(fused.parameters(), **kwargs)
    schedule = hsched.SequentialLR(optimizer, [hsched.LinearLR(optimizer, start_factor=0.1, total_iters=2),
                                               hsched.CosineAnnealingLR(optimizer, T_max=[10, 20, 30, 40])], [2])
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 2])

    def step():
        optimizer.zero_grad()
        nn.functional.cross_entropy(fused(x).flatten(0, 1), y.repeat(4)).backward()
        clip_grad_norm_(fused.parameters(), max_norm=[1.0, 1.0, 0.5, 2.0])
        optimizer.step()
        schedule.step()

    step()
    step()
    with HostSyncCounter() as counts:
        step()
    assert counts.reads <= 10, counts.reads
