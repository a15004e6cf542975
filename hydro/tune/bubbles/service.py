"""The placement service: a named Ray actor around :class:`~schedulers.bubbles.BubblePlacement`.

Pipeline jobs register their stages (bubble slots), dedicated workers register as dedicated slots, and the
units of fill trials (see :mod:`hydro.tune.bubbles.fill_trainable`; a Tune trial has one unit per slot it needs, keyed
``<trial id>#<i>``) ask it where to run. It also keeps what a unit needs when its slot goes away: the state a
pipeline job hands back when it ends, or the slot a late-stage trial was promoted to; and, for jobs registered
with energy on, each stage's decision between fill trials and a clock plan, with its reason
(:mod:`hydro.tune.pipeline.stage_energy`).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import ray

from hydro.atomic_write import atomic_write
from hydro.bubbles.host import SlotMode
from schedulers.bubbles import BubblePlacement, Slot, TrialNeeds

logger = logging.getLogger(__name__)

SERVICE_NAME = "hydro-bubbles/placement"
STAGE_DECISIONS_FILE = "hydro_stage_decisions.json"


def unit_key(trial_id: str, index: int) -> str:
    """The placement key of a Tune trial's ``index``-th fused unit."""
    return f"{trial_id}#{index}"


def trial_of(key: str) -> str:
    return key.partition("#")[0]


