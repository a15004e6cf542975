"""TuneSpec's backend options (memory_format, tf32, cudnn_benchmark, cuda_graphs): validated before anything
trains, CUDA-only ones refused or left alone on the CPU, and channels_last exercised on the CPU, where a fused
CNN trains the same with NHWC batches and weights as with NCHW."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import hydro
from hydro.trial.backend import MemoryFormat, batch_in, set_backend_flags, to_memory_format
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import spec

CONFIGS = [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.02, "momentum": 0.0})]


def cnn(config):
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 6 * 6, 10))


def images():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 1, 8, 8, generator=generator)
    y = torch.randint(0, 10, (96,), generator=generator)
    return (x[:64], y[:64]), (x[64:], y[64:])


def test_channels_last_trains_a_fused_cnn_as_nchw_does():
    runs = {}
    for memory_format in ("contiguous", "channels_last"):
        trial = FusedTrial(spec(model=cnn, data=images, memory_format=memory_format),
                           TrialPlan(TrialKind.SURROGATE, CONFIGS), images())
        runs[memory_format] = [trial.run_epoch() for _ in range(2)]
        if memory_format == "channels_last":
            conv = trial.members.model.get_submodule("0")
            merged = conv.weight.reshape(-1, *conv.weight.shape[2:])
            assert merged.is_contiguous(memory_format=torch.channels_last)
    for got, want in zip(runs["channels_last"], runs["contiguous"]):  # other kernels: float32 rounding only
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)


def test_channels_last_layouts_of_plain_and_fused_convolutions_and_batches():
    plain, fused = nn.Conv2d(3, 8, 3), hydro.fuse([nn.Sequential(nn.Conv2d(3, 8, 3)) for _ in range(2)])
    to_memory_format([plain, fused], MemoryFormat.CHANNELS_LAST)
    assert plain.weight.is_contiguous(memory_format=torch.channels_last)
    weight = fused.get_submodule("0").weight
    assert weight.shape == (2, 8, 3, 3, 3) and weight.reshape(16, 3, 3, 3).is_contiguous(
        memory_format=torch.channels_last)
    x = torch.randn(4, 3, 5, 5)
    assert batch_in(x, MemoryFormat.CHANNELS_LAST).is_contiguous(memory_format=torch.channels_last)
    assert batch_in(x, MemoryFormat.CONTIGUOUS) is x and batch_in(torch.ones(4, 3), MemoryFormat.CHANNELS_LAST).dim() == 2


def test_cuda_only_options_leave_the_cpu_alone_or_are_refused():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    set_backend_flags(torch.device("cpu"), True, True)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark) == before
    trial = FusedTrial(spec(tf32=True, cudnn_benchmark=True), TrialPlan(TrialKind.SURROGATE, CONFIGS),
                       spec().data())  # trains on the CPU as without them
    assert trial.train_step().shape == (2,)
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device, but this trial trains on cpu"):
        FusedTrial(spec(cuda_graphs=True), TrialPlan(TrialKind.SURROGATE, CONFIGS), spec().data())
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        spec(cuda_graphs=True, device="cpu")


@pytest.mark.parametrize("field, value, message", [
    ("memory_format", "nhwc", "memory_format must be one of \\['contiguous', 'channels_last'\\]"),
    ("tf32", "yes", "tf32 must be None or a bool"),
    ("cudnn_benchmark", 1, "cudnn_benchmark must be None or a bool"),
    ("cuda_graphs", None, "cuda_graphs must be a bool"),
])
def test_bad_backend_options_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        spec(**{field: value})


def test_the_flags_are_set_for_a_trial_on_cuda():
    """What a CUDA trial sets (this process's torch flags; put back after)."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    try:
        set_backend_flags(torch.device("cuda", 0), False, True)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.backends.cudnn.benchmark
        set_backend_flags(torch.device("cuda", 0), None, None)  # None: left as they are
        assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.allow_tf32
        set_backend_flags(torch.device("cuda", 0), True, False)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cudnn.benchmark
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark) = before
