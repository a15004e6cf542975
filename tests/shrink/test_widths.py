"""Width inference from the data flow, and the shrunk layers' shapes, µP layers and µP shapes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from shrink_models import CNN, MLP, CharTransformer
from torch import nn

import hydro
from hydro.shrink import MuMultiheadAttention, MuShape, MuTransformerEncoderLayer, Readout


def test_mlp_readout_found_by_data_flow_not_definition_order():
    target = MLP(256, d_in=16, d_out=10, depth=3)
    assert next(iter(target.named_children()))[0] == "readout"  # defined first, applied last
    small = hydro.shrink(target, 4)
    assert isinstance(small.readout, Readout) and small.readout.output_mult == 4.0
    assert (small.input.in_features, small.input.out_features) == (16, 64)
    assert (small.hidden[0].in_features, small.hidden[0].out_features) == (64, 64)
    assert (small.readout.in_features, small.readout.out_features) == (64, 10)
    assert type(small.input) is nn.Linear and type(small.hidden[0]) is nn.Linear
    assert small.input.weight.hydro_mup == MuShape((256, None), (64, 16))
    assert small.hidden[0].weight.hydro_mup == MuShape((256, 256), (64, 64))
    assert small.readout.weight.hydro_mup == MuShape((None, 256), (10, 64))
    assert small.readout.bias.hydro_mup == MuShape((None,), (10,))
    assert small(torch.randn(5, 16)).shape == (5, 10)


def test_layer_whose_output_is_returned_is_the_readout_even_when_another_comes_later():
    class TwoHeads(nn.Module):
        """``out`` is defined and called before ``aux``, but only ``out``'s value reaches the output."""

        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 64)
            self.out = nn.Linear(64, 3)
            self.aux = nn.Linear(64, 64)

        def forward(self, x):
            h = torch.relu(self.inp(x))
            y = self.out(h)
            return y + 0 * self.aux(h).sum()

    small = hydro.shrink(TwoHeads(), 8)
    assert isinstance(small.out, Readout) and type(small.aux) is nn.Linear
    assert (small.aux.in_features, small.aux.out_features) == (8, 8)


def test_residual_joins_widths_and_input_width_stays_fixed():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = nn.Linear(32, 128)
            self.down = nn.Linear(128, 32)
            self.head = nn.Linear(32, 4)

        def forward(self, x):
            return self.head(x + self.down(F.gelu(self.up(x))))  # 32 is the input width: fixed

    small = hydro.shrink(Residual(), 4)
    assert (small.up.in_features, small.up.out_features, small.down.out_features) == (32, 32, 32)
    assert small.head.in_features == 32 and type(small.head) is nn.Linear  # its input is not a width
    assert small.down.weight.hydro_mup.base == (None, 128)


