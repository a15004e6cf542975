"""How many members of a fused trial fit the memory a host can spare (measured, like ``hydro.plan_fusion``)."""
from __future__ import annotations

from collections.abc import Mapping

from hydro.planning import plan_fusion
from hydro.trial.spec import Batch, TuneSpec
from hydro.trial.surrogate import build_member


def members_that_fit(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[Batch, Batch],
                     max_members: int, budget_bytes: int) -> int:
    """The most members (at most ``max_members``) of ``config``'s group whose fused training step peaks
    within ``budget_bytes`` (see :func:`hydro.planning.plan_fusion`); 0 if not even one does."""
    (x, y), _ = data
    size = spec.batch_size_of(config)
    try:
        plan = plan_fusion(lambda: build_member(spec.model, config, scale, mup=mup), (x[:size], y[:size]), spec.loss,
                           max_members=max_members, memory_budget_bytes=budget_bytes, steps=1, tolerance=1.0)
    except MemoryError:
        return 0
    return plan.num_members


def member_bytes(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[Batch, Batch]) -> int:
    """Peak bytes of one member's training step (what a slot must spare to host the trial at all)."""
    (x, y), _ = data
    size = spec.batch_size_of(config)
    plan = plan_fusion(lambda: build_member(spec.model, config, scale, mup=mup), (x[:size], y[:size]), spec.loss,
                       max_members=1, memory_budget_bytes=2**62, steps=1, tolerance=1.0)
    return plan.measurements[0].peak_bytes
