"""A plain PyTorch recurrent classifier, written as a user would write it (no Hydro code inside)."""
from __future__ import annotations

import torch
from torch import nn


class SequenceClassifier(nn.Module):
    """``[N, L, features]`` sequences -> ``[N, classes]``: a batch-first ``nn.GRU`` or ``nn.LSTM`` (``kind``) and
    a linear readout of its output at the last step."""

    def __init__(self, features: int = 8, hidden: int = 128, classes: int = 10, kind: str = "gru",
                 num_layers: int = 1) -> None:
        super().__init__()
        recurrent = {"gru": nn.GRU, "lstm": nn.LSTM}[kind]
        self.rnn = recurrent(features, hidden, num_layers, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])
