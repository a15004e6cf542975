"""How a trial's kernels run on its device (``TuneSpec.memory_format``, ``tf32``, ``cudnn_benchmark``,
``cuda_graphs``): set once when the trial starts, the same results on every device but for TF32's rounding.

- ``memory_format="channels_last"``: 4-D batches and convolution weights stored NHWC (fused convolutions keep it
  through the members' grouped convolution), what tensor cores prefer; works on the CPU too.
- ``tf32``: TF32 for float32 matmuls and convolutions on CUDA (``None``: torch's defaults, convolutions yes,
  matmuls no); no effect on the CPU.
- ``cudnn_benchmark``: cuDNN tries its convolution algorithms for each new shape and keeps the fastest
  (``None``: torch's default, off); no effect on the CPU.
- ``cuda_graphs``: the fused forward and backward replayed as CUDA graphs (``torch.compile`` with
  ``mode="reduce-overhead"``, one graph per batch shape); CUDA only.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from hydro.nn.conv import Conv2d as FusedConv2d


class MemoryFormat(enum.StrEnum):
    CONTIGUOUS = "contiguous"        # NCHW, torch's default
    CHANNELS_LAST = "channels_last"  # NHWC


def set_backend_flags(device: torch.device, tf32: bool | None, cudnn_benchmark: bool | None) -> None:
    """This process's TF32 and cuDNN autotune flags for a trial on ``device`` (``None``: left as they are;
    nothing on a CPU)."""
    if device.type != "cuda":
        return
    if tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if cudnn_benchmark is not None:
        torch.backends.cudnn.benchmark = cudnn_benchmark


def check_cuda_graphs(cuda_graphs: bool, device: torch.device) -> None:
    """Raises ``ValueError`` when CUDA graphs are asked for on a device that is not a GPU."""
    if cuda_graphs and device.type != "cuda":
        raise ValueError(f"TuneSpec.cuda_graphs=True needs a CUDA device, but this trial trains on {device}; "
                         f"give the trials GPUs (gpus_per_trial) or set cuda_graphs=False")


def compiled(model: nn.Module, compile: bool, cuda_graphs: bool) -> Callable[[Tensor], Tensor]:
    """``model``'s forward as it runs: eager, ``torch.compile``d, or compiled to replay CUDA graphs."""
    if cuda_graphs:
        return torch.compile(model, mode="reduce-overhead")
    return torch.compile(model) if compile else model


def to_memory_format(modules: Sequence[nn.Module], memory_format: MemoryFormat) -> None:
    """Store the convolution weights of ``modules`` in ``memory_format`` (in place): plain 4-D weights as torch
    does, a fused ``Conv2d``'s stacked ``[F, O, I, kh, kw]`` weight so that its members' ``[F*O, I, kh, kw]``
    view is channels-last."""
    if memory_format is MemoryFormat.CONTIGUOUS:
        return
    with torch.no_grad():
        for module in (m for root in modules for m in root.modules()):
            if isinstance(module, FusedConv2d):
                weight = module.weight
                weight.data = weight.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)
            elif isinstance(module, nn.Conv2d):
                module.weight.data = module.weight.contiguous(memory_format=torch.channels_last)


def batch_in(x: Tensor, memory_format: MemoryFormat) -> Tensor:
    """A batch ``x`` in ``memory_format`` (only 4-D image batches change)."""
    if memory_format is MemoryFormat.CHANNELS_LAST and isinstance(x, Tensor) and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x
