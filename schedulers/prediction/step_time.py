"""Step-time model: per-layer features -> seconds on one device type (PALEO refined by a fitted regressor).

A layer's forward+backward time on a device is modelled per layer kind as ``t = a·FLOPs + b·bytes + c``
(non-negative ``a, b, c``, fitted by NNLS on timed layers, rows weighted by 1/t so the fit minimises relative
error): ``a`` is the inverse of the kind's FLOP rate (PALEO), ``b`` the inverse of its memory bandwidth and ``c``
the per-call overhead that fusion amortises. A fused layer of ``F`` members is one call doing ``F`` times the
work, so its time is ``a·F·FLOPs + b·F·bytes + c``. A kind without timings of its own uses the fit over all
kinds. A fused trial's step is the sum over its layers plus the optimizer pseudo-layer; memory is
``F × (parameters + gradients + optimizer state + saved activations)``.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

OPTIMIZER = "optimizer"  # kind of the optimizer-step pseudo-layer (features: the parameters it updates)
ALL_KINDS = "*"  # the regressor fitted over every kind (for kinds without timings)


@dataclass(frozen=True)
class LayerFeatures:
    """One layer of one member on one batch. ``flops``: forward FLOPs; ``bytes``: bytes the forward reads and
    writes (inputs, outputs, parameters); ``params``: parameters (elements); ``saved_bytes``: activation bytes
    kept for backward; ``shape``: the layer's defining sizes (descriptive)."""

    kind: str
    flops: float
    bytes: float
    params: int = 0
    saved_bytes: float = 0.0
    shape: tuple[int, ...] = ()

    def fused(self, members: int) -> tuple[float, float]:
        """(FLOPs, bytes) of the fused layer of ``members`` members."""
        return members * self.flops, members * self.bytes


@dataclass(frozen=True)
class LayerTiming:
    """Measured seconds of forward+backward of ``features``' layer fused ``members`` times."""

    features: LayerFeatures
    members: int
    seconds: float


@dataclass
class KindFit:
    """``seconds = per_flop·FLOPs + per_byte·bytes + overhead_s`` for one layer kind."""

    per_flop: float
    per_byte: float
    overhead_s: float
    samples: int

    def seconds(self, flops: float, nbytes: float) -> float:
        return self.per_flop * flops + self.per_byte * nbytes + self.overhead_s


@dataclass
class StepTimeModel:
    """A device type's fitted layer-time model (see the module docstring); ``paleo_flops_per_s``: the single
    FLOP rate of the PALEO baseline (all timed forward FLOPs ÷ all timed seconds)."""

    device: str
    kinds: dict[str, KindFit] = field(default_factory=dict)
    paleo_flops_per_s: float = math.nan

    @classmethod
    def fit(cls, device: str, timings: Iterable[LayerTiming]) -> StepTimeModel:
        timings = list(timings)
        if not timings:
            raise ValueError("StepTimeModel.fit: no layer timings; time some layers first "
                             "(hydro.profiling.time_layers)")
        by_kind: dict[str, list[LayerTiming]] = {}
        for t in timings:
            if not (t.seconds > 0 and math.isfinite(t.seconds)):
                raise ValueError(f"StepTimeModel.fit: a timing must be a positive number of seconds, got {t}")
            by_kind.setdefault(t.features.kind, []).append(t)
        model = cls(device)
        model.kinds = {kind: _fit_kind(rows) for kind, rows in by_kind.items()}
        model.kinds[ALL_KINDS] = _fit_kind([t for t in timings if t.features.kind != OPTIMIZER] or timings)
        flops = sum(t.members * t.features.flops for t in timings)
        model.paleo_flops_per_s = flops / sum(t.seconds for t in timings)
        return model

    def layer_seconds(self, features: LayerFeatures, members: int = 1) -> float:
        """Predicted forward+backward seconds of the layer fused ``members`` times."""
        fit = self.kinds.get(features.kind) or self.kinds[ALL_KINDS]
        return fit.seconds(*features.fused(members))

    def paleo_seconds(self, features: LayerFeatures, members: int = 1) -> float:
        """The PALEO baseline: forward FLOPs ÷ the one rate measured over all timed layers (their forward
        FLOPs per second of forward + backward)."""
        return members * features.flops / self.paleo_flops_per_s

    def step_seconds(self, layers: Sequence[LayerFeatures], members: int) -> float:
        """Predicted seconds of one training step of a fused trial of ``members`` members whose member has
        ``layers`` (the optimizer pseudo-layer included when ``layers`` has one)."""
        return sum(self.layer_seconds(f, members) for f in layers)

    def work_seconds(self, layers: Sequence[LayerFeatures], members: int) -> float:
        """Predicted seconds of one step without the per-call overheads: the part that scales with the
        device's rate (the ``work`` of :class:`schedulers.placement.cluster.GpuType`, on this model's device)."""
        return sum(self.layer_seconds(f, members) - (self.kinds.get(f.kind) or self.kinds[ALL_KINDS]).overhead_s
                   for f in layers)

    def throughput(self, layers: Sequence[LayerFeatures], members: int, batch_size: int) -> float:
        """Predicted member-samples per second at ``members``."""
        return members * batch_size / self.step_seconds(layers, members)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StepTimeModel:
        return cls(data["device"], {k: KindFit(**v) for k, v in data["kinds"].items()}, data["paleo_flops_per_s"])


