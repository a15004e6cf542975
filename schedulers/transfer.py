"""When a Hydro search trains its full-size target, and with which member's configuration (plain Python).

The surrogates' best hyperparameters transfer to the full-size model (µP); the target is due once ``fraction``
of the members have finished, or when nothing is left to draw and no member is still training.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass
class TransferPolicy:
    """``fraction``: share of the ``num_samples`` members that must have finished (``None``: no target);
    members are ranked by their final ``metric`` in ``mode``."""

    fraction: float | None
    num_samples: int
    metric: str
    mode: str

    def __post_init__(self) -> None:
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"transfer_fraction must be in (0, 1] or None, got {self.fraction}")

    def due(self, finished: Mapping[str, dict | None], nothing_left: bool) -> bool:
        """Whether the target should start now, given the finished members' results; ``nothing_left``: no
        member is left to draw and none is still training."""
        if self.fraction is None:
            return False
        enough = len(finished) >= math.ceil(self.fraction * self.num_samples)
        return (enough or nothing_left) and self.best(finished) is not None

    def best(self, finished: Mapping[str, dict | None]) -> str | None:
        """The finished member with the best finite final value (first one on ties), or ``None``."""
        best, best_value = None, math.nan
        for member, result in finished.items():
            value = (result or {}).get(self.metric)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            if best is None or (value > best_value if self.mode == "max" else value < best_value):
                best, best_value = member, value
        return best
