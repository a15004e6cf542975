"""Every hydro.nn twin: forward and gradients equal the per-member torch.nn module's."""
import pytest
import torch
from torch import nn

from hydro.nn import FusedModule, VmapModule, attention, fuse_layer

MEMBERS = 3


def _float_leaf(t):
    return t.detach().clone().requires_grad_(t.is_floating_point())


def check_layer(factory, make_inputs, call=lambda m, *a: m(*a), *, shared=False, atol=1e-5):
    """Fuse MEMBERS independently initialised layers; compare outputs and all gradients member by member."""
    torch.manual_seed(0)
    modules = [factory() for _ in range(MEMBERS)]
    for m in modules:  # make every tensor differ between members, buffers included
        with torch.no_grad():
            for t in m.state_dict().values():
                if t.is_floating_point():
                    t.add_(torch.randn_like(t) * 0.1)
    twin, fallback = fuse_layer(modules)
    member_inputs = [make_inputs() for _ in range(MEMBERS)]
    if shared:
        assert twin.supports_shared_input
        twin.shared_input = True
        member_inputs = [member_inputs[0]] * MEMBERS
        fused_inputs = tuple(_float_leaf(t) for t in member_inputs[0])
    else:
        fused_inputs = tuple(_float_leaf(torch.stack(ts)) for ts in zip(*member_inputs))
    out = call(twin, *fused_inputs)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    twin_grads = {k: p.grad for k, p in twin.named_parameters()}
    for i, m in enumerate(modules):
        inputs = tuple(_float_leaf(t) for t in member_inputs[i])
        ref = call(m, *inputs)
        torch.testing.assert_close(out[i], ref, atol=atol, rtol=1e-5)
        (ref * weights[i]).sum().backward()
        for name, p in m.named_parameters():
            if p.grad is None:  # the output does not depend on this parameter
                assert twin_grads[name] is None or not twin_grads[name][i].any()
                continue
            torch.testing.assert_close(twin_grads[name][i], p.grad, atol=atol, rtol=1e-5, msg=f"grad {name}")
        if not shared:
            for j, t in enumerate(inputs):
                if t.requires_grad:
                    torch.testing.assert_close(fused_inputs[j].grad[i], t.grad, atol=atol, rtol=1e-5)
    fused_state = twin.state_dict()
    for i, m in enumerate(modules):  # buffers updated in forward (running statistics) match too
        for name, t in m.state_dict().items():
            torch.testing.assert_close(fused_state[name][i], t, atol=atol, rtol=1e-5, msg=f"state {name}")
    return twin, fallback


def randn(*shape):
    return lambda: (torch.randn(*shape),)


LAYERS = {
    "linear": (lambda: nn.Linear(6, 5), randn(4, 6)),
    "linear_3d_nobias": (lambda: nn.Linear(6, 5, bias=False), randn(4, 2, 6)),
    # weights >= WEIGHT_MAJOR_RATIO x the batch's activations: computed weight-major (y^T = W x^T)
    "linear_wide": (lambda: nn.Linear(40, 32), randn(2, 40)),
    "linear_wide_3d_nobias": (lambda: nn.Linear(40, 32, bias=False), randn(2, 2, 40)),
    "conv1d": (lambda: nn.Conv1d(3, 4, 3, padding=1), randn(4, 3, 10)),
    "conv2d": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1), randn(2, 3, 8, 8)),
    "conv2d_grouped_reflect": (lambda: nn.Conv2d(4, 6, 3, groups=2, padding=1, padding_mode="reflect"),
                               randn(2, 4, 6, 6)),
    "batchnorm1d": (lambda: nn.BatchNorm1d(5), randn(8, 5)),
    "batchnorm1d_3d": (lambda: nn.BatchNorm1d(5, momentum=None), randn(8, 5, 7)),
    "batchnorm2d": (lambda: nn.BatchNorm2d(4), randn(4, 4, 5, 5)),
    "layernorm": (lambda: nn.LayerNorm(6), randn(4, 3, 6)),
    "layernorm_2d_shape": (lambda: nn.LayerNorm([3, 6]), randn(4, 3, 6)),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), randn(3, 4, 5, 5)),
    "maxpool2d": (lambda: nn.MaxPool2d(2), randn(2, 3, 6, 6)),
    "avgpool2d": (lambda: nn.AvgPool2d(3, stride=2), randn(2, 3, 7, 7)),
    "adaptiveavgpool2d": (lambda: nn.AdaptiveAvgPool2d(1), randn(2, 3, 5, 5)),
    "maxpool1d": (lambda: nn.MaxPool1d(2), randn(2, 3, 8)),
    "avgpool1d": (lambda: nn.AvgPool1d(2), randn(2, 3, 8)),
    "adaptiveavgpool1d": (lambda: nn.AdaptiveAvgPool1d(3), randn(2, 3, 9)),
    "flatten": (lambda: nn.Flatten(), randn(2, 3, 4)),
    "softmax": (lambda: nn.Softmax(dim=-1), randn(2, 5)),
    "logsoftmax_dim1": (lambda: nn.LogSoftmax(dim=1), randn(2, 5, 3)),
    "dropout_eval_like": (lambda: nn.Dropout(0.0), randn(2, 5)),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_twin_matches_torch(name):
    factory, inputs = LAYERS[name]
    twin, fallback = check_layer(factory, inputs)
    assert fallback is None and isinstance(twin, FusedModule)


