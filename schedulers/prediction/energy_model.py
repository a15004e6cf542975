"""MC2-style energy model of data-parallel training: a step is preprocessing + computing + communicating, each
stage's time and power fitted from its own measured windows, so a job's energy on N devices is predicted
before it runs (and placements can be ranked by it).

Stage time per step (per device, the stages run one after the other):

- preprocessing: ``t = a·(samples per device) + c`` (host-side loading and augmentation);
- computing: ``t = a·(samples per device) + c`` (or a step-time model's prediction, given directly);
- communicating (ring all-reduce of the gradients): ``t = a·2(N-1)/N·(gradient bytes) + c·2(N-1)`` (bandwidth
  and per-hop latency; zero on one device).

Coefficients are non-negative (NNLS). A stage's power per device is the time-weighted mean of its windows
(``joules / (devices · seconds)``); its energy is ``devices × power × time``. A model fitted on windows of one
device only (e.g. a tuning run's single-GPU trials) has no communication fit and predicts one device only.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np


class Stage(enum.Enum):
    PREPROCESS = "preprocess"
    COMPUTE = "compute"
    COMMUNICATE = "communicate"


@dataclass(frozen=True)
class StageWindow:
    """A measured window of one stage: ``steps`` steps on ``devices`` devices, ``samples_per_device`` per step,
    ``gradient_bytes`` all-reduced per step; ``seconds`` of the stage in the window and ``joules`` of all
    devices during it."""

    stage: Stage
    devices: int
    samples_per_device: float
    gradient_bytes: float
    steps: int
    seconds: float
    joules: float


@dataclass(frozen=True)
class StageFit:
    """Per-step stage seconds ``= coefficients · features`` and the stage's power per device (W)."""

    coefficients: tuple[float, float]
    power_w: float

    def seconds(self, stage: Stage, devices: int, samples_per_device: float, gradient_bytes: float) -> float:
        return float(np.dot(self.coefficients, _features(stage, devices, samples_per_device, gradient_bytes)))


@dataclass(frozen=True)
class EnergyPrediction:
    """A job's predicted seconds and joules per stage (all devices) and in total."""

    devices: int
    seconds: dict[Stage, float]
    joules: dict[Stage, float]

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    @property
    def total_joules(self) -> float:
        return sum(self.joules.values())


class EnergyModel:
    """The three stage fits of one device type (see the module docstring)."""

    def __init__(self, fits: Mapping[Stage, StageFit], single_device: bool = False) -> None:
        missing = [s.value for s in Stage if s not in fits and not (single_device and s is Stage.COMMUNICATE)]
        if missing:
            raise ValueError(f"EnergyModel: no fit for stage(s) {missing}; measure windows of every stage")
        self.fits = dict(fits)
        self.single_device = single_device and Stage.COMMUNICATE not in fits

    @classmethod
    def fit(cls, windows: Iterable[StageWindow]) -> EnergyModel:
        by_stage: dict[Stage, list[StageWindow]] = {}
        for w in windows:
            if w.seconds <= 0 or w.joules < 0 or w.steps < 1 or w.devices < 1:
                raise ValueError(f"EnergyModel.fit: a window needs devices, steps >= 1, seconds > 0, joules >= 0; "
                                 f"got {w}")
            by_stage.setdefault(w.stage, []).append(w)
        comm = [w for w in by_stage.get(Stage.COMMUNICATE, []) if w.devices > 1]
        if Stage.COMMUNICATE in by_stage and not comm:
            raise ValueError("EnergyModel.fit: communication windows need more than one device")
        if comm:
            by_stage[Stage.COMMUNICATE] = comm
        single = bool(by_stage) and all(w.devices == 1 for rows in by_stage.values() for w in rows)
        return cls({stage: _fit_stage(stage, rows) for stage, rows in by_stage.items()}, single_device=single)

    def predict(self, devices: int, global_batch: int, gradient_bytes: float, steps: int,
                compute_seconds: float | None = None) -> EnergyPrediction:
        """Energy of ``steps`` steps of a global batch ``global_batch`` split over ``devices`` devices;
        ``compute_seconds``: the computing stage's per-step seconds when known (e.g. from the step-time model)."""
        if devices < 1 or steps < 0 or global_batch < devices:
            raise ValueError(f"EnergyModel.predict: needs devices >= 1, steps >= 0, global_batch >= devices; got "
                             f"devices={devices}, steps={steps}, global_batch={global_batch}")
        if devices > 1 and self.single_device:
            raise ValueError(f"EnergyModel.predict: fitted on windows of one device only, it cannot predict the "
                             f"communication of {devices} devices; fit it on windows of several devices too")
        per_device = global_batch / devices
        seconds, joules = {}, {}
        for stage, fit in self.fits.items():
            step = fit.seconds(stage, devices, per_device, gradient_bytes)
            if stage is Stage.COMPUTE and compute_seconds is not None:
                step = compute_seconds
            seconds[stage] = steps * step
            joules[stage] = devices * fit.power_w * seconds[stage]
        if self.single_device:  # one device: nothing to communicate
            seconds[Stage.COMMUNICATE] = joules[Stage.COMMUNICATE] = 0.0
        return EnergyPrediction(devices, seconds, joules)


def rank_placements(models: Mapping[str, EnergyModel], options: Sequence[tuple[str, int]], global_batch: int,
                    gradient_bytes: float, steps: int, compute_seconds: Mapping[str, float] | None = None,
                    ) -> list[tuple[str, int, EnergyPrediction]]:
    """Placements ``(device type, devices)`` ordered by predicted energy, least first; ``compute_seconds``: per
    device type, the computing stage's per-step seconds where known (e.g. from the step-time model)."""
    unknown = sorted({t for t, _ in options} - set(models))
    if unknown:
        raise ValueError(f"rank_placements: no energy model for device type(s) {unknown}; fit one from its windows")
    compute_seconds = compute_seconds or {}
    ranked = [(t, n, models[t].predict(n, global_batch, gradient_bytes, steps, compute_seconds.get(t)))
              for t, n in options]
    return sorted(ranked, key=lambda row: row[2].total_joules)


def _features(stage: Stage, devices: int, samples_per_device: float, gradient_bytes: float) -> list[float]:
    if stage is Stage.COMMUNICATE:
        hops = 2 * (devices - 1)
        return [hops / devices * gradient_bytes, float(hops)]
    return [samples_per_device, 1.0]


def _fit_stage(stage: Stage, rows: Sequence[StageWindow]) -> StageFit:
    design = np.array([_features(stage, w.devices, w.samples_per_device, w.gradient_bytes) for w in rows])
    per_step = np.array([w.seconds / w.steps for w in rows])
    scale = design.max(axis=0)
    scale[scale == 0] = 1.0
    from scipy.optimize import nnls  # here: scipy.optimize's import costs a trial's fresh worker about 0.5 s

    coef, _ = nnls(design / scale / per_step[:, None], np.ones(len(rows)))  # relative error
    power = sum(w.joules for w in rows) / sum(w.devices * w.seconds for w in rows)
    return StageFit(tuple(float(c) for c in coef / scale), float(power))
