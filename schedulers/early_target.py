"""Early full-size targets (plain Python): which configurations may start their full-size targets while the last
surrogate rung's stragglers still train, on a trial slot the rung leaves idle.

The rule: only what the stragglers cannot change. While a surrogate rung trains, a configuration whose every seed
finished starts its target early when the full-size stage after the rung is certain to train it, whatever the
unfinished configurations score: the stage after the rung is the ladder's full-size targets whatever the rung's last
scores (no full-size stage trained yet, and the rung is not the first after the search where an escalation can
follow: the first rung's scores decide that), and the configuration ranks among the ``top_k`` even if every
unfinished configuration finished ahead of it (its rank among the finished ones plus the unfinished count is below
``top_k``). A member that has not finished can finish first, so with ``top_k=1`` no target starts before the rung
has closed; with ``top_k=2`` the best finished configuration starts once one configuration is left to finish.
The targets started early are exactly some of those the rung, once closed, chooses: the returned configuration and
every stage's scores are those of waiting for the rung.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

from schedulers.transfer import FULL_SIZE, RungKind, Score, Stages, TransferPolicy


def early_targets(policy: TransferPolicy, stages: Stages, scale: int, partial: Mapping[str, Score],
                  unfinished: int, started: Collection[str]) -> list[str]:
    """The configurations (best first) whose full-size targets may start now, none already ``started``.

    Args:
        policy: the search's transfer policy.
        stages: the scores of the finished stages (the search's first).
        scale: the scale of the rung in progress.
        partial: that rung's scores of its finished configurations (config id -> score; every seed finished).
        unfinished: that rung's configurations not in ``partial`` that may still finish with a score.
        started: configurations whose full-size target has started.

    Returns:
        The configurations the full-size stage after the rung trains whatever its unfinished configurations score;
        empty when there is none or that stage is not certain.
    """
    if not partial:
        return []
    rungs = policy.rungs(stages)
    if any(r.scale == FULL_SIZE for r in rungs):
        return []  # the targets trained already shift which configurations a later full-size stage names
    first = scale == policy.scale // 2 and not any(r.kind == RungKind.ESCALATION for r in rungs)
    if first and policy.can_escalate():
        return []  # the first rung's closing scores decide whether it escalates
    rung = policy.next_rung([*stages, partial])
    if rung is None or rung.scale != FULL_SIZE or rung.kind is not RungKind.LADDER:
        return []
    ranked = policy.ranking(partial)
    return [c for c in rung.configs if c not in started and ranked.index(c) + unfinished < policy.top_k]
