"""Mixed precision of a trial (``TuneSpec.precision``): autocast of forward and loss, and for fp16 a dynamic
loss scale per member, so one member's overflow skips only that member's step, never its siblings'."""
from __future__ import annotations

import contextlib
import enum
from collections.abc import Sequence

import torch
from torch import Tensor


class Precision(enum.StrEnum):
    FP32 = "fp32"  # no autocast
    BF16 = "bf16"  # autocast to bfloat16 (fp32's range: no loss scaling)
    FP16 = "fp16"  # autocast to float16, with a loss scale per member

    @property
    def dtype(self) -> torch.dtype | None:
        return {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(self)


def autocast(device: torch.device, precision: Precision) -> contextlib.AbstractContextManager:
    """The context that runs forward and loss in ``precision`` on ``device`` (no-op for fp32)."""
    if precision is Precision.FP32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=precision.dtype)


class MemberLossScaler:
    """``torch.amp.GradScaler``'s dynamic loss scale, one per member: ``scale`` ``[F]`` (float32). A member
    whose gradients overflowed skips its step and has its scale multiplied by ``backoff``; after ``interval``
    finite steps in a row its scale grows by ``growth``."""

    def __init__(self, count: int, device: torch.device, init_scale: float = 2.0 ** 16, growth: float = 2.0,
                 backoff: float = 0.5, interval: int = 2000) -> None:
        self.scale = torch.full((count,), init_scale, dtype=torch.float32, device=device)
        self.good_steps = torch.zeros(count, dtype=torch.int64, device=device)
        self.growth, self.backoff, self.interval = growth, backoff, interval

    def scaled(self, losses: Tensor, members: slice = slice(None)) -> Tensor:
        """The scalar to call ``backward`` on: ``sum_i scale_i * loss_i`` over the ``members`` whose
        ``losses`` these are."""
        return (losses.float() * self.scale[members]).sum()

    def update(self, overflowed: Tensor) -> None:
        """Back off the members that ``overflowed`` (``[F]`` bool), count finite steps of the others."""
        self.good_steps = torch.where(overflowed, 0, self.good_steps + 1)
        grow = self.good_steps >= self.interval
        self.scale = torch.where(overflowed, self.scale * self.backoff,
                                 torch.where(grow, self.scale * self.growth, self.scale))
        self.good_steps = torch.where(grow, 0, self.good_steps)

    def keep(self, positions: Sequence[int]) -> None:
        index = torch.as_tensor(list(positions), dtype=torch.long, device=self.scale.device)
        self.scale, self.good_steps = self.scale[index], self.good_steps[index]

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale = state["scale"].to(self.scale.device)
        self.good_steps = state["good_steps"].to(self.good_steps.device)
