"""``hydro.shrink(model, 1)`` (the full-size target of a surrogate run) is the user's model itself in µP: the
same parameter and buffer values (a custom initialisation and the readout's included), the same outputs in train
and eval mode, the same training under µP's (all 1) multipliers, no random draws; only the µP shapes are added."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from shrink_models import CNN, CharTransformer
from torch import Tensor, nn

import hydro
from hydro.examples import models
from hydro.shrink import Readout, mup_param_groups


def orthogonal_mlp() -> nn.Module:
    """An MLP with dropout and a custom initialisation (orthogonal weights, readout ×0.1)."""
    model = models.MLP((16, 64, 64, 10), dropout=0.2)
    for layer in model.net:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight)
    with torch.no_grad():
        model.net[-1].weight.mul_(0.1)
    return model


def images(g: torch.Generator) -> tuple[Tensor, Tensor]:
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def tokens(vocab: int, length: int, classes: int | None = None):
    def data(g: torch.Generator) -> tuple[Tensor, Tensor]:
        x = torch.randint(0, vocab, (4, length), generator=g)
        return x, torch.randint(0, classes, (4,), generator=g) if classes else torch.roll(x, -1, 1)
    return data


CASES = {  # name: (user's model, batch of (inputs, labels))
    "mlp-custom-init-dropout": (orthogonal_mlp, lambda g: (torch.randn(8, 16, generator=g),
                                                           torch.randint(0, 10, (8,), generator=g))),
    "cnn-batchnorm": (lambda: models.CNN(channels=(16, 32)), images),
    "cnn-depthwise-groupnorm": (lambda: CNN(32), images),
    "char-lm-bare-positions": (lambda: CharTransformer(64, head_dim=8), tokens(32, 16)),
    "char-lm-dropout": (lambda: models.CharTransformerLM(32, 32, nhead=4, dim_feedforward=64, max_len=16,
                                                         dropout=0.1), tokens(32, 16)),
    "transformer-classifier": (lambda: models.TransformerClassifier(), tokens(32, 12, classes=4)),
}


def loss_of(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def state(model: nn.Module) -> dict[str, Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("case", CASES)
def test_scale_one_holds_the_users_state_and_computes_the_same_function(case):
    make, data = CASES[case]
    torch.manual_seed(0)
    model = make()
    rng = torch.get_rng_state()
    target = hydro.shrink(model, 1)
    assert torch.equal(torch.get_rng_state(), rng)  # no random draws: training draws what the user's model would
    ours, theirs = state(target), state(model)
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
        assert ours[name].data_ptr() != tensor.data_ptr(), f"{name} shares the user's storage"
    for p in target.parameters():
        assert all(p.hydro_mup.multipliers(rule) == (1.0, 1.0) for rule in ("adam", "sgd"))
    assert any(p.hydro_mup.ninf == 2 for p in target.parameters())  # hidden weights carry their base shapes
    assert any(isinstance(m, Readout) for m in target.modules())
    x, _ = data(torch.Generator().manual_seed(1))
    for training in (False, True):  # eval: BatchNorm's running statistics, torch's attention fast path
        model.train(training), target.train(training)
        with torch.no_grad():
            torch.manual_seed(2)
            expected = model(x)
            torch.manual_seed(2)
            assert torch.equal(target(x), expected), f"training={training}"


@pytest.mark.parametrize("case", CASES)
def test_scale_one_trains_like_the_users_model(case):
    make, data = CASES[case]
    runs = []
    for mup in (False, True):
        torch.manual_seed(0)
        model = make()
        initial = {n: t.clone() for n, t in state(model).items()}
        if mup:
            model = hydro.shrink(model, 1)
        groups = mup_param_groups(model.parameters(), "adam", 3e-3, 0.05) if mup else model.parameters()
        optimizer = torch.optim.AdamW(groups, lr=3e-3, weight_decay=0.05)
        g = torch.Generator().manual_seed(1)
        torch.manual_seed(3)  # dropout masks
        for _ in range(3):
            x, y = data(g)
            optimizer.zero_grad()
            loss_of(model(x), y).backward()
            optimizer.step()
        runs.append(state(model))
    plain, target = runs
    assert all(not torch.equal(plain[n], t) for n, t in initial.items() if t.is_floating_point()), \
        "the steps left some tensors as they were"
    for name, tensor in plain.items():
        assert torch.equal(target[name], tensor), name


class CountingMLP(nn.Module):
    """Forward updates a buffer in place: tracing runs that code on the traced module's buffers."""

    def __init__(self):
        super().__init__()
        self.hidden, self.out = nn.Linear(16, 64), nn.Linear(64, 10)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: Tensor) -> Tensor:
        self.calls.add_(1)
        return self.out(torch.relu(self.hidden(x)))


@pytest.mark.parametrize("scale", [1, 2])
@pytest.mark.parametrize("make", [*(make for make, _ in CASES.values()), CountingMLP], ids=[*CASES, "counting-mlp"])
def test_shrink_leaves_the_users_model_alone(make, scale):
    """shrink traces and rebuilds while sharing the model's parameters instead of copying them: the model keeps its
    values and attributes, and the surrogate holds none of its storage."""
    torch.manual_seed(0)
    model = make()
    before = {name: tensor.clone() for name, tensor in state(model).items()}
    attributes = {path: set(vars(module)) for path, module in model.named_modules()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hydro.ShrinkWarning)  # widths kept at full size are not the point
        surrogate = hydro.shrink(model, scale)
    assert {path: set(vars(module)) for path, module in model.named_modules()} == attributes
    for name, tensor in state(model).items():
        assert torch.equal(tensor, before[name]), name
    storage = {t.untyped_storage().data_ptr() for t in state(model).values()}
    shared = [name for name, t in state(surrogate).items() if t.untyped_storage().data_ptr() in storage]
    assert not shared, f"{shared} share the user's storage"
