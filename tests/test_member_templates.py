"""µP members built from one shrunk template per (architecture, scale) equal members built one by one
(seeded, full-size initialisation, shrunk, fused) bit for bit: every tensor, every parameter's attributes, and
torch's RNG state afterwards; where a template cannot build them exactly they are built one by one."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import hydro
import hydro.trial.members as members_module
import hydro.trial.surrogate as surrogate_module
from hydro.binder import FuseError
from hydro.trial.members import FusedMembers, _build
from hydro.trial.spec import TuneSpec
from tests.shrink.shrink_models import CNN, MLP, CharTransformer

CONFIGS = [{"lr": 0.01 * (i + 1), "std": 0.02} for i in range(5)]
IDS = [f"m{i}" for i in range(5)]


def _spec(model, **options) -> TuneSpec:
    return TuneSpec(model=model, data=lambda: None, loss=nn.CrossEntropyLoss(),
                    optimizer=lambda params, c: torch.optim.SGD(params, lr=c["lr"]), **options)


def _plain(spec: TuneSpec, configs, scale: int) -> tuple[hydro.FusedModel, torch.Tensor]:
    fused = hydro.fuse(_build(spec, configs, IDS[:len(configs)], scale, True), leaf_modules=tuple(spec.leaf_modules))
    return fused, torch.get_rng_state()


def _assert_same(fast: hydro.FusedModel, fast_rng: torch.Tensor, plain: hydro.FusedModel, plain_rng: torch.Tensor):
    want, got = plain.state_dict(), fast.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    params = dict(plain.named_parameters())
    for name, param in fast.named_parameters():
        assert param.requires_grad == params[name].requires_grad and param.__dict__ == params[name].__dict__, name
    assert torch.equal(fast_rng, plain_rng)  # what trains next (dropout, ...) draws alike


def _fast(spec: TuneSpec, configs, scale: int) -> tuple[hydro.FusedModel, torch.Tensor]:
    members = FusedMembers(spec, configs, IDS[:len(configs)], scale, mup=True)
    return members.model, torch.get_rng_state()


def _template_of(spec: TuneSpec, scale: int):
    return next(t for (factory, _, s, _), t in surrogate_module._TEMPLATES.items() if factory is spec.model and s == scale)


@pytest.fixture(autouse=True)
def fresh_templates(monkeypatch):
    monkeypatch.setattr(surrogate_module, "_TEMPLATES", {})
    warnings.simplefilter("ignore")  # shrink's notices about widths kept at full size


@pytest.mark.parametrize("model,scale,templated", [
    (lambda c: MLP(64), 4, True), (lambda c: CNN(64), 4, True), (lambda c: CNN(64), 8, True),
    (lambda c: CharTransformer(64, head_dim=8), 2, False)],  # its bare positional parameter is sliced
    ids=["mlp", "cnn", "cnn-s8", "transformer"])
def test_members_from_a_template_equal_members_built_one_by_one(model, scale, templated):
    spec = _spec(model)
    fast = _fast(spec, CONFIGS, scale)
    assert (_template_of(spec, scale) is not None) == templated
    again = _fast(spec, CONFIGS[::-1], scale)  # a second trial of the group reuses the template
    plain = _plain(spec, CONFIGS, scale)
    _assert_same(*fast, *plain)
    _assert_same(*again, *_plain(spec, CONFIGS[::-1], scale))


def test_a_factory_whose_initialisation_reads_a_hyperparameter_draws_per_value():
    def model(config):
        net = MLP(64)
        if config["init"] == "normal":  # another number of random draws than torch's default init
            for p in net.parameters():
                nn.init.normal_(p, std=0.02)
        return net

    spec = _spec(model)
    configs = [{**c, "init": "normal" if i % 2 else "default"} for i, c in enumerate(CONFIGS)]
    _assert_same(*_fast(spec, configs, 4), *_plain(spec, configs, 4))
    assert {values[0] for _, values, _ in _template_of(spec, 4).recorded} == {("'init'", "'default'"),
                                                                             ("'init'", "'normal'")}


def test_members_of_another_architecture_are_refused_as_before():
    spec = _spec(lambda c: MLP(c["width"]))  # "width" changes the architecture but is not in group_by
    configs = [{"lr": 0.1, "width": 64}, {"lr": 0.1, "width": 128}]
    with pytest.raises(FuseError, match="differs from member 0"):
        FusedMembers(spec, configs, IDS[:2], 4, mup=True)


def test_a_factory_that_cannot_run_on_the_meta_device_builds_members_one_by_one():
    def model(config):
        net = MLP(64)
        net.input.weight.data.mul_(float(net.input.weight.abs().max()))  # reads a value: impossible on meta
        return net

    spec = _spec(model)
    _assert_same(*_fast(spec, CONFIGS, 4), *_plain(spec, CONFIGS, 4))
    assert _template_of(spec, 4) is None


def test_members_from_a_template_train_like_members_built_one_by_one(monkeypatch):
    spec = _spec(lambda c: CNN(64))
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    states = []
    for from_template in (True, False):
        if not from_template:
            monkeypatch.setattr(members_module, "fused_surrogates", lambda *args, **kwargs: None)
        members = FusedMembers(spec, CONFIGS, IDS, 4, mup=True)
        members.zero_grad()
        nn.functional.cross_entropy(members(x).flatten(0, 1), y.repeat(len(CONFIGS))).backward()
        members.step()
        states.append(members.state_dict())
    assert _template_of(spec, 4) is not None
    (fast, plain) = states
    for got, want in zip(fast["modules"][0].values(), plain["modules"][0].values()):
        assert torch.equal(got, want)
