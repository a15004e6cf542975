"""µP members built from one shrunk template per (architecture, scale) equal, bit for bit, both members built one by
one and a straightforward reference: a surrogate that keeps no tensor of its full-size model is ``hydro.shrink`` of
it right after ``torch.manual_seed`` of its seed (the full-size initialisation's draws are not part of it); one that
keeps some (parameters sliced in ``forward``) is shrunk from the full-size model initialised from its seed. Every
tensor, every parameter's attributes, and torch's RNG state afterwards; where a template cannot build them they are
built one by one. The surrogates' initial weights keep their per-parameter distribution (the shrunk layers' own)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import hydro
import hydro.trial.members as members_module
import hydro.trial.surrogate as surrogate_module
from hydro.binder import FuseError
from hydro.examples.models import ResNet18
from hydro.trial.members import FusedMembers, _build, member_seed
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


def _reference(spec: TuneSpec, configs, scale: int, keeps_full_size_tensors: bool = False
               ) -> tuple[hydro.FusedModel, torch.Tensor]:
    """The members as the contract states them, with hydro.shrink and hydro.fuse alone."""
    members = []
    for config, member_id in zip(configs, IDS):
        if keeps_full_size_tensors:  # the full-size model's draws come first, from the seed
            torch.manual_seed(member_seed(spec, member_id))
            full = spec.model(config)
        else:  # the full-size model's values are not used: the shrunk layers draw first, from the seed
            full = spec.model(config)
            torch.manual_seed(member_seed(spec, member_id))
        members.append(hydro.shrink(full, scale, **spec.shrink_options()))
    return hydro.fuse(members, leaf_modules=tuple(spec.leaf_modules)), torch.get_rng_state()


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
def test_members_from_a_template_equal_members_built_one_by_one_and_the_reference(model, scale, templated):
    spec = _spec(model)
    fast = _fast(spec, CONFIGS, scale)
    assert (_template_of(spec, scale) is not None) == templated
    again = _fast(spec, CONFIGS[::-1], scale)  # a second trial of the group reuses the template
    reference = _reference(spec, CONFIGS, scale, keeps_full_size_tensors=not templated)
    _assert_same(*fast, *reference)
    _assert_same(*_plain(spec, CONFIGS, scale), *reference)
    _assert_same(*again, *_plain(spec, CONFIGS[::-1], scale))


def test_members_are_reproducible_and_each_seed_draws_its_own():
    spec = _spec(lambda c: CNN(64))
    fused, _ = _fast(spec, CONFIGS, 4)
    again, _ = _fast(spec, CONFIGS, 4)
    reseeded, _ = _fast(_spec(spec.model, seed=1), CONFIGS, 4)  # the spec's seed: other members
    drawn = [name for name, t in fused.named_parameters() if t[0].unique().numel() > 1]  # not constant-initialised
    assert len(drawn) == 8  # every Conv and Linear weight and bias (BatchNorm, GroupNorm: constants)
    for name in drawn:
        members = fused.get_parameter(name)
        assert torch.equal(members, again.get_parameter(name))
        assert all(not torch.equal(members[i], members[j]) for i in range(5) for j in range(i))
        assert all(not torch.equal(members[i], reseeded.get_parameter(name)[i]) for i in range(5))


def _old_style(spec: TuneSpec, member_id: str, scale: int) -> nn.Module:
    """A surrogate as it was built before: shrunk layers drawn after the seeded full-size initialisation."""
    torch.manual_seed(member_seed(spec, member_id))
    return hydro.shrink(spec.model({}), scale)


def test_a_surrogates_initial_weights_keep_their_distribution():
    """The shrunk layers draw at their own sizes as before (torch's init on the shrunk fan-in, then µP's readout
    rescaling), only from another place in the RNG's stream: same bounds, same spread, same distribution."""
    spec = _spec(lambda c: ResNet18())
    ids = [f"m{i}" for i in range(8)]
    fused = FusedMembers(spec, [{"lr": 0.1}] * len(ids), ids, 8, mup=True).model
    old = [_old_style(spec, member_id, 8) for member_id in ids]
    # kaiming_uniform(a=sqrt(5)): U(±1/sqrt(fan_in)) on the shrunk fan-in; the readout (64 -> 10) ×sqrt(1/8)
    bounds = {"stem.0.weight": 1 / 27 ** 0.5, "blocks.0.conv1.weight": 1 / 72 ** 0.5,
              "blocks.7.conv2.weight": 1 / 576 ** 0.5, "blocks.2.shortcut.0.weight": 1 / 8 ** 0.5,
              "fc.weight": 1 / 512 ** 0.5, "fc.bias": 1 / 512 ** 0.5}
    for name, bound in bounds.items():
        new_values = fused.get_parameter(name).detach().flatten()
        old_values = torch.stack([m.get_parameter(name).detach() for m in old]).flatten()
        assert new_values.numel() == old_values.numel() >= 80, name
        for values in (new_values, old_values):
            assert values.abs().max() <= bound and values.abs().max() > 0.9 * bound, name
            assert abs(values.std() / (bound / 3 ** 0.5) - 1) < 0.2, name  # U(±b) has std b/sqrt(3)
        grid = torch.linspace(-bound, bound, 41)  # two-sample Kolmogorov-Smirnov statistic, 99.9% critical value
        ks = ((new_values[:, None] <= grid).float().mean(0) - (old_values[:, None] <= grid).float().mean(0)).abs()
        n = new_values.numel()
        assert ks.max() < 1.95 * (2 / n) ** 0.5, name
        assert not torch.equal(new_values, old_values)  # drawn anew: the stream no longer starts after the full size
    for name in ("stem.1.weight", "stem.1.bias", "blocks.0.bn1.running_var"):
        assert torch.equal(fused.get_buffer(name) if "running" in name else fused.get_parameter(name),
                           torch.stack([m.get_buffer(name) if "running" in name else m.get_parameter(name)
                                        for m in old]))  # constants (BatchNorm) as before


