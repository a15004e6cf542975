"""Whether a search's ladder rungs halve when the user lets Hydro choose (``halving="auto"``), from the search's
own learning curves (plain Python).

Rung halving (:mod:`schedulers.rung_halving`) stops most of a rung's members at milestone epochs on their ranking
there. That holds only where a milestone's ranking predicts the end of training; where training overfits it does not
(``docs/design/transfer.md``). The search's members train every epoch, so before any rung trains their scores tell:
the rungs halve when, at every milestone, the Spearman rank agreement of the search members' scores there with their
final scores has a one-sided 95% lower bound of at least ``min_agreement`` (the bound the transfer check uses, from
the other side: the agreement must be shown, not merely not refuted). Only a search at S <= :data:`MAX_SEARCH_SCALE`
is read so: a narrower search may rank early as at the end where its wider rungs overfit.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schedulers import rung_halving
from schedulers.member_stopping import score
from schedulers.transfer import FULL_SIZE, TransferPolicy, rho_lower_bound, spearman

MIN_MEMBERS = 4  # fewer search members with a full curve give no bound
# The widest divisor whose search's curves stand for its rungs': narrower surrogates may not overfit where the wider
# rungs do (docs/design/transfer.md).
MAX_SEARCH_SCALE = 4


@dataclass(frozen=True)
class MilestoneAgreement:
    """Rank agreement of ``members`` search members' scores after ``epoch`` with their final scores: Spearman
    ``rho`` and its one-sided 95% ``lower`` bound (NaN with fewer than :data:`MIN_MEMBERS`)."""

    epoch: int
    members: int
    rho: float
    lower: float


@dataclass(frozen=True)
class HalvingChoice:
    """``halving``: whether the rungs halve; ``agreements``: the check at each milestone (as far as checking
    went); ``reason``: the choice in words, for the log."""

    halving: bool
    agreements: tuple[MilestoneAgreement, ...]
    reason: str


def choose_halving(milestones: Sequence[int], curves: Mapping[str, Mapping[int, float]], final: Mapping[str, float],
                   mode: str, min_agreement: float) -> HalvingChoice:
    """Whether the rungs halve, from the search members' curves.

    Args:
        milestones: the rungs' milestone epochs (:func:`schedulers.rung_halving.milestones`), ascending.
        curves: search member -> {epoch: the metric after it}, at least at the milestones.
        final: search member -> the metric after its last epoch, for the members that trained every epoch (members
            stopped early are left out: their end is unknown).
        mode: ``"min"`` or ``"max"`` (NaN and ±inf score worst).
        min_agreement: the least lower bound of Spearman rho at a milestone, in [-1, 1].

    Returns:
        The :class:`HalvingChoice`: halving only when every milestone agrees; none without milestones or with fewer
        than :data:`MIN_MEMBERS` members scored at a milestone and at the end.
    """
    if not milestones:
        return HalvingChoice(False, (), "no milestone epoch: the members train too few epochs to cut")
    agreements = []
    for epoch in milestones:
        members = [m for m in final if epoch in curves.get(m, {})]
        rho = spearman([score(curves[m][epoch], mode) for m in members], [score(final[m], mode) for m in members]) \
            if len(members) >= MIN_MEMBERS else math.nan
        agreement = MilestoneAgreement(epoch, len(members), rho, rho_lower_bound(rho, len(members)))
        agreements.append(agreement)
        if not agreement.lower >= min_agreement:
            break
    words = "; ".join(f"after epoch {a.epoch}: Spearman {a.rho:.2f} over {a.members} (95% lower bound {a.lower:.2f})"
                      for a in agreements)
    halving = all(a.lower >= min_agreement for a in agreements)
    verdict = ("every milestone ranks the search's members as their end does" if halving else
               f"a milestone's ranking is not shown to predict the end's (lower bound below {min_agreement:g}): the "
               f"rungs train every member to the end")
    return HalvingChoice(halving, tuple(agreements), f"the search members' curves, {words}: {verdict}")


def auto_halving(policy: TransferPolicy, curves: Mapping[str, Mapping[int, float]],
                 final: Mapping[str, float]) -> HalvingChoice:
    """The rungs' halving of ``policy`` when its ``halving`` is :data:`~schedulers.transfer.AUTO`, as the search
    driver decides it when the stages start.

    Args:
        policy: the transfer policy (its ``scale``: the search's; ``epochs``: what a member trains).
        curves: search member -> {epoch: the metric after it}, at least at the milestones of ``policy.epochs`` and
            ``policy.eta`` (:func:`~schedulers.rung_halving.milestones`).
        final: search member -> the metric after its last epoch, for the members that trained every epoch.

    Returns:
        :func:`choose_halving` over the milestones where a ladder rung could halve (a ladder whose first rung is
        finer than the search but not full size, one seed) and the search is at S <= :data:`MAX_SEARCH_SCALE`;
        otherwise off, without a check.
    """
    if not _has_halving_rungs(policy):
        return HalvingChoice(False, (), "no ladder rung could halve (no ladder, a first rung at full size, or seed "
                                        "repeats, whose rungs train whole)")
    if policy.scale > MAX_SEARCH_SCALE:
        return HalvingChoice(False, (), f"a search at S={policy.scale} is too narrow to show whether its rungs "
                                        f"(S={policy.scale // 2} and finer) overfit: the rungs train every member to "
                                        f"the end (the check reads curves at S <= {MAX_SEARCH_SCALE})")
    return choose_halving(rung_halving.milestones(policy.epochs, policy.eta), curves, final, policy.mode,
                          policy.min_agreement)


def reads_curves(policy: TransferPolicy) -> bool:
    """Whether :func:`auto_halving` decides ``policy``'s halving from the search members' curves (else it is off
    without them, and nobody need record them)."""
    return _has_halving_rungs(policy) and policy.scale <= MAX_SEARCH_SCALE


def _has_halving_rungs(policy: TransferPolicy) -> bool:
    """A ladder whose first rung is finer than the search but not full size, with one seed."""
    return policy.ladder and policy.scale // 2 > FULL_SIZE and policy.seeds == 1
