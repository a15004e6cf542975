"""hydro.shrink keeps what it cannot scale at full width (µP: finite dimensions) with one ShrinkWarning and a
report on the surrogate; ``strict=True`` raises instead (see test_refusals.py)."""
from __future__ import annotations

import warnings

import pytest
import torch
from shrink_models import MLP
from test_refusals import WithRMSNorm
from torch import nn

import hydro
from hydro.examples.models import CharTransformerLM
from hydro.shrink import ShrinkError, ShrinkWarning


def _shrink_warned(model, scale, **options):
    """``hydro.shrink`` with exactly one ShrinkWarning; returns the surrogate and the warning's text."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        small = hydro.shrink(model, scale, **options)
    shrink_warnings = [w for w in caught if issubclass(w.category, ShrinkWarning)]
    assert len(shrink_warnings) == 1, [str(w.message) for w in caught]
    assert shrink_warnings[0].filename == __file__  # points at the caller's line
    text = str(shrink_warnings[0].message)
    assert text == small.hydro_shrink_report.notice()
    return small, text


def test_layer_without_a_rule_keeps_its_widths_at_full_size():
    small, text = _shrink_warned(WithRMSNorm(), 4)
    assert "'inp'.out, 'mid'.in (layer 'act' (RMSNorm): no shrink rule)" in text and "strict=True" in text
    explicit = hydro.shrink(WithRMSNorm(), 4, fixed=["act"])  # what the user had to write before: same surrogate
    assert [p.shape for p in small.parameters()] == [p.shape for p in explicit.parameters()]
    assert small(torch.randn(2, 5, 16)).shape == (2, 5, 10)
    kept = small.hydro_shrink_report.kept
    assert len(kept) == 1 and kept[0].widths == ("'inp'.out", "'mid'.in")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the full-size target (scale 1) changes nothing: no warning
        assert hydro.shrink(WithRMSNorm(), 1).hydro_shrink_report.kept == kept


def test_operation_without_a_rule_keeps_its_widths():
    class MatmulParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 64)
            self.w = nn.Parameter(torch.randn(64, 64))
            self.mid = nn.Linear(64, 64)
            self.out = nn.Linear(64, 10)

        def forward(self, x):
            return self.out(torch.relu(self.mid(self.inp(x) @ self.w)))

    small, text = _shrink_warned(MatmulParam(), 4)
    assert "operation 'matmul'" in text
    assert (small.inp.out_features, small.w.shape, small.mid.in_features, small.mid.out_features) == \
        (64, (64, 64), 64, 16)


def test_width_below_min_width_is_kept_and_the_rest_scaled():
    class TwoWidths(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(16, 32)  # 32 / 8 = 4 < min_width 8: kept
            self.b = nn.Linear(32, 256)  # 256 / 8 = 32: scaled
            self.c = nn.Linear(256, 10)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    small, text = _shrink_warned(TwoWidths(), 8)
    assert "'a'.out, 'b'.in (32 would shrink to 4 < min_width=8)" in text
    assert (small.a.out_features, small.b.in_features, small.b.out_features) == (32, 32, 32)
    assert small(torch.randn(3, 16)).shape == (3, 10)
    with pytest.raises(ShrinkError, match="would shrink to 4 < min_width=8"):
        hydro.shrink(TwoWidths(), 8, strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing kept, nothing warned
        assert hydro.shrink(TwoWidths(), 8, min_width=4).a.out_features == 4


def test_width_the_scale_does_not_divide_is_kept():
    model = nn.Sequential(nn.Linear(16, 96), nn.ReLU(), nn.Linear(96, 128), nn.ReLU(), nn.Linear(128, 10))
    small, text = _shrink_warned(model, 64, min_width=1)
    assert "'0'.out, '2'.in (96 is not divisible by scale 64)" in text
    assert (small[0].out_features, small[2].out_features) == (96, 2)
    # the only width kept: nothing left to shrink, and the error says why and which scales work, first
    with pytest.raises(ShrinkError, match=r"^hydro.shrink: at scale 8, MLP has no width left to shrink \(100 is not "
                                          r"divisible by scale 8\). Fix: a scale that divides its widths \(2, 4, 5, "
                                          r"10\), or full size \(scale=1; hydro tune --scale 1\). Kept at full size: "):
        hydro.shrink(MLP(100), 8)


def test_layer_that_cannot_be_built_at_the_scaled_sizes_is_kept():
    model = nn.Sequential(nn.Linear(16, 64), nn.GroupNorm(16, 64), nn.ReLU(), nn.Linear(64, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    small, text = _shrink_warned(model, 8)  # 64 / 8 = 8 channels in 16 groups: not buildable
    assert "'0'.out, '1'.features, '3'.in (layer '1' (GroupNorm) cannot be built at the scaled sizes)" in text
    assert (small[1].num_channels, small[3].out_features) == (64, 16)
    with pytest.raises(ShrinkError, match=r"layer '1' \(GroupNorm\).*not divisible by num_groups=16"):
        hydro.shrink(model, 8, strict=True)


def test_bundled_char_lm_shrinks_at_scale_8_with_narrower_heads():
    """The char-lm example's model (hydro tune --example char-lm): d_model 64, 4 heads of 16."""
    model = CharTransformerLM(vocab_size=128, d_model=64, nhead=4, num_layers=2, dim_feedforward=256, max_len=32)
    small, text = _shrink_warned(model, 8)
    assert "4 heads of 16 -> 1 head(s) of 8" in text and not small.hydro_shrink_report.kept
    attn = small.encoder.layers[1].self_attn
    assert (attn.embed_dim, attn.num_heads, attn.scale) == (8, 1, 16 ** 0.5 / 8)  # µP: sqrt(16)/8
    assert small.encoder.layers[0].linear1.out_features == 32
    tokens = torch.randint(0, 128, (2, 32))
    loss = nn.functional.cross_entropy(small(tokens).flatten(0, 1), tokens.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    fused = hydro.fuse([hydro.shrink(model, 8) for _ in range(2)])  # and its surrogates fuse
    assert fused(tokens).shape == (2, 2, 32, 128)


def test_bad_options_are_refused():
    with pytest.raises(ShrinkError, match="min_width must be an integer >= 1"):
        hydro.shrink(MLP(64), 2, min_width=0)
    with pytest.raises(ShrinkError, match=r"fixed must be a collection of module paths.*fixed=\['input'\]"):
        hydro.shrink(MLP(64), 2, fixed="input")
