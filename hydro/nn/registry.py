"""Which fused twin replaces which ``torch.nn`` layer."""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from . import stateless
from .attention import MultiheadAttention
from .base import FusedModule, Unfusable, uninitialised
from .conv import Conv1d, Conv2d
from .embedding import Embedding
from .linear import Linear
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .recurrent import GRU, LSTM, RNN
from .transformer import TransformerEncoder, TransformerEncoderLayer
from .vmap import VmapModule

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
    nn.RNN: RNN,
    nn.GRU: GRU,
    nn.LSTM: LSTM,
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


def all_tensors(module: nn.Module) -> dict[str, Tensor]:
    """Every parameter and buffer (non-persistent ones too) by qualified name, shared ones under each name."""
    return {**dict(module.named_parameters(remove_duplicate=False)),
            **dict(module.named_buffers(remove_duplicate=False))}


def fuse_layer(modules: list[nn.Module]) -> tuple[nn.Module, str | None]:
    """The fused twin of ``F`` same-configured layers holding their tensors stacked, and — when the generic
    ``torch.vmap`` fallback had to be used — the reason. Element-wise stateless layers come back as is."""
    template, count = modules[0], len(modules)
    if isinstance(template, ELEMENTWISE):
        return copy.deepcopy(template), None
    twin_cls, twin, fallback = twin_type(template), None, None
    if twin_cls is not None:
        try:
            with uninitialised():  # load_stacked below gives every tensor its members' values
                twin = twin_cls.from_module(template, count)
        except Unfusable as reason:
            fallback = f"{reason}: fused with torch.vmap"
    else:
        fallback = f"no fused twin for {type(template).__name__}: fused with torch.vmap"
    if twin is None:
        twin = VmapModule(template, count) if all_tensors(template) else stateless.Vmapped(copy.deepcopy(template), count)
    load_stacked(twin, modules)
    return twin, fallback


@torch.no_grad()
def load_stacked(dst: nn.Module, members: list[nn.Module]) -> None:
    """Copy the members' tensors, stacked, into ``dst`` (same names); parameters keep their attributes."""
    distinct = {id(m): all_tensors(m) for m in members}
    sources = [distinct[id(m)] for m in members]
    for name, tensor in all_tensors(dst).items():
        if len(distinct) == 1:  # one module F times: its tensors broadcast
            tensor.copy_(sources[0][name].detach().unsqueeze(0).expand_as(tensor))
        else:
            tensor.copy_(torch.stack([src[name].detach() for src in sources]))
        if isinstance(tensor, nn.Parameter):
            tensor.requires_grad_(sources[0][name].requires_grad)
            tensor.__dict__.update(sources[0][name].__dict__)  # e.g. µP shape information
