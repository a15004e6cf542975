"""Trial slots (plain Python): how many trials of one resource request train on separate compute at once on a
cluster, whether a rung is worth spreading over them, and a group of members split evenly over trials. The
search and the width ladder's rungs use them to keep every slot busy: members fused into one trial train on one
slot while the others idle."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

TRIAL_OVERHEAD_S = 5.0
"""Seconds one more trial costs before it trains: a worker starting Python, Ray and torch, and the trial's set-up
(data, members). An upper bound since a stage's trials reuse the previous stage's workers (``HydroSearcher`` closes
stages on results): then only a trial beyond those workers, or a widened one, starts a worker."""


WARM_TRIAL_OVERHEAD_S = 1.0
"""Seconds one more trial costs on a worker the run already started (Tune's ``reuse_actors``): its set-up (data,
members), checkpoint and scheduling, without a process start."""


def trial_slots(nodes: Iterable[Mapping[str, float]], request: Mapping[str, float],
                max_concurrent: int | None = None) -> int:
    """Trials asking for ``request`` (one trial's Ray resources, e.g. ``{"CPU": 1, "GPU": 0}``) that train on
    separate compute at once over ``nodes`` (each alive node's total Ray resources), at most ``max_concurrent``.

    Per node, the trials all of its resources fit. Trials given a fraction of a GPU count one per card: Ray
    packs fractions onto a card, so trials sharing a card add no compute (fusion shares a card better), but each
    card of each node is a slot of its own (as far as the node's other resources fit a trial per card). At least
    1, so the caller can always split into that many."""
    need = {name: amount for name, amount in request.items() if amount > 0}
    if 0 < need.get("GPU", 0) < 1:
        need["GPU"] = 1.0  # one slot per card
    slots = sum(min((math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in need.items()), default=0)
                for node in nodes)
    return max(1, min(slots, max_concurrent) if max_concurrent else slots)


def rung_trials(work_s: float | None, slots: int, overhead_s: float = TRIAL_OVERHEAD_S) -> int:
    """How many trials to spread a rung over: ``slots`` when that saves more of its ``work_s`` (seconds of
    training as one trial; ``None``: not known) than the ``overhead_s`` of starting another trial, else 1."""
    if work_s is None or slots <= 1:
        return 1
    return slots if work_s * (1 - 1 / slots) > overhead_s else 1


def whole_round_counts(members: int, slots: int) -> list[int] | None:
    """The fusion counts to measure for ``members`` search configurations over ``slots`` trial slots: for r = 1, 2,
    4, ... rounds, the fewest members per trial that train them all in r rounds, ``⌈members / (slots·r)⌉``
    (ascending, down to 1), so that the search's trials fill every slot in each round. plan_fusion's own ladder
    1, 2, 4, ... has counts that do not: 24 over 2 slots at 8 per trial are 3 trials, in 2 rounds as at 6 per
    trial, the second with one slot idle. ``None`` for one slot: any count keeps it busy."""
    if slots <= 1:
        return None
    rounds = -(-members // slots)  # at one member per trial
    return sorted({-(-members // (slots * r)) for r in [*(2 ** k for k in range(rounds.bit_length())), rounds]})


def split_evenly(items: Sequence[T], parts: int) -> list[list[T]]:
    """``items`` in order, in ``parts`` consecutive lists whose lengths differ by at most 1 (the longer
    first); fewer when there are fewer items."""
    if not items:
        return []
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [list(items[bounds[i]:bounds[i + 1]]) for i in range(parts)]
