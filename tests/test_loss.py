"""trial_losses: one loss per member; the CrossEntropyLoss fast path equals the generic vmap path."""
import pytest
import torch
from torch import nn

from hydro.loss import trial_losses


@pytest.mark.parametrize("kwargs", [{}, {"weight": torch.rand(5) + 0.1}, {"ignore_index": 2},
                                    {"label_smoothing": 0.1}, {"weight": torch.rand(5) + 0.1, "ignore_index": 0}])
@pytest.mark.parametrize("shape", [(6,), (6, 7)])  # classification, and per-position targets (e.g. a LM)
def test_cross_entropy_fast_path_equals_each_member_alone(kwargs, shape):
    torch.manual_seed(0)
    loss_fn = nn.CrossEntropyLoss(**kwargs)
    target = torch.randint(0, 5, shape)
    output = torch.randn(3, shape[0], 5, *shape[1:], requires_grad=True)
    losses = trial_losses(loss_fn, output, target)
    expected = torch.stack([loss_fn(output[i], target) for i in range(3)])
    torch.testing.assert_close(losses, expected)
    generic = trial_losses(lambda o, t: loss_fn(o, t), output, target)  # not a CrossEntropyLoss: vmap path
    torch.testing.assert_close(generic, expected)


def test_losses_must_reduce_to_one_value_per_member():
    with pytest.raises(ValueError, match="reduce each member's loss to a scalar"):
        trial_losses(nn.MSELoss(reduction="none"), torch.randn(2, 4, 3), torch.randn(4, 3))
