"""The results of a Hydro search's members (plain Python): which fused trial trains which members, each
member's latest and final result, and the events an inner searcher must hear — each member's epoch once,
whatever retried or restored trials report again."""
from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


class EventKind(enum.Enum):
    RESULT = "result"      # an intermediate result of the member
    COMPLETE = "complete"  # the member finished (its last epoch, stopped early, or its trial failed)


@dataclass(frozen=True)
class MemberEvent:
    member: str
    kind: EventKind
    result: dict | None  # the member's metrics (None: it failed before reporting anything)
    error: bool = False


@dataclass
class MemberLedger:
    """``trials``: trial id -> its member ids; ``last``: latest result per member; ``finished``: final result
    per finished member (``None`` if it failed without one); ``failed``: members that ended in an error."""

    trials: dict[str, list[str]] = field(default_factory=dict)
    last: dict[str, dict] = field(default_factory=dict)
    finished: dict[str, dict | None] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)

    def add_trial(self, trial_id: str, members: Sequence[str]) -> None:
        self.trials[trial_id] = list(members)

    def observe(self, results: Mapping[str, Mapping]) -> list[MemberEvent]:
        """Events for member results of one trial report (member id -> metrics with ``epoch`` and ``done``).
        A member's first report of an epoch stands; finished members and placeholders (a member that left its
        trial earlier, reported with a NaN epoch) give none."""
        events = []
        for member, values in results.items():
            epoch = values.get("epoch", math.nan)
            if member in self.finished or not math.isfinite(epoch):
                continue
            done = bool(values.get("done"))
            if not done and epoch <= self.last.get(member, {}).get("epoch", 0):
                continue  # a retried or restored trial reports epochs again
            self.last[member] = dict(values)
            events.append(self._finish(member, dict(values)) if done else
                          MemberEvent(member, EventKind.RESULT, dict(values)))
        return events

    def trial_complete(self, trial_id: str, error: bool) -> list[MemberEvent]:
        """The trial ended: its unfinished members finish with their last result (failed if ``error`` or if
        they never reported)."""
        return [self._finish(m, self.last.get(m), error=error or m not in self.last)
                for m in self.trials.get(trial_id, []) if m not in self.finished]

    def reject(self, member: str) -> MemberEvent:
        """A member that failed before any trial trained it (its configuration cannot train)."""
        return self._finish(member, None, error=True)

    def running(self) -> bool:
        """Whether a member of a started trial has not finished."""
        return any(m not in self.finished for members in self.trials.values() for m in members)

    def _finish(self, member: str, result: dict | None, error: bool = False) -> MemberEvent:
        self.finished[member] = result
        if error:
            self.failed.add(member)
        return MemberEvent(member, EventKind.COMPLETE, result, error)
