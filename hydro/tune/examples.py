"""Bundled offline workloads for ``hydro tune --example``: each a ``TuneSpec`` and a Ray Tune search space."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from ray import tune
from torch import nn

from hydro.examples.data import Split, char_sequences, digits, stdlib_text
from hydro.examples.models import CNN, MLP, CharTransformerLM
from hydro.examples.recurrent import SequenceClassifier
from hydro.trial.spec import TuneSpec, accuracy


def _sgd(params, config):
    return torch.optim.SGD(params, lr=config["lr"], momentum=config["momentum"], weight_decay=config["weight_decay"])


def _adamw(params, config):
    return torch.optim.AdamW(params, lr=config["lr"], weight_decay=config["weight_decay"])


_SGD_SPACE = {"lr": tune.loguniform(1e-3, 1.0), "momentum": tune.choice([0.0, 0.5, 0.9]),
              "weight_decay": tune.choice([0.0, 1e-4, 1e-3])}


def _digits_flat():
    return digits()


def _digits_images():
    return digits(image=True)


def _digit_rows():
    return tuple(Split(split.x.view(-1, 8, 8), split.y) for split in digits())


def _text():
    train, val, _ = char_sequences(stdlib_text(120_000), length=32)
    return train, val


def _mlp(hidden: int, config):
    return MLP((64, hidden, hidden, 10))


def _cnn(config):
    return CNN(channels=(64, 128))


def _char_lm(config):
    return CharTransformerLM(vocab_size=128, d_model=64, nhead=4, num_layers=2, dim_feedforward=256, max_len=32)


def digits_mlp(epochs: int = 10, hidden: int = 512) -> tuple[TuneSpec, dict]:
    """A 64-hidden-hidden-10 MLP on scikit-learn's digits, SGD (lr, momentum, weight decay); validation
    accuracy."""
    spec = TuneSpec(model=functools.partial(_mlp, hidden), data=_digits_flat, loss=nn.CrossEntropyLoss(),
                    optimizer=_sgd, metric="val_acc", mode="max", metrics={"val_acc": accuracy}, epochs=epochs,
                    batch_size=64)
    return spec, dict(_SGD_SPACE)


def _gru(config):
    return SequenceClassifier(features=8, hidden=64, classes=10, kind="gru")


def digits_gru(epochs: int = 4) -> tuple[TuneSpec, dict]:
    """A GRU (hidden size 64) reading 8x8 digits row by row, a readout of its last step, AdamW; validation
    accuracy."""
    spec = TuneSpec(model=_gru, data=_digit_rows, loss=nn.CrossEntropyLoss(), optimizer=_adamw, metric="val_acc",
                    mode="max", metrics={"val_acc": accuracy}, epochs=epochs, batch_size=64)
    return spec, {"lr": tune.loguniform(1e-3, 1e-1), "weight_decay": tune.choice([0.0, 0.01, 0.1])}


def digits_cnn(epochs: int = 6) -> tuple[TuneSpec, dict]:
    """A two-block CNN (64, 128 channels, BatchNorm) on 8x8 digits, SGD; validation accuracy."""
    spec = TuneSpec(model=_cnn, data=_digits_images, loss=nn.CrossEntropyLoss(), optimizer=_sgd, metric="val_acc",
                    mode="max", metrics={"val_acc": accuracy}, epochs=epochs, batch_size=64)
    return spec, dict(_SGD_SPACE)


def char_lm(epochs: int = 3) -> tuple[TuneSpec, dict]:
    """A 2-layer causal character Transformer (d=64) on Python standard-library source, AdamW; validation
    loss (nats per character)."""
    spec = TuneSpec(model=_char_lm, data=_text, loss=_token_loss, optimizer=_adamw, metric="val_loss", mode="min",
                    epochs=epochs, batch_size=32)
    return spec, {"lr": tune.loguniform(1e-4, 1e-2), "weight_decay": tune.choice([0.0, 0.01, 0.1])}


def _token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of next-character logits ``[N, L, V]`` against targets ``[N, L]``."""
    return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


EXAMPLES: dict[str, Callable[[int], tuple[TuneSpec, dict]]] = {
    "digits-mlp": digits_mlp, "digits-cnn": digits_cnn, "char-lm": char_lm, "digits-gru": digits_gru,
}