def test_cnn_channels_groups_norms_and_flatten():
    small = hydro.shrink(CNN(32), 4)
    assert (small.conv1.in_channels, small.conv1.out_channels) == (1, 8)
    assert (small.conv2.in_channels, small.conv2.out_channels, small.conv2.groups) == (8, 8, 8)  # depthwise
    assert small.bn1.num_features == 8 and (small.gn.num_channels, small.gn.num_groups) == (8, 4)
    assert (small.fc.in_features, small.fc.out_features) == (32, 16)  # flatten: channels x 2x2
    assert isinstance(small.out, Readout) and small.out.output_mult == 4.0
    assert small.conv1.weight.hydro_mup.base == (32, None, None, None)
    assert small.conv2.weight.hydro_mup.base == (32, None, None, None)  # depthwise: one width dimension
    assert small(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_conv1d_batchnorm1d_and_reduction_over_time():
    class Audio(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(2, 64, 5, padding=2)
            self.bn = nn.BatchNorm1d(64)
            self.conv2 = nn.Conv1d(64, 64, 3, padding=1, groups=4)
            self.fc = nn.Linear(64, 3)

        def forward(self, x):  # [N, 2, T]
            h = self.conv2(F.relu(self.bn(self.conv(x))))
            return self.fc(h.mean(dim=-1))

    small = hydro.shrink(Audio(), 4)
    assert (small.conv.in_channels, small.conv.out_channels, small.bn.num_features) == (2, 16, 16)
    assert (small.conv2.in_channels, small.conv2.out_channels, small.conv2.groups) == (16, 16, 4)
    assert small.conv2.weight.hydro_mup.base == (64, 16, None)  # 16 = 64/4 channels per group, at full width
    assert isinstance(small.fc, Readout) and small.fc.in_features == 16
    assert small(torch.randn(2, 2, 20)).shape == (2, 3)


def test_transformer_keeps_head_dim_reduces_heads_and_torchs_logit_scale():
    target = CharTransformer(128, vocab=32, context=16, layers=2, head_dim=16)
    small = hydro.shrink(target, 4)
    for layer in small.encoder.layers:
        assert isinstance(layer, MuTransformerEncoderLayer)
        attn = layer.self_attn
        assert isinstance(attn, MuMultiheadAttention)
        assert (attn.embed_dim, attn.num_heads, attn.head_dim, attn.scale) == (32, 2, 16, 1 / 4)  # 1/sqrt(16)
        assert layer.linear1.out_features == 64
    assert small.embed.embedding_dim == 32 and small.embed.num_embeddings == 32
    assert small.pos.shape == (16, 32) and small.pos.hydro_mup.base == (None, 128)
    assert torch.equal(small.pos, target.pos[:, :32])
    assert isinstance(small.readout, Readout) and small.readout.output_mult == 4.0
    assert small(torch.randint(0, 32, (3, 16))).shape == (3, 16, 32)


def test_mu_attention_with_narrower_heads_scales_logits_by_sqrt_base_head_dim_over_head_dim():
    torch.manual_seed(0)
    mu = MuMultiheadAttention(32, 4, batch_first=True, base_head_dim=32)  # heads of 8 where the target's are 32
    ref = nn.MultiheadAttention(32, 4, batch_first=True)
    ref.load_state_dict(mu.state_dict())
    with torch.no_grad():  # torch scales by 1/sqrt(8); scaling q by sqrt(32/8) = 2 gives sqrt(32)/8
        ref.in_proj_weight[:32] *= 2
        ref.in_proj_bias[:32] *= 2
    x, mask = torch.randn(2, 5, 32), nn.Transformer.generate_square_subsequent_mask(5)
    out, weights = mu(x, x, x, attn_mask=mask)
    ref_out, ref_weights = ref(x, x, x, attn_mask=mask)
    assert mu.scale == 32 ** 0.5 / 8
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)


def test_mu_attention_with_the_base_head_dim_is_torchs():
    torch.manual_seed(0)
    mu = MuMultiheadAttention(32, 4, batch_first=True, base_head_dim=8)
    ref = nn.MultiheadAttention(32, 4, batch_first=True)
    ref.load_state_dict(mu.state_dict())
    x = torch.randn(2, 5, 32)
    for a, b in zip(mu(x, x, x), ref(x, x, x)):
        assert torch.equal(a, b)


def test_eval_mode_does_not_take_torch_fast_path_around_mu_attention():
    torch.manual_seed(0)
    layer = MuTransformerEncoderLayer(32, 2, 64, 0.0, batch_first=True, base_head_dim=64)  # µP scale 1/2, not 1/4
    x = torch.randn(2, 5, 32)
    with torch.no_grad():  # no grad and eval mode: torch's preconditions of its fused kernel
        expected = layer.train()(x)  # never the fast path in training mode
        torch.testing.assert_close(layer.eval()(x), expected)


@pytest.mark.parametrize("scale", [1, 2])
def test_scale_one_is_the_target_in_mup(scale):
    small = hydro.shrink(MLP(64), scale)
    assert small.hidden[0].weight.shape == (64 // scale, 64 // scale)
    assert small.readout.output_mult == scale
    assert all(p.hydro_mup.mult(d) == 1 / scale for p in small.parameters() for d, b in
               enumerate(p.hydro_mup.base) if b is not None)