@pytest.mark.parametrize("name", ["linear", "linear_3d_nobias", "conv1d", "conv2d", "conv2d_grouped_reflect",
                                  "layernorm"])
def test_shared_input_path_matches_torch(name):
    factory, inputs = LAYERS[name]
    check_layer(factory, inputs, shared=True)


def test_embedding_with_padding_idx():
    indices = lambda: (torch.randint(0, 10, (4, 5)),)  # noqa: E731
    check_layer(lambda: nn.Embedding(10, 6, padding_idx=0), indices)
    twin, _ = check_layer(lambda: nn.Embedding(10, 6, padding_idx=0), indices, shared=True)
    assert twin.shared_input


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_self_attention(batch_first):
    shape = (2, 5, 8) if batch_first else (5, 2, 8)
    twin, _ = check_layer(lambda: nn.MultiheadAttention(8, 2, batch_first=batch_first), randn(*shape),
                          lambda m, x: m(x, x, x)[0])
    check_layer(lambda: nn.MultiheadAttention(8, 2, batch_first=batch_first), randn(*shape),
                lambda m, x: m(x, x, x, need_weights=True, average_attn_weights=False)[1])


def test_multihead_cross_attention_with_masks():
    key_padding = torch.tensor([[False, False, False, True], [False, True, False, False]])
    attn_mask = torch.randn(3, 4)

    def call(m, q, kv):
        return m(q, kv, kv, key_padding_mask=key_padding, attn_mask=attn_mask, need_weights=False)[0]

    check_layer(lambda: nn.MultiheadAttention(8, 2, batch_first=True),
                lambda: (torch.randn(2, 3, 8), torch.randn(2, 4, 8)), call)


@pytest.mark.parametrize("norm_first,activation", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_layer(norm_first, activation):
    mask = nn.Transformer.generate_square_subsequent_mask(6)
    check_layer(lambda: nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation=activation,
                                                   batch_first=True, norm_first=norm_first),
                randn(2, 6, 8), lambda m, x: m(x, src_mask=mask))


def test_transformer_encoder_stack():
    def factory():
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
        return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False)

    check_layer(factory, randn(6, 2, 8))


@pytest.mark.parametrize("factory,inputs", [
    (lambda: nn.PReLU(4), randn(3, 4)),
    (lambda: nn.ConvTranspose1d(3, 2, 3, stride=2), randn(2, 3, 5)),
    (lambda: nn.InstanceNorm1d(3, affine=True), randn(2, 3, 6)),
    (lambda: nn.Upsample(scale_factor=2), randn(2, 3, 4)),
])
def test_generic_vmap_fallback(factory, inputs):
    twin, fallback = check_layer(factory, inputs)
    assert fallback is not None and "torch.vmap" in fallback


def test_fallback_module_keeps_torch_state_keys():
    twin, _ = fuse_layer([nn.PReLU(4) for _ in range(2)])
    assert isinstance(twin, VmapModule)
    assert set(twin.state_dict()) == set(nn.PReLU(4).state_dict())


def test_dropout_masks_differ_between_members_even_for_shared_input():
    twin, _ = fuse_layer([nn.Dropout(0.5) for _ in range(4)])
    twin.shared_input = True
    out = twin(torch.ones(64, 32))
    assert out.shape == (4, 64, 32)
    masks = out != 0
    assert all(not torch.equal(masks[0], masks[i]) for i in range(1, 4))
    twin.eval()
    assert torch.equal(twin(torch.ones(3, 2)), torch.ones(4, 3, 2))


