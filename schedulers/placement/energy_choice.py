"""A trial's GPU type by predicted energy cost: MC2 energy models (:mod:`schedulers.prediction.energy_model`)
fitted per GPU type from the energy windows that metered trials on it report, and the least Zeus cost.

A metered trial reports after each epoch, cumulatively since it started: its energy (J) and time (s) as measured
(its energy window: training, evaluation, reporting), its training seconds and, of those, the seconds it waited
for data. Between two reports, ``k`` epochs of ``steps`` steps each give two stage windows on one device: the
**preprocessing** window (the data wait; ``batch`` samples per step) and the **computing** window (the rest of
the training; ``members × batch`` member-samples per step). The energy is read per epoch, not per stage, so each
window's joules are its seconds at the epoch's mean power (``ΔE / Δtime``).

A trial's cost on type ``g`` is ``η·E + (1−η)·MaxPower·T`` (Zeus's): ``E`` its predicted joules there (its
steps × (the fitted preprocessing step + the rest of its predicted step) at the fitted powers), ``T`` its
predicted finish there (waiting for a GPU of ``g`` included), ``MaxPower`` the highest fitted power per device of
any type.

A type with no energy model gets one only from a trial placed on it, so until every type has one, a trial goes to
a type not measured yet where it could cost least (:meth:`EnergyChoice.explore`). Its predicted energy is at most
``MaxPower·T``, so its cost on the quickest type is at most ``MaxPower·min(T)``, and on ``g`` at least
``(1−η)·MaxPower·T[g]``: a type with ``(1−η)·T[g] >= min(T)`` cannot be the cheaper one and is not explored.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from schedulers.energy.power_limit import energy_cost
from schedulers.prediction.energy_model import EnergyModel, Stage, StageWindow, rank_placements


@dataclass(frozen=True)
class EpochEnergy:
    """What a metered trial reported after ``epochs`` epochs, cumulative: ``energy_j`` (J) and ``time_s`` (s) of
    its energy window, ``train_s`` seconds of training, ``data_wait_s`` of them waiting for data."""

    epochs: int
    energy_j: float
    time_s: float
    train_s: float
    data_wait_s: float


def stage_windows(before: EpochEnergy, after: EpochEnergy, steps_per_epoch: int, batch_size: int,
                  members: int) -> list[StageWindow]:
    """The preprocessing and computing windows (one device) between two reports of a trial of ``members`` members
    (see the module docstring); none when no epoch, time or energy passed between them, and no window of a stage
    that took no time."""
    epochs = after.epochs - before.epochs
    seconds, joules = after.time_s - before.time_s, after.energy_j - before.energy_j
    if epochs < 1 or seconds <= 0 or joules < 0:
        return []
    power = joules / seconds
    wait = max(0.0, after.data_wait_s - before.data_wait_s)
    compute = max(0.0, after.train_s - before.train_s - wait)
    steps = epochs * steps_per_epoch
    rows = [(Stage.PREPROCESS, float(batch_size), wait), (Stage.COMPUTE, float(members * batch_size), compute)]
    return [StageWindow(stage, 1, samples, 0.0, steps, s, power * s) for stage, samples, s in rows if s > 0]


@dataclass(frozen=True)
class EnergyRanking:
    """The cost of a trial on each GPU type (J, see the module docstring) and the type of the least."""

    gpu: str
    cost_j: Mapping[str, float]


@dataclass
class EnergyChoice:
    """The energy windows trials measured per GPU type, and the choice of least cost at energy weight ``eta``
    (in [0, 1], as ``EnergySettings.eta``)."""

    eta: float
    windows: dict[str, list[StageWindow]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.eta <= 1:
            raise ValueError(f"EnergyChoice: eta is the energy weight of the cost, in [0, 1]; got {self.eta}")

    def record(self, gpu: str, windows: list[StageWindow]) -> None:
        """Windows measured by a trial on ``gpu``."""
        self.windows.setdefault(gpu, []).extend(windows)

    def models(self) -> dict[str, EnergyModel]:
        """Per GPU type with windows of both stages, its energy model."""
        return {gpu: EnergyModel.fit(rows) for gpu, rows in self.windows.items()
                if {w.stage for w in rows} >= {Stage.PREPROCESS, Stage.COMPUTE}}

    def explore(self, finish_s: Mapping[str, float], measuring: Collection[str]) -> str | None:
        """The type a trial predicted to finish ``finish_s[type]`` seconds from now goes to so that the type gets
        an energy model: of the types with none and no trial on them now (``measuring``: the types of the trials
        placed and not ended), those where the trial could cost least (see the module docstring), the one it
        would finish on first (ties: the name); ``None`` when there is no such type."""
        models, quickest = self.models(), min(finish_s.values())
        open_types = [gpu for gpu in finish_s if gpu not in models and gpu not in measuring
                      and (1.0 - self.eta) * finish_s[gpu] < quickest]
        return min(open_types, key=lambda gpu: (finish_s[gpu], gpu)) if open_types else None

    def rank(self, finish_s: Mapping[str, float], step_s: Mapping[str, float], steps: int,
             batch_size: int) -> EnergyRanking | None:
        """The type of least cost for a trial of ``steps`` steps of ``batch_size`` samples predicted to finish
        ``finish_s[type]`` seconds from now with steps of ``step_s[type]`` seconds; ``None`` while a type has no
        energy model (its trials have not reported an epoch yet)."""
        models = self.models()
        if not models or set(finish_s) - set(models):
            return None
        compute = {gpu: max(0.0, step_s[gpu] - models[gpu].fits[Stage.PREPROCESS].seconds(
            Stage.PREPROCESS, 1, batch_size, 0.0)) for gpu in finish_s}
        ranked = rank_placements(models, [(gpu, 1) for gpu in finish_s], batch_size, 0.0, steps, compute)
        max_power = max(fit.power_w for model in models.values() for fit in model.fits.values())
        cost = {gpu: energy_cost(p.total_joules, finish_s[gpu], self.eta, max_power) for gpu, _, p in ranked}
        return EnergyRanking(min(sorted(cost), key=cost.get), cost)
