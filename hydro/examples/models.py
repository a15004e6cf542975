"""Plain PyTorch models, written as a user would write them (no Hydro code inside)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Multi-layer perceptron: ``[N, *]`` (flattened) -> ``[N, sizes[-1]]``."""

    def __init__(self, sizes: Sequence[int] = (64, 256, 256, 10), dropout: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            if i < len(sizes) - 2:
                layers += [nn.ReLU(), nn.Dropout(dropout)] if dropout else [nn.ReLU()]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


class CNN(nn.Module):
    """Small convolutional classifier for ``[N, C, H, W]`` images (e.g. 8x8 digits)."""

    def __init__(self, in_channels: int = 1, channels: Sequence[int] = (16, 32), num_classes: int = 10) -> None:
        super().__init__()
        c1, c2 = channels
        self.conv1 = nn.Conv2d(in_channels, c1, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c1)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn1(self.conv1(x))))
        x = self.gap(torch.relu(self.bn2(self.conv2(x))))
        return self.fc(x.view(x.size(0), -1))


class TransformerClassifier(nn.Module):
    """Token sequences ``[N, L]`` -> class logits ``[N, num_classes]``: embedding, learned positions,
    Transformer encoder, mean pooling, linear head."""

    def __init__(self, vocab_size: int = 32, d_model: int = 32, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 64, num_classes: int = 4, max_len: int = 64, dropout: float = 0.0,
                 bias: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.randn(max_len, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True, bias=bias)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.size(1)]
        return self.head(self.encoder(x).mean(dim=1))


class CharTransformerLM(nn.Module):
    """Causal character-level language model: tokens ``[N, L]`` -> next-token logits ``[N, L, vocab]``."""

    def __init__(self, vocab_size: int = 96, d_model: int = 64, nhead: int = 4, num_layers: int = 2,
                 dim_feedforward: int = 256, max_len: int = 128, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.size(1)
        positions = torch.arange(length, device=tokens.device)
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        return self.head(self.norm(self.encoder(x, mask=mask, is_causal=True)))


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 convolutions with BatchNorm and a (projected when the shape changes) shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18: ``[N, 3, 32, 32]`` -> ``[N, num_classes]`` (3x3 stem, no max-pool, stages of
    ``width``, 2, 4, 8 x ``width`` channels)."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, channels = [], width
        for stage, stride in enumerate((1, 2, 2, 2)):
            out = width * 2 ** stage
            blocks += [BasicBlock(channels, out, stride), BasicBlock(out, out)]
            channels = out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))
