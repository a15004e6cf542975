"""Offline datasets: scikit-learn's bundled digits and text from the Python standard library's sources."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass
class Split:
    x: Tensor
    y: Tensor


def digits(image: bool = False, seed: int = 0, val_fraction: float = 0.25) -> tuple[Split, Split]:
    """The 1,797 8x8 digits, scaled to [0, 1]: ``x`` ``[N, 64]`` (or ``[N, 1, 8, 8]``), ``y`` ``[N]`` classes."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    if image:
        x = x.view(-1, 1, 8, 8)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(len(y) * (1 - val_fraction))
    return Split(x[order[:cut]], y[order[:cut]]), Split(x[order[cut:]], y[order[cut:]])


def stdlib_text(max_chars: int = 400_000) -> str:
    """Source text of the Python standard library (sorted ``.py`` files of ``os``'s directory), ASCII only."""
    root = os.path.dirname(os.__file__)
    chunks, total = [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            with open(os.path.join(root, name), encoding="utf-8", errors="ignore") as f:
                text = f.read().encode("ascii", "ignore").decode()
            chunks.append(text)
            total += len(text)
            if total >= max_chars:
                break
    return "".join(chunks)[:max_chars]


def char_sequences(text: str, length: int, seed: int = 0, val_fraction: float = 0.1) -> tuple[Split, Split, int]:
    """Non-overlapping windows of ``length + 1`` characters as (input, next-character target) pairs
    ``[N, length]``; characters are byte codes 0..127. Returns train, validation, vocabulary size."""
    codes = torch.tensor(np.frombuffer(text.encode("ascii"), dtype=np.uint8).astype(np.int64))
    count = (len(codes) - 1) // length
    windows = codes[: count * length + 1]
    x = windows[:-1].view(count, length)
    y = windows[1:].view(count, length)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    cut = int(count * (1 - val_fraction))
    return Split(x[order[:cut]], y[order[:cut]]), Split(x[order[cut:]], y[order[cut:]]), 128


class SyntheticImages(torch.utils.data.Dataset):
    """A CIFAR-shaped map-style dataset generated on the fly: ``[3, size, size]`` images of ``classes`` classes,
    each a fixed random class template (low frequency) plus per-sample noise, so a ResNet learns it within a
    few epochs. Sample ``i`` is a function of (``seed``, ``first + i``): any worker, any order, the same
    sample (``first`` skips samples another split holds)."""

    def __init__(self, count: int, classes: int = 10, size: int = 32, noise: float = 1.0, seed: int = 0,
                 first: int = 0) -> None:
        self.count, self.classes, self.size, self.noise, self.seed, self.first = count, classes, size, noise, seed, first
        coarse = torch.randn(classes, 3, 4, 4, generator=torch.Generator().manual_seed(seed))
        self.templates = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bilinear",
                                                         align_corners=False)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        if not 0 <= index < self.count:
            raise IndexError(f"SyntheticImages: index {index} out of range for {self.count} samples")
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.first + index + 1)
        label = int(torch.randint(self.classes, (), generator=generator))
        image = self.templates[label] + self.noise * torch.randn(3, self.size, self.size, generator=generator)
        return image, label


def synthetic_cifar(train: int = 5000, val: int = 1000, seed: int = 0,
                    noise: float = 1.0) -> tuple[SyntheticImages, SyntheticImages]:
    """Train and validation splits of :class:`SyntheticImages` (same class templates, disjoint samples)."""
    return SyntheticImages(train, noise=noise, seed=seed), SyntheticImages(val, noise=noise, seed=seed, first=train)
