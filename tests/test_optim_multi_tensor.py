"""The multi-tensor fused optimizers: bit-identical to the per-parameter loop they replace (and so to torch per
member, tests/test_optim.py), a few aten operations per step, no host reads of tensor values in steady state; on
the CPU, Adam(W) steps each member with torch's fused kernel, bit-identical to ``torch.optim.Adam(W)(fused=True)``."""
import copy

import pytest
import torch
from torch import nn

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


def _multi_tensor(cls, kwargs: dict) -> dict:
    """``kwargs`` for ``cls`` with Adam's CPU kernel off: the multi-tensor operations, as on a GPU."""
    return {**kwargs, "cpu_kernel": False} if issubclass(cls, Adam) else kwargs


@pytest.mark.parametrize("cls,kwargs", EXACT)
def test_multi_tensor_step_is_bit_identical_to_the_loop(cls, kwargs):
    model, twin = _new_and_loop(cls, _multi_tensor(cls, kwargs))
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name


def _member_values(kwargs: dict, member: int) -> dict:
    """``kwargs`` of a fused Adam(W) with member ``member``'s values (scalars kept)."""
    pick = lambda v: v[member] if isinstance(v, list) else v  # noqa: E731
    return {k: tuple(map(pick, v)) if k == "betas" else pick(v) for k, v in kwargs.items()}


@pytest.mark.parametrize("cls,kwargs", [(c, k) for c, k in EXACT if issubclass(c, Adam)])
def test_on_the_cpu_each_member_steps_exactly_as_torchs_fused_adam(cls, kwargs):
    model = _fused_cnn()
    optimizer = cls(model.parameters(), **kwargs)
    params = list(model.parameters())
    members = [[p[m].detach().clone().requires_grad_() for p in params] for m in range(MEMBERS)]
    torch_cls = torch.optim.AdamW if cls is AdamW else torch.optim.Adam
    plain = [torch_cls(ps, fused=True, **_member_values(kwargs, m)) for m, ps in enumerate(members)]
    g = torch.Generator().manual_seed(3)
    for _ in range(4):
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=g)
            for m in range(MEMBERS):
                members[m][i].grad = p.grad[m].clone()
        optimizer.step()
        for o in plain:
            o.step()
    for m in range(MEMBERS):
        for p, q in zip(params, members[m]):
            assert torch.equal(p[m], q)


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
    opts = [c(m.parameters(), lr=[0.05, 0.1, 0.2], momentum=0.9, weight_decay=1e-3)
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
    optimizer = cls(fused.parameters(), **_multi_tensor(cls, kwargs))
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
