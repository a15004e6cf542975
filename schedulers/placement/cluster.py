"""A mixed GPU cluster and the predicted step time of a (fused) trial on each GPU type.

A trial's step on GPU type ``g`` takes ``overhead_s + work / rate`` seconds (the step-time model's form:
per-call overhead that fusion amortises plus work at the device's rate): ``work`` is in seconds of the
reference GPU (rate 1), so small surrogates, dominated by the overhead, gain little from a faster GPU and a
full-size target gains the whole ratio. Every type records where its numbers come from (``source``): the types
defined here are assumed constants, not measurements or predictions.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass


ASSUMED_OVERHEAD_S = 0.008  # an assumed host-side per-step overhead (s), the same on every type; never measured


@dataclass(frozen=True)
class GpuType:
    """``rate``: compute throughput relative to the reference GPU; ``overhead_s``: per-step overhead (s);
    ``source``: where ``rate`` and ``overhead_s`` come from (``assumed: ...``, ``measured: ...``, ``predicted:
    ...``)."""

    name: str
    rate: float
    overhead_s: float = ASSUMED_OVERHEAD_S
    source: str = "assumed"

    def step_seconds(self, work: float) -> float:
        """Seconds of one step of ``work`` reference-GPU seconds."""
        return self.overhead_s + work / self.rate


# Relative training throughput, round numbers in line with NVIDIA's published training results (A100 about 2.2x
# a V100, H100 about 1.6x an A100 on ResNet-50/BERT-class models); the same host-side overhead on each.
_PUBLISHED = "assumed: round relative training throughput in line with NVIDIA's published results; overhead assumed"
V100 = GpuType("V100", 1.0, source=_PUBLISHED)
A100 = GpuType("A100", 2.2, source=_PUBLISHED)
H100 = GpuType("H100", 3.5, source=_PUBLISHED)


@dataclass(frozen=True)
class Cluster:
    """GPUs by type: ``counts[name]`` GPUs of ``types[name]``."""

    types: Mapping[str, GpuType]
    counts: Mapping[str, int]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.counts) - set(self.types))
        if unknown or any(n < 0 for n in self.counts.values()) or not sum(self.counts.values()):
            raise ValueError(f"Cluster: counts must name known GPU types with >= 0 GPUs and some GPU in all; "
                             f"got counts {dict(self.counts)} for types {sorted(self.types)}")

    @classmethod
    def of(cls, *counts: tuple[GpuType, int]) -> Cluster:
        return cls({g.name: g for g, _ in counts}, {g.name: n for g, n in counts})

    def assumptions(self) -> dict[str, dict]:
        """Per type: its count, ``rate``, ``overhead_s`` and their ``source`` (for a result's record)."""
        return {name: {"count": self.counts[name], **asdict(self.types[name])} for name in self.counts}

    def gpus(self) -> list[str]:
        """One entry per GPU: its type name (in the order the types were given)."""
        return [name for name, n in self.counts.items() for _ in range(n)]
