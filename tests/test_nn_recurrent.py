"""hydro.nn.RNN/GRU/LSTM: outputs, final states and all gradients equal each member's torch layer, in every layout
torch offers; one batched matmul per time step for all members and directions."""
import pytest
import torch
from fusion_checks import assert_fused_equals_alone
from test_nn_layers import MEMBERS, check_layer
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import hydro
from hydro.nn import GRU, LSTM, RNN, FusedModule, VmapModule, fuse_layer

TYPES = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN, "rnn_relu": lambda *a, **k: nn.RNN(*a, nonlinearity="relu",
                                                                                          **k)}
IN, HIDDEN, LENGTH, BATCH = 3, 4, 5, 2


def _flat(out, state, fused: bool):
    """Output and final state(s) as one tensor per member (``[F, ...]`` when ``fused``)."""
    parts = [out, *(state if isinstance(state, tuple) else (state,))]
    return torch.cat([p.flatten(1) if fused else p.flatten() for p in parts], -1)


def _call(module, x, *state):
    hx = None if not state else (state[0] if len(state) == 1 else tuple(state))
    return _flat(*module(x, hx), isinstance(module, FusedModule))


def _inputs(batch_first: bool, batched: bool = True, states: int = 0, layers: int = 2, directions: int = 1):
    shape = ((BATCH, LENGTH) if batch_first else (LENGTH, BATCH)) if batched else (LENGTH,)
    state = (directions * layers, BATCH, HIDDEN) if batched else (directions * layers, HIDDEN)
    return lambda: (torch.randn(*shape, IN), *(torch.randn(*state) for _ in range(states)))


@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_output_state_and_gradients_match_torch(kind, batch_first, bidirectional):
    twin, fallback = check_layer(lambda: TYPES[kind](IN, HIDDEN, 2, batch_first=batch_first,
                                                     bidirectional=bidirectional),
                                 _inputs(batch_first), _call)
    assert fallback is None and isinstance(twin, (GRU, LSTM, RNN))


@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("layers,bias", [(1, False), (3, True)])
def test_given_initial_states_layers_and_bias(kind, layers, bias):
    states = 2 if kind == "lstm" else 1
    check_layer(lambda: TYPES[kind](IN, HIDDEN, layers, bias=bias, bidirectional=True),
                _inputs(False, states=states, layers=layers, directions=2), _call)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_unbatched_and_shared_inputs(kind):
    states = 2 if kind == "lstm" else 1
    check_layer(lambda: TYPES[kind](IN, HIDDEN, 2), _inputs(False, batched=False, states=states), _call)
    twin, _ = check_layer(lambda: TYPES[kind](IN, HIDDEN, 2, batch_first=True), _inputs(True), _call, shared=True)
    assert twin.shared_input


def test_dropout_between_layers_differs_per_member_and_is_off_in_eval():
    torch.manual_seed(0)
    layers = [nn.GRU(IN, HIDDEN, 2, dropout=0.5) for _ in range(MEMBERS)]
    for layer in layers:  # same weights: any difference between members comes from their dropout masks
        layer.load_state_dict(layers[0].state_dict())
    twin, _ = fuse_layer(layers)
    x = torch.randn(LENGTH, BATCH, IN)
    out = twin.train()(torch.stack([x] * MEMBERS))[0]
    assert all(not torch.allclose(out[0], out[i]) for i in range(1, MEMBERS))
    twin.eval()
    evaluated = twin(torch.stack([x] * MEMBERS))[0]
    torch.testing.assert_close(evaluated[1], layers[1].eval()(x)[0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out[0], evaluated[0])


def test_one_batched_matmul_per_time_step_for_all_members_and_directions():
    """Per layer: one matmul for the input projections of every step, then one per time step, whatever F and D."""
    class MatmulCount(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
                                       torch.ops.aten.baddbmm):
                self.count += 1
            return func(*args, **(kwargs or {}))

    for members in (1, 6):
        twin = LSTM(IN, HIDDEN, 2, bidirectional=True, num_members=members)
        with MatmulCount() as counter:
            twin(torch.randn(members, LENGTH, BATCH, IN))
        assert counter.count == 2 * (1 + LENGTH)


def test_proj_size_falls_back_and_packed_sequences_are_refused():
    twin, fallback = fuse_layer([nn.LSTM(IN, HIDDEN, proj_size=2) for _ in range(2)])
    assert isinstance(twin, VmapModule) and "proj_size" in fallback
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(LENGTH, BATCH, IN), [LENGTH, 3])
    with pytest.raises(TypeError, match="PackedSequence inputs cannot be fused.*pad_packed_sequence"):
        GRU(IN, HIDDEN, num_members=2)(packed)


def test_direct_construction_initialises_like_torch():
    torch.manual_seed(1)
    fused = LSTM(IN, HIDDEN, 2, bidirectional=True, num_members=2)
    torch.manual_seed(1)
    refs = [nn.LSTM(IN, HIDDEN, 2, bidirectional=True) for _ in range(2)]
    assert list(fused.state_dict()) == list(refs[0].state_dict())
    for i, ref in enumerate(refs):
        for name, tensor in ref.state_dict().items():
            assert torch.equal(fused.state_dict()[name][i], tensor), name


class Classifier(nn.Module):
    """Tokens -> embedding -> recurrent layer (initial state made in forward) -> last step's state -> classes."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.embed = nn.Embedding(11, 8)
        self.rnn = TYPES[kind](8, 6, 2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(12 + 6, 3)

    def forward(self, tokens):
        x = self.embed(tokens)
        h0 = torch.zeros(4, x.size(0), 6)  # shared by all members
        out, state = self.rnn(x, (h0, h0) if self.kind == "lstm" else h0)
        last = state[0][-1] if self.kind == "lstm" else state[-1]
        return self.out(torch.cat([out[:, -1], last], -1))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_fused_models_train_like_their_members_alone(kind):
    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randint(0, 11, (4, 7), generator=g), torch.randint(0, 3, (4,), generator=g)

    fused = assert_fused_equals_alone(lambda: Classifier(kind), batch, loss_fn=nn.CrossEntropyLoss())
    assert isinstance(fused.rnn, (GRU, LSTM)) and not fused.fallbacks
    state = fused.state_dict()
    for i, member in enumerate(hydro.unfuse(fused)):  # state dict round trip: member i is {k: v[i]}
        for name, tensor in member.state_dict().items():
            assert torch.equal(tensor, state[name][i]), name
