"""How many members of a fused trial fit the memory a host can spare (measured, like ``hydro.plan_fusion``)."""
from __future__ import annotations

from collections.abc import Mapping

from hydro.planning import FusionPlan, plan_fusion
from hydro.trial.data import DataSource
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member


def _measure(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[DataSource, DataSource],
             max_members: int, budget_bytes: int) -> FusionPlan:
    """One training step of 1..``max_members`` fused members on one batch of the training split."""
    batch = data[0].sample(spec.batch_size_of(config))
    return plan_fusion(lambda: build_member(spec.model, config, scale, mup=mup, shrink_options=spec.shrink_options()),
                       batch, spec.loss, max_members=max_members, memory_budget_bytes=budget_bytes, steps=1,
                       tolerance=1.0)


def members_that_fit(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[DataSource, DataSource],
                     max_members: int, budget_bytes: int) -> int:
    """The most members (at most ``max_members``) of ``config``'s group whose fused training step peaks
    within ``budget_bytes`` (see :func:`hydro.planning.plan_fusion`); 0 if not even one does."""
    try:
        return _measure(spec, config, scale, mup, data, max_members, budget_bytes).num_members
    except MemoryError:
        return 0


def member_bytes(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[DataSource, DataSource]) -> int:
    """Peak bytes of one member's training step (what a slot must spare to host the trial at all)."""
    return _measure(spec, config, scale, mup, data, 1, 2**62).measurements[0].peak_bytes