class PlacementService:
    """Ray actor body. An assignment is ``{"slot", "host", "mode"}`` (``mode``: a :class:`SlotMode`, ``GATED`` in a
    bubble, ``DEDICATED`` on a worker of its own), or ``{"evicted": hand-back}`` after the unit's job ended (what
    the stage's ``detach_fill`` returned, or ``None``)."""

    def __init__(self, promote_rung: float = float("inf")) -> None:
        self.policy = BubblePlacement(promote_rung)
        self.assigned: dict[str, str] = {}  # trial -> slot it should run in
        self.evicted: dict[str, dict | None] = {}  # trial -> checkpoint handed back by its ended job
        self.needs: dict[str, TrialNeeds] = {}
        self.ending: dict[str, dict[str, str]] = {}  # job shutting down -> {slot: trial}
        self.decisions: dict[str, list[dict]] = {}  # job -> its stages' slack decisions (energy or fill trials)

    def register_pipeline(self, job: str, stage_bubble_fractions: list[float], stage_free_bytes: list[int],
                          hosts: list[str]) -> None:
        self.policy.register_pipeline(job, stage_bubble_fractions, stage_free_bytes, hosts)

    def register_stage(self, job: str, stage: int, bubble_fraction: float, free_bytes: int, host: str) -> None:
        """One stage of ``job`` as the bubble slot ``<job>/<stage>`` (for jobs whose stages register themselves,
        e.g. from a Ray Train worker: :mod:`hydro.tune.bubbles.ray_train`)."""
        self.policy.add_slot(Slot(f"{job}/{stage}", False, free_bytes, bubble_fraction, job=job, host=host))

    def record_decisions(self, job: str, decisions: list[dict]) -> None:
        """Keep how ``job``'s stages use their slack (``hydro.tune.pipeline.stage_energy.record``: the use, the
        values it was decided on and the reason)."""
        self.decisions[job] = decisions

    def stage_decisions(self) -> dict[str, list[dict]]:
        """Every registered job's stage decisions (see :meth:`record_decisions`)."""
        return self.decisions

    def add_dedicated(self, name: str, free_bytes: int, host: str) -> None:
        self.policy.add_slot(Slot(name, True, free_bytes, host=host))

    def place(self, trial_id: str, memory_bytes: int, rung: float = 0, dedicated_only: bool = False) -> dict | None:
        """A slot for the unit ``trial_id`` (raises ``TrialTooLarge`` with the numbers), or ``None`` while all
        are busy."""
        self.needs[trial_id] = TrialNeeds(trial_id, memory_bytes, rung, dedicated_only)
        self.evicted.pop(trial_id, None)
        if self.assigned.get(trial_id) in self.policy.slots:  # e.g. promoted while its job ended: it has a slot
            return self.assignment(trial_id)
        self.assigned.pop(trial_id, None)  # a slot of a job that ended while the unit was leaving it
        slot = self.policy.place(self.needs[trial_id])
        if slot is None:
            return None
        self.assigned[trial_id] = slot.name
        return self.assignment(trial_id)

    def assignment(self, trial_id: str) -> dict | None:
        if trial_id in self.evicted:
            return {"evicted": self.evicted[trial_id]}
        slot = self.policy.slots.get(self.assigned.get(trial_id, ""))
        if slot is None:
            return None
        return {"slot": slot.name, "host": slot.host, "mode": SlotMode.DEDICATED if slot.dedicated else SlotMode.GATED}

    def promote(self, trial_id: str, rung: float) -> list[str]:
        """The Tune trial reached ``rung``: move its units to free dedicated slots if it is late-stage (returns
        those slots)."""
        moved = []
        for key in [k for k in self.needs if trial_of(k) == trial_id]:
            needs = self.needs[key]
            needs.rung = rung
            if key not in self.assigned:
                continue
            target = self.policy.promote(needs)
            if target is not None:
                self.assigned[key] = target.name
                moved.append(target.name)
        return moved

    def left(self, slot_name: str) -> None:
        """A trial has detached from ``slot_name`` after being moved."""
        self.policy.vacate(slot_name)

    def job_ending(self, job: str) -> None:
        """``job`` is shutting down: no more placements on its stages; its trials wait for :meth:`job_ended` (or
        each stage's :meth:`slot_ended`). Called again while the job is ending, it does nothing."""
        if job in self.ending:
            return
        self.ending[job] = {s.name: s.trial for s in self.policy.slots.values() if s.job == job and s.trial}
        self.policy.remove_job(job)

    def job_ended(self, job: str, checkpoints: dict[str, dict | None]) -> None:
        """``job``'s stages are gone; their units get the hand-backs (by slot name) to continue elsewhere."""
        if job not in self.ending:
            self.job_ending(job)
        for slot_name, trial in self.ending.pop(job).items():
            self.evicted[trial] = checkpoints.get(slot_name)
            if self.assigned.get(trial) == slot_name:
                del self.assigned[trial]

    def slot_ended(self, slot_name: str, checkpoint: dict | None) -> None:
        """One stage of an ending job (see :meth:`job_ending`) is gone: its unit gets ``checkpoint`` (what the
        stage's ``detach_fill`` returned) to continue elsewhere."""
        job = slot_name.rpartition("/")[0]
        trials = self.ending.get(job, {})
        trial = trials.pop(slot_name, None)
        if trial is not None:
            self.evicted[trial] = checkpoint
            if self.assigned.get(trial) == slot_name:
                del self.assigned[trial]
        if not trials:
            self.ending.pop(job, None)

    def slot_lost(self, slot_name: str) -> None:
        """The host of ``slot_name`` died: drop its slot (a pipeline job with a dead stage: all its slots);
        trials there continue elsewhere from what they have."""
        slot = self.policy.slots.get(slot_name)
        if slot is None:  # gone already, or a stage of an ending job that died before handing its trial back
            if slot_name in self.ending.get(slot_name.rpartition("/")[0], {}):
                self.slot_ended(slot_name, None)
            return
        if slot.job is not None:
            self.job_ended(slot.job, {})
        else:
            del self.policy.slots[slot_name]
            if slot.trial is not None:
                self.evicted[slot.trial] = None
                self.assigned.pop(slot.trial, None)

    def stop_trial(self, trial_id: str) -> None:
        """Tune stopped the trial (e.g. an early-stopping decision): stop its fill trials on every host they
        occupy and free their slots."""
        hosts = [s.host for s in self.policy.slots.values()
                 if s.trial is not None and trial_of(s.trial) == trial_id and s.host is not None]
        ray.get([ray.get_actor(host).detach_fill.remote() for host in hosts])
        self.release(trial_id)

    def release(self, trial_id: str) -> None:
        """The Tune trial is finished: free the slots of all its units."""
        keys = {trial_id, *(k for k in [*self.needs, *self.assigned, *self.evicted] if trial_of(k) == trial_id)}
        keys.update(s.trial for s in self.policy.slots.values() if s.trial is not None and trial_of(s.trial) == trial_id)
        for key in keys:
            self.release_unit(key)

    def release_unit(self, key: str) -> None:
        """One unit is finished: free its slots."""
        self.policy.release(key)
        self.assigned.pop(key, None)
        self.evicted.pop(key, None)
        self.needs.pop(key, None)

    def slots(self) -> list[dict]:
        return [asdict(s) for s in self.policy.slots.values()]


def placement_service(promote_rung: float = float("inf")):
    """The run's placement service (created on first use; later calls get the same actor)."""
    return ray.remote(num_cpus=0)(PlacementService).options(
        name=SERVICE_NAME, get_if_exists=True).remote(promote_rung)


def write_stage_decisions(run_dir: str) -> dict[str, list[dict]]:
    """Write the placement service's stage decisions (job -> its stages' slack decisions, see
    :meth:`PlacementService.record_decisions`) to ``<run_dir>/hydro_stage_decisions.json``; returns them (nothing
    is written, with a warning, when the service is gone)."""
    try:
        service = ray.get_actor(SERVICE_NAME)
    except ValueError:
        logger.warning("hydro: the placement service is gone; the stages' decisions are not written to %s", run_dir)
        return {}
    decisions = ray.get(service.stage_decisions.remote())
    with atomic_write(os.path.join(run_dir, STAGE_DECISIONS_FILE)) as file:
        json.dump(decisions, file, indent=1)
    return decisions
