"""hydro.fuse with layers that read ``self.training`` or have buffers: fused equals alone in both modes, the
members stay untouched, and state changes that cannot be kept per member are refused."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hydro

from fusion_checks import assert_fused_equals_alone


def _vectors(step: int, batch: int = 6, width: int = 8):
    g = torch.Generator().manual_seed(step)
    return torch.randn(batch, width, generator=g), torch.randn(batch, 2, generator=g)


def _images(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 3, 6, 6, generator=g), torch.randn(4, 2, generator=g)


class TrainingBranch(nn.Module):
    """Adds a constant in training only (the issue's case: eval applied it too)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            y = y + 3.0
        return y


class Counter(nn.Module):
    """Counts its calls in a buffer (in place, in train and eval)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls.add_(1)
        return self.fc(x) * (1 + 0.01 * self.calls)


class RunningScale(nn.Module):
    """Custom running statistic updated in training (several in-place forms), used in eval."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("running", torch.ones(8))
        self.register_buffer("seen", torch.zeros(2))

    def forward(self, x):
        y = self.fc(x)
        if self.training:
            with torch.no_grad():
                self.running.mul_(0.9).add_(0.1 * y.abs().mean(0))
                self.seen[0] += 1
                self.running.data.clamp_(max=10.0)
            return y
        return y / self.running


class ParentUpdatesChild(nn.Module):
    """Updates a buffer of a child module from its own forward."""

    def __init__(self):
        super().__init__()
        self.child = Counter()

    def forward(self, x):
        self.child.calls += 1
        return self.child(x)


class FunctionalDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return F.dropout(self.fc(x), 0.5, self.training)


def _sequences(step: int):
    g = torch.Generator().manual_seed(step)
    return torch.randn(4, 5, 8, generator=g), torch.randn(4, 2, generator=g)


class SelfAttention(nn.Module):
    """Self-attention over ``[N, L, 8]`` (dropout on the attention weights in training), mean over L."""

    def __init__(self, dropout: float):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, dropout=dropout, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0].mean(dim=1)


class Encoder(nn.Module):
    def __init__(self, dropout: float):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout, batch_first=True)

    def forward(self, x):
        return self.layer(x).mean(dim=1)


def _model(layers):
    return lambda: nn.Sequential(*layers(), nn.Linear(8, 2))


CASES = {
    "batchnorm1d": (_model(lambda: [nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU()]), _vectors, False),
    "batchnorm2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2)),
                    _images, False),
    "batchnorm-momentum-none": (_model(lambda: [nn.Linear(8, 8), nn.BatchNorm1d(8, momentum=None)]), _vectors, False),
    "layernorm": (_model(lambda: [nn.Linear(8, 8), nn.LayerNorm(8)]), _vectors, False),
    "groupnorm": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(64, 2)),
                  _images, False),
    "dropout": (_model(lambda: [nn.Linear(8, 8), nn.Dropout(0.5)]), _vectors, True),
    "dropout-functional": (_model(lambda: [FunctionalDropout()]), _vectors, True),
    "dropout2d": (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.Dropout2d(0.5), nn.Flatten(), nn.Linear(64, 2)),
                  _images, True),
    "alpha-dropout": (_model(lambda: [nn.Linear(8, 8), nn.SELU(), nn.AlphaDropout(0.3)]), _vectors, True),
    "attention": (_model(lambda: [SelfAttention(0.0)]), _sequences, False),
    "attention-dropout": (_model(lambda: [SelfAttention(0.3)]), _sequences, True),
    "encoder-layer": (_model(lambda: [Encoder(0.0)]), _sequences, False),
    "encoder-layer-dropout": (_model(lambda: [Encoder(0.3)]), _sequences, True),
    "training-branch": (_model(lambda: [TrainingBranch()]), _vectors, False),
    "counter-buffer": (_model(lambda: [Counter()]), _vectors, False),
    "running-statistic": (_model(lambda: [RunningScale()]), _vectors, False),
    "parent-updates-child": (_model(lambda: [ParentUpdatesChild()]), _vectors, False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_equals_alone_in_train_and_eval(case):
    make_model, make_batch, random = CASES[case]
    fused = assert_fused_equals_alone(make_model, make_batch, random=random)
    if case in ("counter-buffer", "running-statistic", "parent-updates-child"):
        assert "0" in fused.fallbacks and "member by member" in fused.fallbacks["0"]


def test_counter_counts_per_member_like_alone():
    """The issue's numbers: three calls count 3 per member (it stayed at 1)."""
    models = [nn.Sequential(Counter()) for _ in range(2)]
    fused = hydro.fuse(models)
    for _ in range(3):
        fused(torch.randn(2, 8))
    assert fused.state_dict()["0.calls"].tolist() == [3.0, 3.0]
    assert [m[0].calls.item() for m in models] == [0.0, 0.0]


def test_fusing_changes_no_member_and_train_eval_do_not_reach_them():
    models = [nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.BatchNorm1d(8), Counter()) for _ in range(2)]
    models[1].eval()
    flags = [[m.training for m in model.modules()] for model in models]
    states = [{k: v.clone() for k, v in model.state_dict().items()} for model in models]
    fused = hydro.fuse(models)
    fused.eval()
    fused(torch.randn(4, 8))
    fused.train()
    fused(torch.randn(4, 8))
    assert [[m.training for m in model.modules()] for model in models] == flags
    for model, state in zip(models, states):
        assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


class RootCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps.add_(1)
        return self.fc(x)


class Reassigns(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps = self.steps + 1
        return self.fc(x)


class PythonCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x) * self.calls


class Caches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        self.last = self.fc(x)
        return self.last


@pytest.mark.parametrize("make,message", [
    (RootCounter, r"the model \(RootCounter\) itself updates its tensor 'steps' in place.*Fix: move that code"),
    (lambda: nn.Sequential(Reassigns()), r"module '0' \(Reassigns\) assigns a new value to its parameter or buffer "
                                         r"'steps'.*Fix: update it in place"),
    (lambda: nn.Sequential(PythonCounter()), r"module '0' \(PythonCounter\) changes its Python attribute 'calls'.*"
                                             r"Fix: keep that state in a buffer"),
    (Caches, r"the model \(Caches\) itself changes its Python attribute 'last'"),
])
def test_state_changes_that_cannot_be_kept_per_member_are_refused(make, message):
    models = [make() for _ in range(2)]
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    with pytest.raises(hydro.FuseError, match=message):
        hydro.fuse(models)
    for model, state in zip(models, before):  # refused without touching the members either
        assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert all(getattr(m[0] if isinstance(m, nn.Sequential) else m, "calls", 0) == 0 for m in models)


def _hooked():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    model[0].register_forward_hook(lambda module, args, out: out * 2)
    return model


@pytest.mark.parametrize("make,message", [
    (_hooked, r"member 0, module '0' \(Linear\) has forward hooks .*Fix: remove them"),
    (lambda: nn.Sequential(nn.utils.spectral_norm(nn.Linear(8, 8)), nn.Linear(8, 2)),
     r"module '0' \(Linear\) has forward pre-hooks"),
    (lambda: nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)), nn.Linear(8, 2)),
     r"module '0' \(ParametrizedLinear\) is parametrized.*remove_parametrizations"),
])
def test_hooks_and_parametrizations_the_fused_layers_would_skip_are_refused(make, message):
    """Forward hooks ran silently not at all in the fused model (output off by 2x)."""
    with pytest.raises(hydro.FuseError, match=message):
        hydro.fuse([make() for _ in range(2)])


class NoGradScale(nn.Module):
    """Divides by a statistic computed under torch.no_grad() (tracing dropped the no_grad: gradients differed)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        with torch.no_grad():
            scale = y.abs().mean() + 1
        return y / scale


def test_no_grad_in_a_submodule_runs_it_member_by_member():
    fused = assert_fused_equals_alone(_model(lambda: [NoGradScale()]), _vectors)
    assert "switches gradient recording" in fused.fallbacks["0"]
    with pytest.raises(hydro.FuseError, match=r"the model \(NoGradScale\) itself switches gradient recording.*"
                                              r"Fix: move that code"):
        hydro.fuse([NoGradScale() for _ in range(2)])
