"""Test models of the Model Shrinker, each with a ``width`` argument (the standard-parametrization model of
that width) so that ``hydro.shrink(Model(W), S)`` can be compared with ``Model(W // S)``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MLP(nn.Module):
    """``[N, d_in] -> [N, d_out]``. The readout is defined first: shrink must find it by data flow. (Hidden
    layers in a Sequential: hydro.fuse cannot fuse a model holding an nn.ModuleList.)"""

    def __init__(self, width: int = 64, d_in: int = 16, d_out: int = 10, depth: int = 3) -> None:
        super().__init__()
        self.readout = nn.Linear(width, d_out)
        self.input = nn.Linear(d_in, width)
        self.hidden = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth - 2)])

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.input(x))
        for layer in self.hidden:
            h = F.relu(layer(h))
        return self.readout(h)


class CNN(nn.Module):
    """``[N, 1, 8, 8] -> [N, classes]``: conv, BatchNorm, depthwise conv, GroupNorm, residual, pool, flatten."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, groups=width)
        self.gn = nn.GroupNorm(4, width)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(4 * width, 2 * width)
        self.out = nn.Linear(2 * width, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = h + F.relu(self.gn(self.conv2(h)))
        h = torch.flatten(self.pool(h), 1)
        return self.out(F.relu(self.fc(h)))


class CharTransformer(nn.Module):
    """Causal character LM ``[N, context] tokens -> [N, context, vocab]`` logits: embedding + learned positions
    (a bare parameter), pre-LN TransformerEncoder with ``width // head_dim`` heads, final LayerNorm, readout."""

    def __init__(self, width: int = 64, vocab: int = 32, context: int = 16, layers: int = 2, head_dim: int = 16,
                 ffn_mult: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(0.1 * torch.randn(context, width))
        layer = nn.TransformerEncoderLayer(width, width // head_dim, ffn_mult * width, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.readout = nn.Linear(width, vocab)
        self.context = context

    def forward(self, tokens: Tensor) -> Tensor:
        h = self.embed(tokens) + self.pos
        # The causal mask is made in forward (a constant of the graph, shared by fused members), not kept as a
        # buffer: hydro.fuse stacks buffers per member and fuses a layer given a stacked mask with torch.vmap.
        mask = nn.Transformer.generate_square_subsequent_mask(self.context)
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.readout(self.norm(h))


class RecurrentLM(nn.Module):
    """Character LM ``[N, context] tokens -> [N, context, vocab]`` logits: embedding of size ``width``, a
    ``kind`` (``"gru"``/``"lstm"``) of hidden size ``width``, readout."""

    def __init__(self, width: int = 64, vocab: int = 32, kind: str = "gru", layers: int = 1) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[kind](width, width, layers, batch_first=True)
        self.readout = nn.Linear(width, vocab)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.readout(self.rnn(self.embed(tokens))[0])
