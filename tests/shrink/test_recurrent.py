"""Shrink rules of nn.RNN/GRU/LSTM: hidden_size is the width, input_size follows its producer, µP shapes as for
Linear (hidden-to-hidden weights are matrices), and shrunk recurrent models fuse and train."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from shrink_models import RecurrentLM
from torch import nn

import hydro
import hydro.optim
from hydro.shrink import ShrinkError
from hydro.shrink.mup import mu_shape


class SequenceClassifier(nn.Module):
    """``[N, L, 5]`` features -> a 2-layer bidirectional recurrent layer -> last step -> 3 classes."""

    def __init__(self, kind=nn.GRU, hidden: int = 64):
        super().__init__()
        self.rnn = kind(5, hidden, 2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, 3)

    def forward(self, x):
        return self.out(self.rnn(x)[0][:, -1])


class LastState(nn.Module):
    """Tokens -> embedding -> LSTM -> final hidden state (``(h, c)`` unpacked) -> classes."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 32)
        self.rnn = nn.LSTM(32, 64, batch_first=True)
        self.out = nn.Linear(64, 3)

    def forward(self, tokens):
        _, (h, _) = self.rnn(self.embed(tokens))
        return self.out(h[-1])


def _shrink_quietly(model: nn.Module, scale: int) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every width scaled: nothing kept, nothing warned
        return hydro.shrink(model, scale)


@pytest.mark.parametrize("kind", [nn.GRU, nn.LSTM, nn.RNN])
def test_hidden_size_is_the_width_and_recurrent_weights_are_hidden_matrices(kind):
    torch.manual_seed(0)
    small = _shrink_quietly(SequenceClassifier(kind), 4)
    rnn = small.rnn
    assert (type(rnn), rnn.input_size, rnn.hidden_size, rnn.num_layers, rnn.bidirectional) == (kind, 5, 16, 2, True)
    gates = {nn.GRU: 3, nn.LSTM: 4, nn.RNN: 1}[kind]
    shapes = {name: mu_shape(p) for name, p in rnn.named_parameters()}
    assert shapes["weight_hh_l1_reverse"].base == (gates * 64, 64)  # hidden x hidden: matrix-like
    assert shapes["weight_ih_l1"].base == (gates * 64, 128)  # from the previous layer (a width): matrix-like
    assert shapes["weight_ih_l0"].base == (gates * 64, None)  # from the fixed input: vector-like
    assert shapes["bias_hh_l0"].base == (gates * 64,)
    assert shapes["weight_hh_l0"].multipliers("adam") == (4.0, 0.25)  # as a hidden Linear's weight
    assert shapes["weight_ih_l0"].multipliers("adam") == (1.0, 1.0)  # as an input Linear's weight
    # vector-like parameters keep the full model's initial distribution: U(±1/sqrt(64)), not U(±1/sqrt(16))
    for name in ("weight_ih_l0", "bias_ih_l0", "bias_hh_l1_reverse"):
        bound = getattr(rnn, name).abs().max().item()
        assert 0.8 / 64 ** 0.5 < bound <= 1 / 64 ** 0.5, name
    assert 1 / 64 ** 0.5 < rnn.weight_hh_l0.abs().max().item() <= 1 / 16 ** 0.5  # matrices: torch's, at 16
    assert small(torch.randn(2, 7, 5)).shape == (2, 3)


def test_input_size_follows_its_producer_and_the_final_state_carries_the_width():
    model = LastState()
    small = _shrink_quietly(model, 4)
    assert (small.embed.embedding_dim, small.rnn.input_size, small.rnn.hidden_size, small.out.in_features) == \
        (8, 8, 16, 16)
    tokens = torch.randint(0, 20, (3, 6))
    assert small(tokens).shape == (3, 3)
    full = hydro.shrink(model, 1)  # the model itself, in µP
    torch.testing.assert_close(full(tokens), model(tokens), rtol=0, atol=0)


def test_a_width_mapped_to_a_fixed_hidden_size_is_kept_or_refused():
    class StateOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(5, 64)
            self.rnn = nn.GRU(64, 3)

        def forward(self, x):
            return self.rnn(self.inp(x))[1]

    with pytest.raises(ShrinkError, match=r"layer 'rnn' \(GRU\).*fixed hidden size.*nn.Linear"):
        hydro.shrink(StateOut(), 4, strict=True)
    with pytest.raises(ShrinkError, match=r"^hydro.shrink: at scale 4, StateOut has no width left to shrink"):
        hydro.shrink(StateOut(), 4)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_fused_shrunk_recurrent_models_train(kind):
    """Next-token prediction on a repeating sequence: 3 fused S=4 surrogates, each at its own learning rate."""
    torch.manual_seed(0)
    target = RecurrentLM(64, vocab=8, kind=kind)
    fused = hydro.fuse([hydro.shrink(target, 4) for _ in range(3)])
    assert not fused.fallbacks
    optimizer = hydro.optim.Adam(fused.parameters(), lr=[3e-3, 1e-2, 3e-2])
    sequence = torch.arange(33) % 8
    x, y = sequence[:-1].view(4, 8), sequence[1:].view(4, 8)
    losses = []
    for _ in range(40):
        out = fused(x)
        loss = torch.stack([F.cross_entropy(o.reshape(-1, 8), y.reshape(-1)) for o in out])
        optimizer.zero_grad()
        loss.sum().backward()
        optimizer.step()
        losses.append(loss.detach())
    assert (losses[-1] < 0.25 * losses[0]).all(), (losses[0], losses[-1])


def test_an_initial_state_sized_from_the_layer_follows_the_shrunk_hidden_size():
    """``torch.zeros(layers, N, self.rnn.hidden_size)`` reads the surrogate's own (shrunk) layer, in the surrogate
    and in its fused graph."""
    class WithState(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(5, 32, 2, batch_first=True)
            self.out = nn.Linear(32, 3)

        def forward(self, x):
            h0 = torch.zeros(self.rnn.num_layers, x.size(0), self.rnn.hidden_size)
            return self.out(self.rnn(x, h0)[0][:, -1])

    members = [_shrink_quietly(WithState(), 4) for _ in range(2)]
    x = torch.randn(3, 6, 5)
    fused = hydro.fuse(members)
    assert not fused.fallbacks and fused.rnn.hidden_size == 8
    for i, member in enumerate(members):
        torch.testing.assert_close(fused(x)[i], member(x), atol=1e-5, rtol=1e-5)
