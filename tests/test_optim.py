"""hydro.optim: each member follows exactly the update of the torch optimizer/scheduler it would get alone."""
import copy

import pytest
import torch
from torch import nn

import hydro
from hydro.optim import SGD, Adam, AdamW, clip_grad_norm_
from hydro.optim import lr_scheduler as hsched

MEMBERS = 3


def _fused_and_refs(seed=0):
    torch.manual_seed(seed)
    refs = [nn.Linear(5, 4) for _ in range(MEMBERS)]
    return hydro.fuse([copy.deepcopy(r) for r in refs]), refs


def _run(fused, refs, fused_opt, ref_opts, steps=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(6, 5, generator=g)
        fused_opt.zero_grad()
        (fused(x) ** 2).mean(dim=(1, 2)).sum().backward()
        fused_opt.step()
        for ref, opt in zip(refs, ref_opts):
            opt.zero_grad()
            (ref(x) ** 2).mean().backward()
            opt.step()
    for i, ref in enumerate(refs):
        torch.testing.assert_close(fused.weight[i], ref.weight, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(fused.bias[i], ref.bias, rtol=1e-5, atol=1e-7)


SGD_VARIANTS = [
    dict(lr=[0.1, 0.05, 0.2], momentum=[0.0, 0.9, 0.5]),
    dict(lr=0.1, momentum=[0.9, 0.5, 0.8], dampening=[0.1, 0.0, 0.5], weight_decay=[0.0, 0.01, 0.1]),
    dict(lr=[0.1, 0.05, 0.2], momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(lr=0.05, momentum=[0.9, 0.0, 0.5], maximize=True),
]


@pytest.mark.parametrize("kwargs", SGD_VARIANTS)
def test_sgd_matches_torch_per_member(kwargs):
    fused, refs = _fused_and_refs()
    per = lambda k, i: kwargs[k][i] if isinstance(kwargs[k], list) else kwargs[k]  # noqa: E731
    ref_opts = [torch.optim.SGD(r.parameters(), **{k: per(k, i) for k in kwargs}) for i, r in enumerate(refs)]
    _run(fused, refs, SGD(fused.parameters(), **kwargs), ref_opts)


@pytest.mark.parametrize("cls,torch_cls,amsgrad", [(Adam, torch.optim.Adam, False), (Adam, torch.optim.Adam, True),
                                                   (AdamW, torch.optim.AdamW, False)])
def test_adam_matches_torch_per_member(cls, torch_cls, amsgrad):
    fused, refs = _fused_and_refs()
    lrs, b1, b2, eps, wd = [1e-2, 3e-3, 5e-2], [0.9, 0.8, 0.95], [0.999, 0.99, 0.9], [1e-8, 1e-6, 1e-7], [0.0, 1e-2, 1e-1]
    ref_opts = [torch_cls(r.parameters(), lr=lrs[i], betas=(b1[i], b2[i]), eps=eps[i], weight_decay=wd[i],
                          amsgrad=amsgrad) for i, r in enumerate(refs)]
    _run(fused, refs, cls(fused.parameters(), lr=lrs, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=amsgrad),
         ref_opts)


def test_lr_and_wd_multipliers_of_parameter_groups():
    fused, refs = _fused_and_refs()
    opt = SGD([{"params": [fused.weight], "lr_mult": 0.5, "wd_mult": 2.0}, {"params": [fused.bias]}],
              lr=[0.1, 0.2, 0.3], weight_decay=0.01)
    ref_opts = [torch.optim.SGD([{"params": [r.weight], "lr": lr * 0.5, "weight_decay": 0.02},
                                 {"params": [r.bias], "lr": lr, "weight_decay": 0.01}])
                for r, lr in zip(refs, (0.1, 0.2, 0.3))]
    _run(fused, refs, opt, ref_opts)


def _torch_scheduler(name, opt, i):
    return {
        "step": lambda: torch.optim.lr_scheduler.StepLR(opt, 3, gamma=[0.5, 0.1, 0.9][i]),
        "multistep": lambda: torch.optim.lr_scheduler.MultiStepLR(opt, [2, 5, 9], gamma=[0.5, 0.1, 0.9][i]),
        "exponential": lambda: torch.optim.lr_scheduler.ExponentialLR(opt, gamma=[0.95, 0.9, 0.8][i]),
        "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=[10, 5, 20][i],
                                                                     eta_min=[0.0, 1e-3, 1e-2][i]),
        "linear": lambda: torch.optim.lr_scheduler.LinearLR(opt, start_factor=[0.1, 0.5, 0.25][i], total_iters=4),
        "warmup-cosine": lambda: torch.optim.lr_scheduler.SequentialLR(
            opt, [torch.optim.lr_scheduler.LinearLR(opt, start_factor=[0.1, 0.5, 0.25][i], total_iters=3),
                  torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=[10, 5, 20][i])], milestones=[3]),
    }[name]()


def _hydro_scheduler(name, opt):
    return {
        "step": lambda: hsched.StepLR(opt, 3, gamma=[0.5, 0.1, 0.9]),
        "multistep": lambda: hsched.MultiStepLR(opt, [2, 5, 9], gamma=[0.5, 0.1, 0.9]),
        "exponential": lambda: hsched.ExponentialLR(opt, gamma=[0.95, 0.9, 0.8]),
        "cosine": lambda: hsched.CosineAnnealingLR(opt, T_max=[10, 5, 20], eta_min=[0.0, 1e-3, 1e-2]),
        "linear": lambda: hsched.LinearLR(opt, start_factor=[0.1, 0.5, 0.25], total_iters=4),
        "warmup-cosine": lambda: hsched.SequentialLR(
            opt, [hsched.LinearLR(opt, start_factor=[0.1, 0.5, 0.25], total_iters=3),
                  hsched.CosineAnnealingLR(opt, T_max=[10, 5, 20])], milestones=[3]),
    }[name]()


@pytest.mark.parametrize("name", ["step", "multistep", "exponential", "cosine", "linear", "warmup-cosine"])
def test_schedulers_match_torch_per_member(name):
    lrs = [0.1, 0.2, 0.05]
    fused, refs = _fused_and_refs()
    opt = SGD(fused.parameters(), lr=lrs)
    sched = _hydro_scheduler(name, opt)
    ref_opts = [torch.optim.SGD(r.parameters(), lr=lr) for r, lr in zip(refs, lrs)]
    ref_scheds = [_torch_scheduler(name, o, i) for i, o in enumerate(ref_opts)]
    for _ in range(25):
        expected = torch.tensor([o.param_groups[0]["lr"] for o in ref_opts], dtype=torch.float64)
        torch.testing.assert_close(opt.param_groups[0]["lr"], expected, rtol=1e-6, atol=1e-12)
        assert sched.get_last_lr()[0] is opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
        for o, s in zip(ref_opts, ref_scheds):
            o.step()
            s.step()


def test_clip_grad_norm_per_member_matches_torch():
    fused, refs = _fused_and_refs()
    x = torch.randn(6, 5)
    (fused(x) ** 2).mean(dim=(1, 2)).mul(torch.tensor([1.0, 100.0, 0.01])).sum().backward()
    norms = clip_grad_norm_(fused.parameters(), max_norm=[1.0, 1.0, 5.0])
    for i, (ref, scale, limit) in enumerate(zip(refs, (1.0, 100.0, 0.01), (1.0, 1.0, 5.0))):
        ((ref(x) ** 2).mean() * scale).backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), limit)
        torch.testing.assert_close(norms[i], ref_norm)
        torch.testing.assert_close(fused.weight.grad[i], ref.weight.grad)
        torch.testing.assert_close(fused.bias.grad[i], ref.bias.grad)


