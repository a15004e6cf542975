"""Placement of fused tuning trials into pipeline bubbles or onto dedicated resources (plain Python).

Pipeline jobs register their stages as bubble slots (idle share of the stage's time, memory it can spare);
dedicated workers register as dedicated slots. Early trials of a multi-fidelity search go to bubbles —
most idle stage first — so tuning uses otherwise wasted time; trials that reach ``promote_rung`` (the best,
late-stage ones) move to dedicated slots, where bubble-only execution does not slow them down. When a
pipeline job ends, its trials are handed back for placement elsewhere (they resume from checkpoints).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Slot:
    """Where one fused trial can run. ``idle_fraction``: share of the slot's time the trial gets (the
    stage's bubble fraction; 1 for a dedicated worker). ``free_bytes``: memory it can spare."""

    name: str
    dedicated: bool
    free_bytes: int
    idle_fraction: float = 1.0
    job: str | None = None
    trial: str | None = None
    host: str | None = None  # name of the actor that runs trials placed here


@dataclass
class TrialNeeds:
    trial_id: str
    memory_bytes: int
    rung: float = 0  # multi-fidelity rung reached (0: just started)
    dedicated_only: bool = False  # e.g. a full-size target: never in a bubble


class TrialTooLarge(MemoryError):
    """No registered slot has the memory a trial needs; the message gives the numbers."""


class BubblePlacement:
    """Assigns trials to slots; ``place`` for new or moved trials, ``promote`` as trials advance."""

    def __init__(self, promote_rung: float = 1) -> None:
        self.promote_rung = promote_rung
        self.slots: dict[str, Slot] = {}

    def add_slot(self, slot: Slot) -> None:
        if slot.name in self.slots:
            raise ValueError(f"slot {slot.name!r} is already registered")
        self.slots[slot.name] = slot

    def register_pipeline(self, job: str, stage_bubble_fractions: list[float], stage_free_bytes: list[int],
                          hosts: list[str] | None = None) -> None:
        """Every stage of ``job`` as a bubble slot ``<job>/<stage>`` (run by ``hosts[stage]`` if given)."""
        hosts = hosts or [None] * len(stage_free_bytes)
        for stage, (fraction, free, host) in enumerate(zip(stage_bubble_fractions, stage_free_bytes, hosts)):
            self.add_slot(Slot(f"{job}/{stage}", False, free, fraction, job=job, host=host))

    def remove_job(self, job: str) -> list[str]:
        """A pipeline job ended: drop its slots; returns the trials that ran there (to be placed again)."""
        ended = [s for s in self.slots.values() if s.job == job]
        for slot in ended:
            del self.slots[slot.name]
        return [s.trial for s in ended if s.trial is not None]

    def place(self, needs: TrialNeeds) -> Slot | None:
        """The slot for ``needs`` (now occupied by it), or ``None`` if every fitting slot is busy."""
        fitting = [s for s in self.slots.values() if s.free_bytes >= needs.memory_bytes]
        if not fitting:
            largest = max((s.free_bytes for s in self.slots.values()), default=0)
            raise TrialTooLarge(f"trial {needs.trial_id} needs {needs.memory_bytes / 2**20:.1f} MiB; the largest "
                                f"slot can spare {largest / 2**20:.1f} MiB (shrink the model or fuse fewer members)")
        free = [s for s in fitting if s.trial is None and (s.dedicated or not needs.dedicated_only)]
        late = needs.rung >= self.promote_rung
        # Late trials: dedicated first; early trials: the most idle bubble first, then dedicated.
        free.sort(key=lambda s: (not s.dedicated, -s.idle_fraction) if late else (s.dedicated, -s.idle_fraction))
        if not free:
            return None
        free[0].trial = needs.trial_id
        return free[0]

    def release(self, trial_id: str) -> None:
        for slot in self.slots.values():
            if slot.trial == trial_id:
                slot.trial = None

    def promote(self, needs: TrialNeeds) -> Slot | None:
        """A trial reached ``needs.rung``: if it is late-stage and runs only in a bubble while a dedicated slot
        is free, give it that slot (returned); otherwise ``None`` (it stays). Its bubble slot stays occupied
        until :meth:`vacate` (the trial is still leaving it)."""
        held = [s for s in self.slots.values() if s.trial == needs.trial_id]
        if needs.rung < self.promote_rung or not held or any(s.dedicated for s in held):
            return None
        target = next((s for s in self.slots.values() if s.dedicated and s.trial is None
                       and s.free_bytes >= needs.memory_bytes), None)
        if target is not None:
            target.trial = needs.trial_id
        return target

    def vacate(self, slot_name: str) -> None:
        """The trial in ``slot_name`` has left it (after a move)."""
        if slot_name in self.slots:
            self.slots[slot_name].trial = None
