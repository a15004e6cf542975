"""Fixtures of the GPU test tier (its modules mark their tests ``gpu`` and skip them where torch cannot use
CUDA). TF32 is off for the fp32 checks (torch turns it on for cuDNN convolutions by default): fused and alone
then differ by float32 rounding only, the tolerance the CPU tests use."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture
def fp32_exact():
    """TF32 off for the test (the flags are this process's; put back after)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
