"""What cannot be shrunk is refused with a ShrinkError that names the layer and the fix (``strict=True``; the
default keeps such widths at full size with a ShrinkWarning, see test_kept_widths.py)."""
from __future__ import annotations

import pytest
import torch
from shrink_models import MLP, CharTransformer
from torch import nn

import hydro
from hydro.shrink import ShrinkError


class WithRMSNorm(nn.Module):
    """An RMSNorm (no shrink rule) between width layers."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 64)
        self.act = nn.RMSNorm(64)
        self.mid = nn.Linear(64, 128)
        self.out = nn.Linear(128, 10)

    def forward(self, x):
        return self.out(torch.relu(self.mid(self.act(self.inp(x)))))


def test_width_not_divisible_by_scale():
    with pytest.raises(ShrinkError, match=r"width 'out' = 100 of layer 'input' \(Linear\) is not divisible by scale 8"):
        hydro.shrink(MLP(100), 8, strict=True)


def test_width_below_minimum():
    with pytest.raises(ShrinkError, match=r"would shrink to 4 < min_width=8"):
        hydro.shrink(MLP(64), 16, strict=True)
    assert hydro.shrink(MLP(64), 16, min_width=4).input.out_features == 4


def test_unknown_layer_coupled_to_a_width_is_named_with_the_fix():
    with pytest.raises(ShrinkError, match=r"layer 'act' \(RMSNorm\) has no shrink rule.*'inp'.out.*fixed=\['act'\]"):
        hydro.shrink(WithRMSNorm(), 4, strict=True)
    small = hydro.shrink(WithRMSNorm(), 4, fixed=["act"])  # the fix: the RMSNorm and the widths it touches stay
    assert (small.inp.out_features, small.mid.in_features, small.mid.out_features) == (64, 64, 32)
    assert small(torch.randn(2, 5, 16)).shape == (2, 5, 10)


def test_function_on_a_parameter_coupled_to_a_width():
    class MatmulParam(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(16, 64)
            self.w = nn.Parameter(torch.randn(64, 64))
            self.out = nn.Linear(64, 10)

        def forward(self, x):
            return self.out(self.inp(x) @ self.w)

    with pytest.raises(ShrinkError, match=r"operation 'matmul'.*no shrink rule.*nn.Linear instead of matmul"):
        hydro.shrink(MatmulParam(), 4, strict=True)


def test_literal_size_in_a_reshape():
    class Literal(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 32, 3, padding=1)
            self.fc = nn.Linear(32 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(self.conv(x).view(-1, 2048))

    with pytest.raises(ShrinkError, match=r"literal size\(s\) \[2048\].*x.size\(\)"):
        hydro.shrink(Literal(), 4)


def test_convolution_as_output_layer():
    head = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 5, 1))  # per-pixel classes
    with pytest.raises(ShrinkError, match=r"layer '2' \(Conv2d\).*readout.*nn.Linear"):
        hydro.shrink(head, 4, strict=True)


def test_model_without_width_dimension():
    with pytest.raises(ShrinkError, match=r"^hydro.shrink: Sequential has no width to shrink. Fix: tune it at full "
                                          r"size \(scale=1; hydro tune --scale 1\)"):
        hydro.shrink(nn.Sequential(nn.Linear(16, 10), nn.ReLU()), 2)


def test_heads_narrower_than_the_full_models_where_the_width_is_not_a_multiple():
    small = hydro.shrink(CharTransformer(64, head_dim=16), 8, strict=True)  # width 8 < head dimension 16
    attn = small.encoder.layers[0].self_attn
    assert (attn.embed_dim, attn.num_heads, attn.head_dim, attn.scale) == (8, 1, 8, 16 ** 0.5 / 8)
    assert "4 heads of 16 -> 1 head(s) of 8" in small.hydro_shrink_report.heads[0]
    assert small(torch.randint(0, 32, (2, 16))).shape[:2] == (2, 16)


def test_already_shrunk_tied_and_bad_arguments():
    with pytest.raises(ShrinkError, match="already a shrunk"):
        hydro.shrink(hydro.shrink(MLP(64), 2), 2)
    tied = MLP(64, depth=4)
    tied.hidden[1].weight = tied.hidden[0].weight
    with pytest.raises(ShrinkError, match=r"tied.*untie"):
        hydro.shrink(tied, 2)
    for scale in (0, 1.5, True):
        with pytest.raises(ShrinkError, match="scale must be an integer"):
            hydro.shrink(MLP(64), scale)
    with pytest.raises(ShrinkError, match=r"fixed=\['nope'\] names no submodule"):
        hydro.shrink(MLP(64), 2, fixed=["nope"])
    assert issubclass(ShrinkError, ValueError)