def memory_bytes(layers: Sequence[LayerFeatures], members: int, *, optimizer_states: int = 1,
                 element_bytes: int = 4) -> float:
    """Predicted resident bytes of a fused trial: ``members × (params × (2 + optimizer_states) × element_bytes
    + saved activation bytes)`` (weights, gradients, e.g. one momentum buffer; activations kept for backward)."""
    params = sum(f.params for f in layers if f.kind != OPTIMIZER)
    saved = sum(f.saved_bytes for f in layers)
    return members * (params * (2 + optimizer_states) * element_bytes + saved)


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """``|predicted - measured| / measured`` pairwise."""
    return [abs(p - m) / m for p, m in zip(predicted, measured, strict=True)]


def median_error(predicted: Sequence[float], measured: Sequence[float]) -> float:
    return statistics.median(relative_errors(predicted, measured))


def candidate_counts(model: StepTimeModel, layers: Sequence[LayerFeatures], batch_size: int, max_members: int,
                     memory_budget_bytes: float | None = None, count: int = 3, tolerance: float = 0.1) -> list[int]:
    """Up to ``count`` fusion counts worth measuring, ascending: the *knee* — the smallest F of the ladder
    (powers of two and ``max_members``, those that fit ``memory_budget_bytes``) whose predicted member-samples/s
    is within ``tolerance`` of the ladder's predicted best — and its neighbours in the ladder. (The linear
    model's throughput only rises with F, towards ``batch / per-member time``; past the knee a measurement
    decides, since a real device can slow down there.)"""
    if max_members < 1:
        raise ValueError(f"candidate_counts: max_members must be >= 1, got {max_members}")
    ladder = sorted({*(2 ** k for k in range(max_members.bit_length()) if 2 ** k <= max_members), max_members})
    if memory_budget_bytes is not None:
        ladder = [f for f in ladder if memory_bytes(layers, f) <= memory_budget_bytes] or [1]
    speeds = [model.throughput(layers, f, batch_size) for f in ladder]
    knee = next(i for i, s in enumerate(speeds) if s >= (1 - tolerance) * max(speeds))
    low = max(0, min(knee - (count - 1) // 2, len(ladder) - count))
    return ladder[low: low + count]


def _fit_kind(rows: Sequence[LayerTiming]) -> KindFit:
    from scipy.optimize import nnls  # 0.26 s to import: only when a model is fitted, not in every trial process

    design = np.array([[*t.features.fused(t.members), 1.0] for t in rows], dtype=float)
    target = np.array([t.seconds for t in rows], dtype=float)
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    weighted = design / scale / target[:, None]  # relative error: each row divided by its own time
    coef, _ = nnls(weighted, np.ones(len(rows)))
    per_flop, per_byte, overhead = coef / scale
    return KindFit(float(per_flop), float(per_byte), float(overhead), len(rows))
