"""``hydro.fuse`` of shrunk models trains with the µP multipliers intact: equal, within 1e-5, to training
each shrunk member alone with a torch optimizer on ``mup_param_groups``. In float64: Adam divides by
sqrt(v) + eps, so in float32 the rounding noise of tiny gradients (e.g. the attention key bias, whose
gradient is exactly zero in theory) becomes steps of size ~lr that differ between any two implementations."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from shrink_models import MLP, CharTransformer, RecurrentLM

import hydro
import hydro.optim
from hydro.loss import trial_losses
from hydro.shrink import FusedReadout, mup_param_groups

LRS, WD, STEPS = [3e-3, 1e-2, 3e-2], 0.05, 4


def lm_loss(out, y):
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


CASES = {
    # name: (make target, scale, data, loss, hydro optimizer, (torch optimizer, rule), extra hyperparameters)
    "mlp-adam": (lambda: MLP(128, d_in=16), 4, lambda g: (torch.randn(16, 16, generator=g, dtype=torch.float64),
                                                        torch.randint(0, 10, (16,), generator=g)),
                 F.cross_entropy, hydro.optim.Adam, (torch.optim.Adam, "adam"), {}),
    "mlp-sgd": (lambda: MLP(128, d_in=16), 4, lambda g: (torch.randn(16, 16, generator=g, dtype=torch.float64),
                                                       torch.randint(0, 10, (16,), generator=g)),
                F.cross_entropy, hydro.optim.SGD, (torch.optim.SGD, "sgd"), {"momentum": 0.9}),
    "transformer-adamw": (lambda: CharTransformer(64, head_dim=8), 2,
                          lambda g: (torch.randint(0, 32, (4, 16), generator=g),
                                     torch.randint(0, 32, (4, 16), generator=g)),
                          lm_loss, hydro.optim.AdamW, (torch.optim.AdamW, "adam"), {}),
    "gru-adamw": (lambda: RecurrentLM(32, layers=2), 4, lambda g: (torch.randint(0, 32, (4, 8), generator=g),
                                                                torch.randint(0, 32, (4, 8), generator=g)),
                  lm_loss, hydro.optim.AdamW, (torch.optim.AdamW, "adam"), {}),
    "lstm-sgd": (lambda: RecurrentLM(32, kind="lstm"), 4, lambda g: (torch.randint(0, 32, (4, 8), generator=g),
                                                                   torch.randint(0, 32, (4, 8), generator=g)),
                 lm_loss, hydro.optim.SGD, (torch.optim.SGD, "sgd"), {"momentum": 0.9}),
}


@pytest.mark.parametrize("case", CASES)
def test_fused_shrunk_members_train_like_independent_mup_models(case):
    make, scale, data, loss_fn, fused_opt, (torch_opt, rule), extra = CASES[case]
    target = make().double()
    members = []
    for seed in range(len(LRS)):
        torch.manual_seed(seed)
        members.append(hydro.shrink(target, scale))
    alone = [copy.deepcopy(m) for m in members]
    fused = hydro.fuse(members)
    assert fused.fallbacks == {}
    assert any(isinstance(m, FusedReadout) for m in fused.modules())
    optimizer = fused_opt(fused.parameters(), lr=LRS, weight_decay=WD, **extra)
    assert len(optimizer.param_groups) > 1  # split by µP multipliers
    references = [torch_opt(mup_param_groups(m.parameters(), rule, lr, WD), lr=lr, **extra)
                  for m, lr in zip(alone, LRS)]
    g = torch.Generator().manual_seed(0)
    for _ in range(STEPS):
        x, y = data(g)
        optimizer.zero_grad()
        trial_losses(loss_fn, fused(x), y).sum().backward()
        optimizer.step()
        for model, ref_opt in zip(alone, references):
            ref_opt.zero_grad()
            loss_fn(model(x), y).backward()
            ref_opt.step()
    state = fused.state_dict()
    for i, model in enumerate(alone):
        for name, value in model.state_dict().items():
            assert torch.allclose(state[name][i], value, atol=1e-5, rtol=1e-5), f"member {i} {name}"
    x, _ = data(g)
    torch.testing.assert_close(fused(x), torch.stack([m(x) for m in alone]), atol=1e-5, rtol=1e-5)


def test_unfused_members_keep_mup_layers_and_shapes():
    members = [hydro.shrink(MLP(64), 2) for _ in range(2)]
    back = hydro.unfuse(hydro.fuse(members))
    for original, member in zip(members, back):
        assert type(member.readout) is type(original.readout) and member.readout.output_mult == 2
        for (name, p), q in zip(member.named_parameters(), original.parameters()):
            assert p.hydro_mup == q.hydro_mup, name