def test_a_factory_whose_initialisation_reads_a_hyperparameter_is_checked_per_value():
    def model(config):
        net = MLP(64)
        if config["init"] == "normal":  # a custom initialisation: shrink does not carry it over
            for p in net.parameters():
                nn.init.normal_(p, std=0.02)
        return net

    spec = _spec(model)
    configs = [{**c, "init": "normal" if i % 2 else "default"} for i, c in enumerate(CONFIGS)]
    _assert_same(*_fast(spec, configs, 4), *_plain(spec, configs, 4))
    _assert_same(*_fast(spec, configs, 4), *_reference(spec, configs, 4))
    assert {values[0] for _, values in _template_of(spec, 4).checked} == {("'init'", "'default'"),
                                                                          ("'init'", "'normal'")}


def test_members_of_another_architecture_are_refused_as_before():
    spec = _spec(lambda c: MLP(c["width"]))  # "width" changes the architecture but is not in group_by
    configs = [{"lr": 0.1, "width": 64}, {"lr": 0.1, "width": 128}]
    with pytest.raises(FuseError, match="differs from member 0"):
        FusedMembers(spec, configs, IDS[:2], 4, mup=True)


class _Dropped(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.mlp, self.drop = MLP(64), nn.Dropout(p)

    def forward(self, x):
        return self.drop(self.mlp(x))


def test_members_that_differ_in_a_setting_of_the_same_shapes_are_refused_as_by_fuse():
    spec = _spec(lambda c: _Dropped(c["p"]))  # "p" is not in group_by: the tensors' shapes are alike
    configs = [{"lr": 0.1, "p": 0.0}, {"lr": 0.1, "p": 0.5}]
    with pytest.raises(FuseError, match="Dropout"):
        FusedMembers(spec, configs, IDS[:2], 4, mup=True)


def test_a_factory_that_cannot_run_on_the_meta_device_builds_members_one_by_one():
    def model(config):
        net = MLP(64)
        net.input.weight.data.mul_(float(net.input.weight.abs().max()))  # reads a value: impossible on meta
        return net

    spec = _spec(model)
    _assert_same(*_fast(spec, CONFIGS, 4), *_plain(spec, CONFIGS, 4))
    _assert_same(*_fast(spec, CONFIGS, 4), *_reference(spec, CONFIGS, 4))
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