def test_clip_grad_norm_of_a_plain_model_is_torchs():
    """Plain (unfused) parameters are one member, as for the optimizers: the same clipping as torch's."""
    model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    ref = copy.deepcopy(model)
    x = torch.randn(6, 5)
    for m in (model, ref):
        (m(x) ** 2).sum().mul(100.0).backward()
    norm = clip_grad_norm_(model.parameters(), max_norm=0.5)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    torch.testing.assert_close(norm, ref_norm.reshape(1))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_optimizer_state_dict_round_trip_resumes_identically(tmp_path):
    fused, _ = _fused_and_refs()
    twin = copy.deepcopy(fused)
    opt = Adam(fused.parameters(), lr=[1e-2, 2e-2, 3e-2], betas=([0.9, 0.8, 0.7], 0.99))
    x = torch.randn(6, 5)
    for _ in range(3):
        opt.zero_grad(); fused(x).pow(2).sum().backward(); opt.step()  # noqa: E702
    torch.save({"model": fused.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "checkpoint.pt")
    checkpoint = torch.load(tmp_path / "checkpoint.pt")
    twin.load_state_dict(checkpoint["model"])
    twin_opt = Adam(twin.parameters(), lr=1.0)
    twin_opt.load_state_dict(checkpoint["optimizer"])
    for model, o in ((fused, opt), (twin, twin_opt)):
        for _ in range(3):
            o.zero_grad(); model(x).pow(2).sum().backward(); o.step()  # noqa: E702
    assert torch.equal(fused.weight, twin.weight)


def test_a_copied_model_and_optimizer_train_on_identically():
    """deepcopy of (model, optimizer) keeps the member count and per-member state (torch's Optimizer copies
    only defaults, state and param_groups)."""
    fused, _ = _fused_and_refs()
    opt = Adam(fused.parameters(), lr=[1e-2, 2e-2, 3e-2], betas=([0.9, 0.8, 0.7], 0.99))
    x = torch.randn(6, 5)
    opt.zero_grad(); fused(x).pow(2).sum().backward(); opt.step()  # noqa: E702
    twin, twin_opt = copy.deepcopy((fused, opt))
    assert twin_opt.num_members == 3
    for model, o in ((fused, opt), (twin, twin_opt)):
        for _ in range(3):
            o.zero_grad(); model(x).pow(2).sum().backward(); o.step()  # noqa: E702
    assert torch.equal(fused.weight, twin.weight) and torch.equal(fused.bias, twin.bias)


def test_bad_hyperparameters_are_refused_clearly():
    fused, _ = _fused_and_refs()
    with pytest.raises(ValueError, match="'lr' needs a scalar or 3 values"):
        SGD(fused.parameters(), lr=[0.1, 0.2])
    with pytest.raises(ValueError, match="Nesterov momentum requires momentum > 0"):
        SGD(fused.parameters(), lr=0.1, momentum=[0.9, 0.0, 0.9], nesterov=True)
    with pytest.raises(ValueError, match=r"beta1 must be in \[0, 1\)"):
        Adam(fused.parameters(), betas=([0.9, 1.0, 0.9], 0.99))
    with pytest.raises(ValueError, match=r"SGD: hyperparameter 'lr' needs a scalar or 1 values.*not fused"):
        SGD([nn.Parameter(torch.zeros(3, 2)), nn.Parameter(torch.zeros(4, 2))], lr=[0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match=r"SGD: hyperparameter 'lr' has one value per member.*not fused"):
        SGD([{"params": fused.parameters(), "lr": [0.1, 0.2, 0.3]}, {"params": [nn.Parameter(torch.zeros(2, 2))]}])
    with pytest.raises(TypeError, match="needs a hydro.optim optimizer"):
        hsched.StepLR(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1), 3)


def _assert_steps_equal(model, opt, ref, ref_opt, steps: int, rtol: float = 1e-6, atol: float = 1e-7) -> None:
    """``model`` with ``opt`` and ``ref`` with ``ref_opt`` trained on the same batches end with equal parameters."""
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(4, 5, generator=g)
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            o.step()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=name)