def test_direct_construction_initialises_like_torch():
    torch.manual_seed(1)
    fused = __import__("hydro").nn.Linear(7, 3, num_members=2)
    torch.manual_seed(1)
    refs = [nn.Linear(7, 3) for _ in range(2)]
    for i, ref in enumerate(refs):
        torch.testing.assert_close(fused.weight[i], ref.weight)
        torch.testing.assert_close(fused.bias[i], ref.bias)


@pytest.mark.parametrize("max_batch", [None, 4])
@pytest.mark.parametrize("masks", ["none", "causal", "key padding", "both"])
def test_fused_attention_equals_the_members_alone_bitwise(masks, max_batch, monkeypatch):
    """Scaled dot-product attention runs on the members' batches as one 4-D batch, as each member alone does: the
    same kernel, so outputs and input gradients are bitwise equal (5-D inputs took SDPA's math path: off by
    1e-7). Weight gradients sum over the batch in a batched matmul, in another order than alone: close.
    ``max_batch``: the F*N rows attend in calls of at most that many (cuDNN's limit): here 3 calls of 4 rows
    and one of 3."""
    if max_batch is not None:
        monkeypatch.setattr(attention, "SDPA_MAX_BATCH", max_batch)
    torch.manual_seed(0)
    modules = [nn.MultiheadAttention(16, 4, batch_first=True) for _ in range(MEMBERS)]
    twin, _ = fuse_layer(modules)
    x = torch.randn(MEMBERS, 5, 7, 16)
    kwargs = {"need_weights": False}
    if masks in ("causal", "both"):
        kwargs["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(7)
    if masks in ("key padding", "both"):
        kwargs["key_padding_mask"] = torch.arange(7).expand(5, 7) >= torch.tensor([[7], [5], [6], [3], [7]])
    fused_x = x.clone().requires_grad_()
    out = twin(fused_x, fused_x, fused_x, **kwargs)[0]
    out.sum().backward()
    for i, module in enumerate(modules):
        alone_x = x[i].clone().requires_grad_()
        alone = module(alone_x, alone_x, alone_x, **kwargs)[0]
        alone.sum().backward()
        assert torch.equal(out[i], alone)
        assert torch.equal(fused_x.grad[i], alone_x.grad)
        torch.testing.assert_close(twin.in_proj_weight.grad[i], module.in_proj_weight.grad)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(11, 64, 128, 256), (3, 4, 8, 64, 32), (2, 7, 1, 3)])
def test_row_major_linear_gradients_are_autograds_bitwise_without_copying_the_weight(shape, bias):
    """fused_linear's row-major path (activations wider than weights) returns the weight gradient in the weight's
    layout: the same bits as autograd's ``x @ weight^T``, and no copy of the weight gradient in the backward."""
    from hydro.nn.linear import fused_linear
    from hydro.trial.host_syncs import HostSyncCounter

    torch.manual_seed(0)
    members, *batch, in_features, out_features = shape
    inputs = [torch.randn(members, *batch, in_features), torch.randn(members, out_features, in_features),
              torch.randn(members, out_features) if bias else None]
    mine, reference = ([_float_leaf(t) if t is not None else None for t in inputs] for _ in range(2))
    y = fused_linear(*mine)
    x, weight, b = reference
    flat = x.reshape(members, -1, in_features)
    expected = torch.bmm(flat, weight.transpose(1, 2)) if b is None else \
        torch.baddbmm(b.unsqueeze(1), flat, weight.transpose(1, 2))
    assert torch.equal(y, expected.view(members, *batch, out_features))
    grad = torch.randn_like(y)
    with HostSyncCounter() as count:
        y.backward(grad)
    expected.backward(grad.view_as(expected))
    assert count.ops["aten.copy_"] == 0 and count.ops["aten.clone"] == 0
    for got, want in zip(mine, reference):
        if got is not None:
            assert torch.equal(got.grad, want.grad)
    x = mine[0].detach()  # an input that needs no gradient: only the parameters get one
    y = fused_linear(x, mine[1], mine[2])
    y.backward(grad)
    assert torch.equal(mine[1].grad, 2 * reference[1].grad)
