"""Early full-size targets (plain Python): which configuration may start its full-size target while the last
surrogate rung's stragglers still train, on a trial slot the rung leaves idle.

The rule. While every trial of a surrogate rung has started, some still train and a trial slot is idle, the
configurations the policy would train at full size next *if the rung closed now* — :meth:`TransferPolicy.next_rung
<schedulers.transfer.TransferPolicy.next_rung>` on the finished stages plus the rung's finished configurations
(every seed finished) — start their targets early, one a slot. A straggler can still change the winner (any member
still training can finish ahead), so this is a speculative start, kept exact by what the search driver does when
the rung closes: the stage after it is decided from all its members, exactly as without the early start; a
configuration that stage trains at full size whose target already started is not started again (a target trains
the same trial plan, seed and batches whenever it starts), and one it does not name counts for nothing: its value
enters no stage unless a later full-size stage (a fallback target) names that configuration. The returned
configuration is therefore the one waiting for the rung returns.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

from schedulers.transfer import FULL_SIZE, Score, Stages, TransferPolicy


def early_targets(policy: TransferPolicy, stages: Stages, partial: Mapping[str, Score],
                  started: Collection[str]) -> list[str]:
    """The configurations (best first) whose full-size targets may start now, none already ``started``.

    Args:
        policy: the search's transfer policy.
        stages: the scores of the finished stages (the search's first).
        partial: the stage in progress's scores of its finished configurations (config id -> score).
        started: configurations whose full-size target has started.

    Returns:
        The configurations of the full-size stage that would follow if the stage in progress closed with
        ``partial``; empty when none finished yet or the next stage would not be at full size.
    """
    if not partial:
        return []
    rung = policy.next_rung([*stages, partial])
    if rung is None or rung.scale != FULL_SIZE:
        return []
    return [c for c in rung.configs if c not in started]
