"""The ``"hydro"`` entry of a Ray trial's config: what one trial trains (no Ray here).

A trial of a ``HydroSearcher`` run is either a fused group of surrogate members or the full-size target;
a config without the entry is a plain Ray Tune trial (one configuration, full size, unfused: the baseline).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

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
    value (False for surrogates of a run with a target: the run's best result is then the target's)."""

    kind: TrialKind
    members: list[tuple[str, dict]]
    scale: int = 1
    mup: bool = False
    decisions: str | None = None
    reports_objective: bool = True
    source: dict = field(default_factory=dict)

    @property
    def fused(self) -> bool:
        return self.kind == TrialKind.SURROGATE

    def to_config(self) -> dict:
        return {HYDRO_KEY: {**asdict(self), "kind": self.kind.value,
                            "members": [{"id": m, "config": c} for m, c in self.members]}}


def plan_of(config: Mapping) -> TrialPlan:
    """The plan of a trial from its Ray config."""
    entry = config.get(HYDRO_KEY)
    if entry is None:
        return TrialPlan(TrialKind.PLAIN, [(PLAIN_MEMBER_ID, dict(config))])
    members = [(m["id"], dict(m["config"])) for m in entry["members"]]
    return TrialPlan(TrialKind(entry["kind"]), members, entry["scale"], entry["mup"], entry["decisions"],
                     entry["reports_objective"], dict(entry.get("source", {})))