def _plain_mlp():
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


@pytest.mark.parametrize("make,ref_make,kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-3, nesterov=True)),
    (Adam, torch.optim.Adam, dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=1e-2)),
    (AdamW, torch.optim.AdamW, dict(lr=1e-2, amsgrad=True)),
])
@pytest.mark.parametrize("model_fn", [_plain_mlp, lambda: nn.Linear(5, 5)], ids=["mlp", "square-linear"])
def test_plain_unfused_parameters_are_one_member_and_step_like_torch(make, ref_make, kwargs, model_fn):
    """hydro.optim on an unfused model (F = 1) equals torch.optim on it, with param groups as torch has them;
    a square Linear (all leading sizes equal, read as fused) steps identically too."""
    torch.manual_seed(0)
    model = model_fn()
    ref = copy.deepcopy(model)
    params = list(model.parameters())
    groups = [{"params": params[:1]}, {"params": params[1:], "lr": kwargs["lr"] / 2}]
    ref_params = list(ref.parameters())
    opt = make(groups, **kwargs)
    ref_opt = ref_make([{"params": ref_params[:1]}, {"params": ref_params[1:], "lr": kwargs["lr"] / 2}], **kwargs)
    _assert_steps_equal(model, opt, ref, ref_opt, steps=6)
    if model_fn is _plain_mlp:
        assert opt.num_members == 1


@pytest.mark.parametrize("make,ref_make,rule", [(SGD, torch.optim.SGD, "sgd"), (AdamW, torch.optim.AdamW, "adam")])
def test_plain_shrunk_model_gets_the_mup_multipliers(make, ref_make, rule):
    """hydro.optim on one unfused µP surrogate = torch.optim with mup_param_groups (the README's "fused or not").
    AdamW divides by its step size on the device (as torch's capturable Adam) where torch multiplies by a host
    float: a few float32 ulps apart per step."""
    torch.manual_seed(0)
    model = hydro.shrink(nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)), 4)
    ref = copy.deepcopy(model)
    opt = make(model.parameters(), lr=0.05, weight_decay=0.01)
    ref_opt = ref_make(hydro.shrink.mup_param_groups(ref.parameters(), rule, lr=0.05, weight_decay=0.01))
    assert len(opt.param_groups) > 1 and opt.num_members == 1  # split by µP multipliers
    _assert_steps_equal(model, opt, ref, ref_opt, steps=5, **({} if rule == "sgd" else dict(rtol=1e-5, atol=1e-6)))
