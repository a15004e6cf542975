"""The ``"hydro"`` entry of a Ray trial's config: what one trial trains (no Ray here).

A trial of a ``HydroSearcher`` run is either a fused group of surrogate members or the full-size target;
a config without the entry is a plain Ray Tune trial (one configuration, full size, unfused: the baseline).
The entry is the :class:`TrialPlan` itself: a user's hyperparameters stay the only dict keys of a config, and
Ray Tune names trial directories after ``str(plan)`` (short) instead of every member's configuration.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from schedulers.rung_halving import RungHalving

HYDRO_KEY = "hydro"
PLAIN_MEMBER_ID, TARGET_MEMBER_ID = "trial", "target"  # the member id of a plain trial and of the target


class TrialKind(enum.StrEnum):
    SURROGATE = "surrogate"  # fused members (shrunk when scale > 1)
    TARGET = "target"        # the best member's configuration at full size
    PLAIN = "plain"          # one configuration, full size, unfused: a stock Ray Tune trial


@dataclass
class TrialPlan:
    """``kind``: surrogate (fused members), target (the best member's config at full size) or plain.
    ``members``: ``[(member id, config)]``; ``scale``: width divisor; ``mup``: build the models in µP
    (surrogates with ``scale > 1`` and the target of such a run); ``decisions``: name of the per-member
    stopping service, if any; ``reports_objective``: whether the trial-level objective is the best member's
    value (False for surrogates of a run with a target: the run's best result is then the target's);
    ``final_score_only``: only the last epoch's validation metrics are read (ladder rungs: no per-member
    stopping service, no inner searcher, no trial-level objective), so earlier epochs skip evaluation, except the
    milestones of ``halving``: a rung trial's successive halving over epochs, decided inside the trial (``None``: all
    its members train every epoch);
    ``cpus``: CPUs the trial asks Ray for and trains with as torch threads (idle slots' CPUs of the run), ``None``:
    the trainable's request."""

    kind: TrialKind
    members: list[tuple[str, dict]]
    scale: int = 1
    mup: bool = False
    decisions: str | None = None
    reports_objective: bool = True
    final_score_only: bool = False
    halving: RungHalving | None = None
    source: dict = field(default_factory=dict)
    cpus: int | None = None

    @property
    def fused(self) -> bool:
        return self.kind == TrialKind.SURROGATE

    @property
    def member_ids(self) -> list[str]:
        return [m for m, _ in self.members]

    def __str__(self) -> str:  # what Ray Tune puts in trial names and directory names
        first, last = self.members[0][0], self.members[-1][0]
        return f"{self.kind.value}_{first}" if first == last else f"{self.kind.value}_{first}-{last}"

    def __repr__(self) -> str:
        return f"TrialPlan({self}, scale={self.scale}, mup={self.mup})"

    def to_config(self) -> dict:
        """The plan as a Ray config entry (the user's hyperparameters go beside it)."""
        return {HYDRO_KEY: self}


def reported_plan(result: Mapping) -> TrialPlan | None:
    """The plan of the Hydro trial that reported ``result`` as Ray Tune hands it on (its ``config`` nested, or
    flattened as ``config/hydro``), with the configurations its members train with; ``None`` for a plain trial or
    a result without its configuration."""
    entry = result.get(f"config/{HYDRO_KEY}", result.get("config", {}).get(HYDRO_KEY))
    return entry if isinstance(entry, TrialPlan) else None


def plan_of(config: Mapping) -> TrialPlan:
    """The plan of a trial from its Ray config (a config without one is a plain trial)."""
    entry = config.get(HYDRO_KEY)
    if entry is None:
        return TrialPlan(TrialKind.PLAIN, [(PLAIN_MEMBER_ID, dict(config))])
    if not isinstance(entry, TrialPlan):
        raise TypeError(f"hydro: config[{HYDRO_KEY!r}] is Hydro's trial plan, got {type(entry).__name__}; do not use "
                        f"the key {HYDRO_KEY!r} for a hyperparameter")
    return entry
