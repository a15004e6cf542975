"""Perseus's profiling heuristic: scan frequencies from high to low and stop once energy keeps rising.

Below some frequency an instruction takes both longer and more energy (Pareto-suboptimal), so those
frequencies are never planned; the scan stops after ``patience`` consecutive energy increases.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DownwardScan:
    """Stop rule for a high-to-low frequency scan; Perseus uses five consecutive increases."""

    patience: int = 5

    def __post_init__(self) -> None:
        if self.patience < 1:
            raise ValueError(f"pipeline_energy: DownwardScan patience must be >= 1, got {self.patience}.")

    def should_stop(self, energies_j: Sequence[float]) -> bool:
        """``energies_j``: energy per instruction at the frequencies scanned so far, highest first."""
        if len(energies_j) <= self.patience:
            return False
        tail = energies_j[-self.patience - 1:]
        return all(later > earlier for earlier, later in zip(tail[:-1], tail[1:]))
