"""Energy of a fused trial, per epoch and per member: an observer of :class:`hydro.trial.unit.FusedTrial`.

Each epoch's energy (J), time (s) and cost (J, η·E + (1−η)·MaxPower·T), measured from the end of the previous
epoch (or :meth:`EnergyObserver.start`) to the end of this epoch's evaluation, is split in **equal shares among
the members that trained in that epoch**; a member that left keeps what it used. Members' shares add up to the
trial's totals. The power limit is profiled and applied through :class:`hydro.energy.trial.TrialEnergy`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass

import torch
from torch import Tensor

from hydro.energy.simulated import SimulatedDevice
from hydro.energy.trial import TrialEnergy
from hydro.trial.unit import FusedTrial, Observer


@dataclass
class Usage:
    """Energy (J), time (s) and cost (J) used, and member-epochs trained."""

    energy_j: float = 0.0
    time_s: float = 0.0
    cost: float = 0.0
    member_epochs: int = 0

    def add(self, energy_j: float, time_s: float, cost: float, member_epochs: int) -> None:
        self.energy_j += energy_j
        self.time_s += time_s
        self.cost += cost
        self.member_epochs += member_epochs


class EnergyObserver(Observer):
    """Measures a fused trial through ``energy``; ``stepped``: simulated devices to advance by one step per
    training step (the CPU stands in for them). Use ``start()`` before training and ``close()`` after (restores
    the power limits); :meth:`trial_metrics` and :meth:`member_metrics` are what the trial reports."""

    def __init__(self, energy: TrialEnergy, *, stepped: Sequence[SimulatedDevice] = ()) -> None:
        self.energy = energy
        self.stepped = list(stepped)
        self.total = Usage()
        self.members: dict[str, Usage] = {}
        self._measured = Usage()  # cumulative values of ``energy`` at the last epoch end (this process)

    def start(self) -> EnergyObserver:
        self.energy.__enter__()
        return self

    def close(self) -> None:
        self.energy.__exit__(None, None, None)

    def on_step_end(self, trial: FusedTrial, losses: Tensor) -> None:
        for device in self.stepped:
            device.step()
        self.energy.on_step()

    def on_epoch_end(self, trial: FusedTrial, metrics: Mapping[str, Tensor]) -> None:
        now = self.energy.metrics()
        epoch = [now["energy_j"] - self._measured.energy_j, now["time_s"] - self._measured.time_s,
                 now["cost"] - self._measured.cost]
        self._measured = Usage(now["energy_j"], now["time_s"], now["cost"])
        alive = trial.member_ids
        self.total.add(*epoch, len(alive))
        for member in alive:
            self.members.setdefault(member, Usage()).add(*(v / len(alive) for v in epoch), 1)

    def trial_metrics(self) -> dict[str, float | int | bool | None]:
        """The trial's ``energy_j`` (J), ``time_s`` (s), ``cost`` (J), ``member_epoch_cost`` (J per member per
        epoch trained), the applied ``power_limit_w`` (W, None while profiling or uncontrolled) and
        ``power_profiled_here`` (this trial profiled the limit)."""
        per_member_epoch = self.total.cost / self.total.member_epochs if self.total.member_epochs else float("nan")
        return {"energy_j": self.total.energy_j, "time_s": self.total.time_s, "cost": self.total.cost,
                "member_epoch_cost": per_member_epoch, "power_limit_w": self.energy.power_limit_w,
                "power_profiled_here": self.energy.profiled_here}

    def member_metrics(self, member_ids: Sequence[str]) -> dict[str, Tensor]:
        """``energy_j`` and ``cost`` (J) each member used so far, ``[F]`` in ``member_ids`` order."""
        usage = [self.members.get(m, Usage()) for m in member_ids]
        return {"energy_j": torch.tensor([u.energy_j for u in usage], dtype=torch.float64),
                "cost": torch.tensor([u.cost for u in usage], dtype=torch.float64)}

    def state_dict(self) -> dict:
        """What a checkpoint keeps, so a restored trial goes on counting from there."""
        return {"total": astuple(self.total), "members": {m: astuple(u) for m, u in self.members.items()}}

    def load_state_dict(self, state: Mapping) -> None:
        self.total = Usage(*state["total"])
        self.members = {m: Usage(*u) for m, u in state["members"].items()}
