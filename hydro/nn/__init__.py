"""Fused layers: ``F`` members of a ``torch.nn`` layer in one module, trial dimension first.

Inputs and outputs are ``[F, N, ...]``; every parameter and buffer is the members' tensors stacked along
a new leading dimension, under the torch layer's own name.
"""
from .attention import MultiheadAttention
from .base import FusedModule, Unfusable
from .conv import Conv1d, Conv2d
from .embedding import Embedding
from .linear import Linear
from .normalization import BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm
from .recurrent import GRU, LSTM, RNN
from .registry import fuse_layer, register_twin
from .stateless import ChannelDropout, Channelwise, Dropout, Flatten, Softmax
from .transformer import TransformerEncoder, TransformerEncoderLayer
from .vmap import VmapModule

__all__ = [
    "BatchNorm1d", "BatchNorm2d", "ChannelDropout", "Channelwise", "Conv1d", "Conv2d", "Dropout", "Embedding",
    "Flatten", "FusedModule", "GRU", "GroupNorm", "LSTM", "LayerNorm", "Linear", "MultiheadAttention", "RNN",
    "Softmax", "TransformerEncoder", "TransformerEncoderLayer", "Unfusable", "VmapModule", "fuse_layer", "register_twin",
]
