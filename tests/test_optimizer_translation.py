"""Plain-torch optimizer factories become one fused optimizer whose members train exactly as alone."""
import pytest
import torch

import hydro
from hydro.examples.models import MLP
from hydro.trial.optimizer import UnsupportedOptimizer, fused_optimizer
from tests.training import assert_models_close, batches, train_fused, train_independent

CONFIGS = [{"lr": 0.05, "momentum": 0.9, "wd": 1e-3, "beta2": 0.99}, {"lr": 0.01, "momentum": 0.0, "wd": 0.0,
           "beta2": 0.999}, {"lr": 0.2, "momentum": 0.5, "wd": 1e-2, "beta2": 0.9}]
FACTORIES = {
    "sgd": lambda p, c: torch.optim.SGD(p, lr=c["lr"], momentum=c["momentum"], weight_decay=c["wd"]),
    "adam": lambda p, c: torch.optim.Adam(p, lr=c["lr"] / 10, betas=(0.9, c["beta2"]), weight_decay=c["wd"]),
    "adamw": lambda p, c: torch.optim.AdamW(p, lr=torch.tensor(c["lr"] / 10), weight_decay=c["wd"]),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_fused_translation_matches_independent_torch_training(name):
    factory = FACTORIES[name]
    torch.manual_seed(0)
    models = [MLP((64, 32, 10)) for _ in CONFIGS]
    data = batches("mlp", steps=5)
    expected, expected_losses = train_independent(models, lambda params, **c: factory(params, c), CONFIGS, data)
    fused = hydro.fuse([m for m in models])
    optimizer = fused_optimizer(factory, CONFIGS, fused.parameters())
    assert type(optimizer).__name__ == type(factory([torch.nn.Parameter(torch.zeros(1))], CONFIGS[0])).__name__
    losses = train_fused(fused, optimizer, data)
    torch.testing.assert_close(losses, expected_losses, rtol=1e-5, atol=1e-6)
    for actual, reference in zip(hydro.unfuse(fused), expected):
        assert_models_close(actual, reference)


def test_unsupported_factories_fail_clearly():
    fused = hydro.fuse([MLP((64, 8, 10)) for _ in range(2)])
    with pytest.raises(UnsupportedOptimizer, match="RMSprop"):
        fused_optimizer(lambda p, c: torch.optim.RMSprop(p, lr=c["lr"]), CONFIGS[:2], fused.parameters())
    with pytest.raises(UnsupportedOptimizer, match="nesterov.*group_by"):
        fused_optimizer(lambda p, c: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=c["lr"] > 0.02),
                        CONFIGS[:2], fused.parameters())
