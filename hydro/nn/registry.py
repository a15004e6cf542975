"""Which fused twin replaces which ``torch.nn`` layer."""
from __future__ import annotations

from torch import nn

from . import stateless
from .attention import MultiheadAttention
from .base import FusedModule
from .conv import Conv1d, Conv2d
from .embedding import Embedding
from .linear import Linear
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .transformer import TransformerEncoder, TransformerEncoderLayer

_TWINS: dict[type[nn.Module], type[FusedModule]] = {
    nn.Linear: Linear,
    nn.modules.linear.NonDynamicallyQuantizableLinear: Linear,
    nn.Conv1d: Conv1d,
    nn.Conv2d: Conv2d,
    nn.BatchNorm1d: BatchNorm1d,
    nn.BatchNorm2d: BatchNorm2d,
    nn.LayerNorm: LayerNorm,
    nn.GroupNorm: GroupNorm,
    nn.Embedding: Embedding,
    nn.MultiheadAttention: MultiheadAttention,
    nn.TransformerEncoderLayer: TransformerEncoderLayer,
    nn.TransformerEncoder: TransformerEncoder,
    nn.Dropout: stateless.Dropout,
    nn.AlphaDropout: stateless.Dropout,
    nn.Dropout1d: stateless.ChannelDropout,
    nn.Dropout2d: stateless.ChannelDropout,
    nn.Flatten: stateless.Flatten,
    nn.Softmax: stateless.Softmax,
    nn.LogSoftmax: stateless.Softmax,
    nn.Softmin: stateless.Softmax,
    **{pool: stateless.Channelwise for pool in (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
                                                nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
                                                nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)},
}

# Stateless layers that act element by element: applied unchanged to fused or shared tensors.
ELEMENTWISE: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Hardtanh, nn.Hardsigmoid, nn.Hardswish, nn.Softplus, nn.Softsign, nn.Tanhshrink,
    nn.Threshold, nn.LogSigmoid, nn.Hardshrink, nn.Softshrink,
)

# Layers whose output differs between members even when their input is shared.
RANDOM: tuple[type[nn.Module], ...] = (nn.Dropout, nn.AlphaDropout, nn.Dropout1d, nn.Dropout2d)


def twin_type(module: nn.Module) -> type[FusedModule] | None:
    """The fused twin class for ``module``'s exact type, or ``None`` (then the vmap fallback applies)."""
    return _TWINS.get(type(module))


def register_twin(module_type: type[nn.Module], twin: type[FusedModule]) -> None:
    """Fuse ``module_type`` with ``twin`` (its ``from_module`` builds the twin from one member)."""
    _TWINS[module_type] = twin


def is_registered(module: nn.Module) -> bool:
    return type(module) in _TWINS
