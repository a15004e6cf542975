"""A trial's share of a GPU it shares with other trials (Ray's fractional ``num_gpus``): NVML counts a card's
energy, not a process's, so each trial on a card is charged its share of what the card used."""
from __future__ import annotations

from hydro.energy.device import EnergyDevice


class CardShare(EnergyDevice):
    """``share`` (0 < share <= 1) of ``card``'s energy; everything else (kind, power limits, clocks,
    synchronising) is the card's own. The cost's MaxPower of a share is that share of the card's
    (:class:`hydro.energy.trial.TrialEnergy`), so a share's cost is the share of the card's cost."""

    def __init__(self, card: EnergyDevice, share: float) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"hydro.energy: a trial's share of a GPU must be in (0, 1], got {share}")
        self.card, self.share, self.name, self.card_id = card, share, card.name, card.card_id

    @property
    def kind(self) -> str:
        return self.card.kind

    def energy_j(self) -> float:
        return self.share * self.card.energy_j()

    def power_limit_range_w(self) -> tuple[float, float]:
        return self.card.power_limit_range_w()

    def get_power_limit_w(self) -> float:
        return self.card.get_power_limit_w()

    def set_power_limit_w(self, watts: float) -> None:
        self.card.set_power_limit_w(watts)

    def close(self) -> None:
        self.card.close()

    def synchronize(self) -> None:
        self.card.synchronize()
