"""Fused ``RNN``, ``GRU`` and ``LSTM``: per time step one batched matmul over every member and direction.

The input projections of all time steps (both directions) are one batched matmul before the time loop; the loop
then runs ``hidden @ weight_hh`` for all ``F * directions`` recurrences at once (``torch.baddbmm``).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from .base import FusedModule, Unfusable, expand_members, factory_of, stacked_parameter
from .linear import fused_linear

_OPTIONS = ("input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional")


class _Recurrent(FusedModule):
    """``F`` members of a ``torch.nn`` recurrent layer; same arguments, forward and parameter names.

    Input ``[F, L, N, H_in]`` (``[F, N, L, H_in]`` with ``batch_first``, ``[F, L, H_in]`` unbatched; or a
    shared member-shaped input), initial state ``[F, D*num_layers, N, H]`` (or shared ``[D*num_layers, N, H]``;
    ``None``: zeros). Returns the output ``[F, L, N, D*H]`` (``[F, N, L, D*H]`` with ``batch_first``) and the
    final state ``[F, D*num_layers, N, H]`` — ``D = 2`` if ``bidirectional`` else 1. Parameters: torch's
    ``weight_ih_l{k}[_reverse] [F, G*H, in]``, ``weight_hh_l{k}[_reverse] [F, G*H, H]``, biases ``[F, G*H]``
    (``G`` gates). Dropout between layers draws independent masks per member. ``PackedSequence`` inputs are
    refused (pad the sequences instead).
    """

    supports_shared_input = True
    data_args = 2  # the input and the initial state both carry member data
    _torch_type: type[nn.RNNBase]
    _state_count = 1  # tensors in the state: LSTM (h, c) 2

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, *,
                 num_members: int, device=None, dtype=None, **options) -> None:
        super().__init__(num_members)
        with warnings.catch_warnings():  # torch's warnings (dropout with one layer) reached the user's own layer
            warnings.simplefilter("ignore")
            # a meta-device member validates the arguments as torch does and names the parameters
            spec = self._torch_type(**dict(zip(_OPTIONS, (input_size, hidden_size, num_layers, bias, batch_first,
                                                          dropout, bidirectional))), **options, device="meta")
        for name in _OPTIONS + tuple(options):
            setattr(self, name, getattr(spec, name))
        self.num_directions = 2 if bidirectional else 1
        factory = {"device": device, "dtype": dtype}
        for name, param in spec.named_parameters():
            self.register_parameter(name, stacked_parameter(tuple(param.shape), num_members, factory))
        self.reset_parameters()

    @classmethod
    def from_module(cls, template: nn.RNNBase, num_members: int) -> "_Recurrent":
        return cls(*(getattr(template, name) for name in _OPTIONS), num_members=num_members,
                   **cls._options_of(template), **factory_of(template))

    @classmethod
    def _options_of(cls, template: nn.RNNBase) -> dict:
        """The layer type's own constructor options beyond :data:`_OPTIONS`."""
        return {}

    def member_module(self) -> nn.RNNBase:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._torch_type(**{name: getattr(self, name) for name in _OPTIONS}, **self._options_of(self),
                                    **factory_of(self))

    def forward(self, input: Tensor, hx=None):
        if isinstance(input, PackedSequence):
            raise TypeError(f"hydro.nn.{type(self).__name__}: PackedSequence inputs cannot be fused. Fix: pass the "
                            f"padded batch (torch.nn.utils.rnn.pad_packed_sequence) and mask the padded steps")
        member_ndim = input.dim() if self.shared_input else input.dim() - 1
        batched = member_ndim == 3
        x = input if batched else input.unsqueeze(-2)
        if batched and self.batch_first:
            x = x.transpose(-3, -2)  # time-major: [F, L, N, in] (or shared [L, N, in])
        members, directions, hidden = self.num_members, self.num_directions, self.hidden_size
        batch = x.shape[-2]
        states = self._initial_states(hx, member_ndim, batched, batch, x)
        finals: list[list[Tensor]] = [[] for _ in states]
        for layer in range(self.num_layers):
            names = [f"l{layer}{'_reverse' if d else ''}" for d in range(directions)]
            layer_states = [s[:, layer * directions:(layer + 1) * directions].flatten(0, 1) for s in states]
            steps = self._input_steps(x, names, shared=self.shared_input and layer == 0)
            weight_hh = torch.stack([getattr(self, "weight_hh_" + n) for n in names], 1).flatten(0, 1)
            bias_hh = torch.stack([getattr(self, "bias_hh_" + n) for n in names], 1).flatten(0, 1) \
                if self.bias else None
            outputs, last = self._scan(steps, weight_hh.transpose(1, 2), bias_hh, layer_states)
            for final, state in zip(finals, last):
                final.append(state.view(members, directions, batch, hidden))
            x = self._layer_output(outputs)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        out = x if not batched else (x.transpose(1, 2) if self.batch_first else x)
        finals_ = [torch.cat(final, 1) for final in finals]
        if not batched:
            out, finals_ = out.squeeze(2), [f.squeeze(2) for f in finals_]
        return out, self._pack_state(finals_)

    def _initial_states(self, hx, state_ndim: int, batched: bool, batch: int, like: Tensor) -> list[Tensor]:
        """The initial state tensor(s) as ``[F, D*num_layers, N, H]``; zeros where ``hx`` is ``None``."""
        shape = (self.num_members, self.num_directions * self.num_layers, batch, self.hidden_size)
        states = [torch.zeros(shape, dtype=like.dtype, device=like.device)] * self._state_count if hx is None \
            else self._unpack_state(hx)
        result = []
        for s in states:
            if s.dim() == state_ndim:  # shared by all members
                s = expand_members(s, self.num_members)
            result.append(s if batched or hx is None else s.unsqueeze(2))
        return result

    def _input_steps(self, x: Tensor, names: list[str], *, shared: bool) -> Tensor:
        """The input projections of every time step and direction, ``[L, F*D, N, G*H]``; the reverse
        direction's in reverse time order (its step ``t`` is time ``L-1-t``)."""
        weight = torch.cat([getattr(self, "weight_ih_" + n) for n in names], 1)
        bias = torch.cat([self._input_bias(n) for n in names], 1) if self.bias else None
        projected = fused_linear(x, weight, bias, shared=shared)  # [F, L, N, D*G*H]
        steps = projected.unflatten(-1, (self.num_directions, -1)).permute(1, 0, 3, 2, 4)  # [L, F, D, N, G*H]
        if self.num_directions == 2:
            steps = torch.stack([steps[:, :, 0], steps[:, :, 1].flip(0)], 2)
        return steps.reshape(steps.shape[0], -1, *steps.shape[3:])

    def _input_bias(self, name: str) -> Tensor:
        """The bias added to the input projection of direction ``name``."""
        return getattr(self, "bias_ih_" + name)

    def _layer_output(self, outputs: Tensor) -> Tensor:
        """``[L, F*D, N, H]`` step outputs (reverse direction in reverse time) as ``[F, L, N, D*H]``."""
        length, _, batch, hidden = outputs.shape
        outputs = outputs.view(length, self.num_members, self.num_directions, batch, hidden)
        if self.num_directions == 2:
            outputs = torch.stack([outputs[:, :, 0], outputs[:, :, 1].flip(0)], 2)
        return outputs.permute(1, 0, 3, 2, 4).reshape(self.num_members, length, batch, -1)

    def _unpack_state(self, hx) -> list[Tensor]:
        return [hx]

    def _pack_state(self, states: list[Tensor]):
        return states[0]

    def _scan(self, steps: Tensor, weight_hh_t: Tensor, bias_hh: Tensor | None,
              states: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
        """Run the recurrence over ``steps`` ``[L, B, N, G*H]`` from ``states`` (each ``[B, N, H]``) with
        ``weight_hh_t`` ``[B, H, G*H]``; returns every step's hidden state ``[L, B, N, H]`` and the final
        state(s)."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, bias={self.bias}, "
                f"batch_first={self.batch_first}, dropout={self.dropout}, bidirectional={self.bidirectional}, "
                + super().extra_repr())


def _hidden_product(h: Tensor, weight_hh_t: Tensor, add: Tensor | None) -> Tensor:
    """``add + h @ weight_hh_t`` for all recurrences at once (``[B, N, H] x [B, H, G*H]``)."""
    return torch.bmm(h, weight_hh_t) if add is None else torch.baddbmm(add, h, weight_hh_t)


class _SummedBiases(_Recurrent):
    """A cell whose gates take ``W_ih x + b_ih + W_hh h + b_hh``: both biases are added to the input projection,
    so a time step is one ``baddbmm`` of the projected input and the hidden state."""

    def _input_bias(self, name: str) -> Tensor:
        return getattr(self, "bias_ih_" + name) + getattr(self, "bias_hh_" + name)

    def _scan(self, steps, weight_hh_t, bias_hh, states):
        state = states
        outputs = []
        for step in steps:
            state = self._cell(_hidden_product(state[0], weight_hh_t, step), state)
            outputs.append(state[0])
        return torch.stack(outputs), state

    def _cell(self, gates: Tensor, state: list[Tensor]) -> list[Tensor]:
        raise NotImplementedError


class RNN(_SummedBiases):
    """``F`` members of ``nn.RNN`` (``nonlinearity`` ``'tanh'`` or ``'relu'``); see :class:`_Recurrent`."""

    _torch_type = nn.RNN

    @classmethod
    def _options_of(cls, template) -> dict:
        return {"nonlinearity": template.nonlinearity}

    def _cell(self, gates, state):
        return [torch.tanh(gates) if self.nonlinearity == "tanh" else torch.relu(gates)]


class LSTM(_SummedBiases):
    """``F`` members of ``nn.LSTM``; state ``(h, c)``, each ``[F, D*num_layers, N, H]``. ``proj_size`` is not
    fused (:class:`Unfusable`: the binder falls back to ``torch.vmap``)."""

    _torch_type = nn.LSTM
    _state_count = 2

    @classmethod
    def from_module(cls, template: nn.LSTM, num_members: int) -> "LSTM":
        if template.proj_size:
            raise Unfusable("LSTM with proj_size > 0")
        return super().from_module(template, num_members)

    def _unpack_state(self, hx) -> list[Tensor]:
        return list(hx)

    def _pack_state(self, states):
        return tuple(states)

    def _cell(self, gates, state):
        i, f, g, o = gates.chunk(4, -1)
        c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
        return [torch.sigmoid(o) * torch.tanh(c), c]


class GRU(_Recurrent):
    """``F`` members of ``nn.GRU``; see :class:`_Recurrent`."""

    _torch_type = nn.GRU

    def _scan(self, steps, weight_hh_t, bias_hh, states):
        h = states[0]
        bias = None if bias_hh is None else bias_hh.unsqueeze(1)
        outputs = []
        for step in steps:
            hidden = _hidden_product(h, weight_hh_t, bias)
            step_rz, step_n = step.split([2 * self.hidden_size, self.hidden_size], -1)
            hidden_rz, hidden_n = hidden.split([2 * self.hidden_size, self.hidden_size], -1)
            reset, update = torch.sigmoid(step_rz + hidden_rz).chunk(2, -1)
            new = torch.tanh(step_n + reset * hidden_n)
            h = new + update * (h - new)
            outputs.append(h)
        return torch.stack(outputs), [h]
