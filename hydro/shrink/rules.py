"""Shrink rules of the layers whose sizes can be widths.

A rule names a layer's width *fields* (e.g. a Linear's ``in``/``out``), which field each data input and
the output carry, and builds the layer anew with given field sizes. ``build`` raises ``ValueError`` when
the sizes do not fit the layer (heads, groups); the caller names the layer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .layers import MuMultiheadAttention, MuTransformerEncoderLayer, Readout


@dataclass(frozen=True)
class BuildContext:
    """What a rule needs besides sizes: which fields are scaled, where tensors go, the readout init."""

    scaled: frozenset[str]
    device: object = None
    dtype: object = None
    readout_zero_init: bool = False

    @property
    def factory(self) -> dict:
        return {"device": self.device, "dtype": self.dtype}


@dataclass(frozen=True)
class Rule:
    """``fields(layer)``: width fields and sizes; ``inputs``: (forward argument name, field or ``None``) per
    data input (an argument may be a tuple of tensors, each carrying the field); ``output``: the field the output
    carries; ``build(layer, sizes, ctx)``: the new layer; ``output_tree``: for a forward that returns a tuple,
    which elements carry ``output`` (``True``; a nested tuple as a nested dict), e.g. ``{0: True}``."""

    fields: Callable[[nn.Module], dict[str, int]]
    inputs: tuple[tuple[str, str | None], ...]
    output: str
    build: Callable[[nn.Module, dict[str, int], BuildContext], nn.Module]
    output_tree: dict | None = None


def _linear(t: nn.Linear, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    bias = t.bias is not None
    if "in" in ctx.scaled and "out" not in ctx.scaled:  # maps a width to a fixed size: µP readout
        return Readout(sizes["in"], sizes["out"], bias, output_mult=t.in_features / sizes["in"],
                       zero_init=ctx.readout_zero_init, **ctx.factory)
    return nn.Linear(sizes["in"], sizes["out"], bias, **ctx.factory)


def _conv(t: nn.modules.conv._ConvNd, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    if "in" in ctx.scaled and "out" not in ctx.scaled:
        raise ValueError("it maps a width to fixed output channels, which µP does with a readout (output "
                         "multiplier 1/width_mult) that exists for Linear only. Fix: produce the output with an "
                         "nn.Linear (e.g. pool + flatten + Linear, or a Linear over the channel dimension)")
    groups = t.groups
    if groups > 1 and groups == t.in_channels:  # depthwise: one group per channel
        groups = sizes["in"]
    if sizes["in"] % groups or sizes["out"] % groups:
        raise ValueError(f"{sizes['in']} in / {sizes['out']} out channels are not divisible by groups={groups}; "
                         f"use a scale that keeps them divisible")
    return type(t)(sizes["in"], sizes["out"], t.kernel_size, t.stride, t.padding, t.dilation, groups,
                   t.bias is not None, t.padding_mode, **ctx.factory)


def _batch_norm(t: nn.modules.batchnorm._BatchNorm, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    return type(t)(sizes["features"], t.eps, t.momentum, t.affine, t.track_running_stats, **ctx.factory)


def _layer_norm_fields(t: nn.LayerNorm) -> dict[str, int]:
    if len(t.normalized_shape) != 1:
        raise ValueError(f"LayerNorm over {len(t.normalized_shape)} dimensions {tuple(t.normalized_shape)}: only a "
                         f"LayerNorm over the last dimension can be shrunk")
    return {"features": t.normalized_shape[0]}


def _layer_norm(t: nn.LayerNorm, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    return nn.LayerNorm(sizes["features"], t.eps, t.elementwise_affine, bias=t.bias is not None, **ctx.factory)


def _group_norm(t: nn.GroupNorm, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    if sizes["features"] % t.num_groups:
        raise ValueError(f"{sizes['features']} channels are not divisible by num_groups={t.num_groups}; use fewer "
                         f"groups or a smaller scale")
    return nn.GroupNorm(t.num_groups, sizes["features"], t.eps, t.affine, **ctx.factory)


def _embedding(t: nn.Embedding, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    return nn.Embedding(t.num_embeddings, sizes["dim"], t.padding_idx, t.max_norm, t.norm_type,
                        t.scale_grad_by_freq, t.sparse, **ctx.factory)


def _heads(attn: nn.MultiheadAttention, embed_dim: int) -> tuple[int, int]:
    """``(num_heads, head_dim)`` at ``embed_dim``: the head dimension of ``attn`` kept (fewer heads) where it
    divides ``embed_dim``, else the fewest heads no wider than it (narrower heads, e.g. one head of 8)."""
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError("MultiheadAttention with kdim/vdim != embed_dim, add_bias_kv or add_zero_attn cannot be "
                         "shrunk; use plain self-/cross-attention with equal dimensions")
    head_dim = attn.head_dim
    if embed_dim % head_dim == 0:
        return embed_dim // head_dim, head_dim
    heads = next(h for h in range(1, embed_dim + 1) if embed_dim % h == 0 and embed_dim // h <= head_dim)
    return heads, embed_dim // heads


def _attention(t: nn.MultiheadAttention, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    heads, _ = _heads(t, sizes["embed"])
    return MuMultiheadAttention(sizes["embed"], heads, t.dropout, t.in_proj_bias is not None, t.batch_first,
                                base_head_dim=t.head_dim, **ctx.factory)


def _encoder_layer_fields(t: nn.TransformerEncoderLayer) -> dict[str, int]:
    return {"d_model": t.self_attn.embed_dim, "ffn": t.linear1.out_features}


def _encoder_layer(t: nn.TransformerEncoderLayer, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    heads, _ = _heads(t.self_attn, sizes["d_model"])
    return MuTransformerEncoderLayer(sizes["d_model"], heads, sizes["ffn"], t.dropout.p, t.activation, t.norm1.eps,
                                     t.self_attn.batch_first, t.norm_first, t.linear1.bias is not None,
                                     base_head_dim=t.self_attn.head_dim, **ctx.factory)


def _encoder_fields(t: nn.TransformerEncoder) -> dict[str, int]:
    fields = [_encoder_layer_fields(layer) for layer in t.layers]
    if any(f != fields[0] for f in fields) or (t.norm is not None and _layer_norm_fields(t.norm)["features"]
                                                != fields[0]["d_model"]):
        raise ValueError("TransformerEncoder layers of different widths cannot be shrunk as one")
    return fields[0]


def _encoder(t: nn.TransformerEncoder, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    layers = [_encoder_layer(layer, sizes, ctx) for layer in t.layers]
    norm = None if t.norm is None else _layer_norm(t.norm, {"features": sizes["d_model"]}, ctx)
    encoder = nn.TransformerEncoder(layers[0], len(layers), norm, enable_nested_tensor=False,
                                    mask_check=t.mask_check)
    encoder.layers = nn.ModuleList(layers)  # independently initialised layers, not copies of the first
    return encoder


def _recurrent_fields(t: nn.RNNBase) -> dict[str, int]:
    if getattr(t, "proj_size", 0):
        raise ValueError("an LSTM with proj_size > 0 cannot be shrunk")
    return {"input": t.input_size, "hidden": t.hidden_size}


def _recurrent(t: nn.RNNBase, sizes: dict[str, int], ctx: BuildContext) -> nn.Module:
    """µP of a recurrent layer: ``hidden_size`` is the width, ``input_size`` the producer's. The hidden-to-hidden
    weights are hidden (matrix-like) weights, like a Linear between two widths, and so are the input weights when
    the producer is a width; from a fixed-size input they are input (vector-like) weights, like an input Linear's.
    Initialisation: torch's ``U(±1/sqrt(hidden))`` at the shrunk size, which is µP's 1/fan-in variance for
    matrices; vector-like parameters (biases, input weights from a fixed input) are rescaled to the full model's
    distribution (:func:`~hydro.shrink.mup.rescale_init`). A width mapped to a fixed hidden size (a readout)
    is refused: µP has a readout for Linear only."""
    if "input" in ctx.scaled and "hidden" not in ctx.scaled:
        raise ValueError("it maps a width to a fixed hidden size (its state is the model's output), which µP does "
                         "with a readout (output multiplier 1/width_mult) that exists for Linear only. Fix: produce "
                         "the output with an nn.Linear on the recurrent layer's output")
    options = {"nonlinearity": t.nonlinearity} if isinstance(t, nn.RNN) else {}
    return type(t)(input_size=sizes["input"], hidden_size=sizes["hidden"], num_layers=t.num_layers, bias=t.bias,
                   batch_first=t.batch_first, dropout=t.dropout, bidirectional=t.bidirectional, **options,
                   **ctx.factory)


def _recurrent_rule(output_tree: dict) -> Rule:
    return Rule(_recurrent_fields, (("input", "input"), ("hx", "hidden")), "hidden", _recurrent,
                output_tree=output_tree)


_LINEAR = Rule(lambda t: {"in": t.in_features, "out": t.out_features}, (("input", "in"),), "out", _linear)
_CONV = Rule(lambda t: {"in": t.in_channels, "out": t.out_channels}, (("input", "in"),), "out", _conv)
_BATCH_NORM = Rule(lambda t: {"features": t.num_features}, (("input", "features"),), "features", _batch_norm)

RULES: dict[type[nn.Module], Rule] = {
    nn.Linear: _LINEAR,
    nn.Conv1d: _CONV,
    nn.Conv2d: _CONV,
    nn.BatchNorm1d: _BATCH_NORM,
    nn.BatchNorm2d: _BATCH_NORM,
    nn.LayerNorm: Rule(_layer_norm_fields, (("input", "features"),), "features", _layer_norm),
    nn.GroupNorm: Rule(lambda t: {"features": t.num_channels}, (("input", "features"),), "features", _group_norm),
    nn.Embedding: Rule(lambda t: {"dim": t.embedding_dim}, (("input", None),), "dim", _embedding),
    nn.MultiheadAttention: Rule(lambda t: {"embed": t.embed_dim},
                                (("query", "embed"), ("key", "embed"), ("value", "embed")), "embed", _attention,
                                output_tree={0: True}),
    nn.TransformerEncoderLayer: Rule(_encoder_layer_fields, (("src", "d_model"),), "d_model", _encoder_layer),
    nn.TransformerEncoder: Rule(_encoder_fields, (("src", "d_model"),), "d_model", _encoder),
    # (output, final state); an LSTM's final state is (h, c)
    nn.RNN: _recurrent_rule({0: True, 1: True}),
    nn.GRU: _recurrent_rule({0: True, 1: True}),
    nn.LSTM: _recurrent_rule({0: True, 1: {0: True, 1: True}}),
}


def rule_for(module: nn.Module) -> Rule | None:
    """The rule of ``module``'s exact type (subclasses may change what widths mean), or ``None``."""
    return RULES.get(type(module))
