"""How many members of a fused trial fit the memory a host can spare: one member's training step is measured
(like ``hydro.plan_fusion``), and a fused step of F members is taken to peak at F times that."""
from __future__ import annotations

from collections.abc import Mapping

from hydro.fusion_measure import plan_fusion
from hydro.trial.data import DataSource
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member


def member_bytes(spec: TuneSpec, config: Mapping, scale: int, mup: bool, data: tuple[DataSource, DataSource]) -> int:
    """Peak bytes of one member's training step on one batch of the training split (what a slot must spare to
    host the trial at all)."""
    batch = data[0].sample(spec.batch_size_of(config))
    plan = plan_fusion(lambda: build_member(spec.model, config, scale, mup=mup, shrink_options=spec.shrink_options()),
                       batch, spec.loss, max_members=1, memory_budget_bytes=2**62, steps=1, tolerance=1.0)
    return plan.measurements[0].peak_bytes


def members_that_fit(one_member_bytes: int, max_members: int, budget_bytes: int) -> int:
    """The most members (at most ``max_members``) whose fused training step fits ``budget_bytes``, 0 if not
    even one does. F members are taken to need F times one member's peak: an upper bound, since the batch they
    share is held once (measuring every F would cost a fill seconds of set-up per start)."""
    return min(max_members, budget_bytes // one_member_bytes)
