"""Fused fill trials as Ray Tune trials, placed into pipeline bubbles or onto dedicated workers.

The Tune trial is a thin proxy that needs almost no CPU of its own: it asks the placement service
(:mod:`hydro.tune.bubble_service`) for a slot, attaches its fused trial to the slot's host (a pipeline
stage actor, or a dedicated worker), and reports per-member losses with a checkpoint every
``report_every`` steps. When its pipeline job ends it continues elsewhere from the exact checkpoint the job
handed back; when the scheduler promotes it (:class:`hydro.tune.bubble_scheduler.BubbleScheduler`) it
moves to a dedicated worker with its exact state; if its host dies, it resumes from its last reported
checkpoint (the steps since are trained again, identically: batches depend only on (seed, step)).
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import ray
import torch
from ray import tune

from hydro.tune.bubble_service import SERVICE_NAME

from hydro.bubbles.fill import FillSpec, FillTooLarge, fill_memory_bytes

CHECKPOINT_FILE = "hydro_fill.pt"


def fill_trainable(template: FillSpec, steps: int, report_every: int, poll_s: float = 0.02
                   ) -> Callable[[dict], None]:
    """A Tune function trainable: trial config ``{"members": [{"lr": ..., "momentum": ...}, ...]}`` is one
    fused trial of ``template``'s model, trained ``steps`` steps. Run it with a placement service up and
    small trial resources (e.g. ``tune.with_resources(..., {"cpu": 0.01})``): the hosts do the work."""

    def fill_trial(config: dict) -> None:
        run_fill_trial(replace(template, configs=list(config["members"])), steps, report_every, poll_s)

    return fill_trial


def run_fill_trial(spec: FillSpec, steps: int, report_every: int, poll_s: float) -> None:
    service = ray.get_actor(SERVICE_NAME)
    trial_id = tune.get_context().get_trial_id()
    restored = tune.get_checkpoint()
    checkpoint = torch.load(Path(restored.path) / CHECKPOINT_FILE, weights_only=False) if restored else None
    memory = fill_memory_bytes(spec)
    reported = checkpoint["completed_steps"] if checkpoint else 0
    try:
        while checkpoint is None or checkpoint["completed_steps"] < steps:
            slot = _wait_for_slot(service, trial_id, memory, poll_s)
            host = ray.get_actor(slot["host"])
            done = checkpoint["completed_steps"] if checkpoint else 0
            members = ray.get(host.attach_fill.remote(None if checkpoint else spec, slot["mode"], steps - done,
                                                      checkpoint, report_every))
            if members < len(spec.configs):
                ray.get(host.detach_fill.remote())
                raise FillTooLarge(f"slot {slot['slot']} can host {members} of this trial's {len(spec.configs)} "
                                   f"members; give fewer members per trial")
            checkpoint, reported = _follow(host, service, trial_id, slot, checkpoint, reported, steps, poll_s)
    finally:
        service.release.remote(trial_id)


def _wait_for_slot(service, trial_id: str, memory: int, poll_s: float) -> dict:
    while True:
        slot = ray.get(service.place.remote(trial_id, memory))
        if slot is not None:
            return slot
        time.sleep(poll_s)


def _follow(host, service, trial_id: str, slot: dict, last: dict | None, reported: int, steps: int,
            poll_s: float) -> tuple[dict | None, int]:
    """Report the hosted trial's snapshots until it finishes or must move; returns (checkpoint to continue
    from, last reported step)."""
    while True:
        time.sleep(poll_s)
        try:
            status = ray.get(host.fill_status.remote(reported))  # snapshots after what was reported
        except ray.exceptions.RayActorError:  # the host died: its slot is gone, resume from the last report
            service.slot_lost.remote(slot["slot"])
            return last, reported
        if status is not None:
            snapshot = status["snapshot"]
            if snapshot is not None:  # every report point, once
                done = snapshot["completed_steps"]
                reported = _catch_up(snapshot, status["snapshot_losses"], slot, reported, done - 1)
                last, reported = snapshot, _report(snapshot, slot["slot"], snapshot)
            if status["completed_steps"] >= steps:
                final = ray.get(host.detach_fill.remote())
                reported = _catch_up(final, final["snapshot_losses"], slot, reported, final["completed_steps"] - 1)
                if final["completed_steps"] > reported:
                    reported = _report(final, slot["slot"], final)
                return final, reported
        where = ray.get(service.assignment.remote(trial_id))
        if where is not None and "evicted" in where:  # the job ended: its hand-back, or what the host still has
            state = where["evicted"]
            if state is None:
                try:
                    state = ray.get(host.detach_fill.remote())
                except ray.exceptions.RayActorError:
                    pass
            return _moved(state, last, slot, reported)
        if where is not None and where["slot"] != slot["slot"]:  # promoted to a dedicated worker
            moved = ray.get(host.detach_fill.remote())
            service.left.remote(slot["slot"])
            return _moved(moved, last, slot, reported)


def _moved(state: dict | None, last: dict | None, slot: dict, reported: int) -> tuple[dict | None, int]:
    """Leaving ``slot`` with ``state`` (exact, with its report points) or else the last reported snapshot."""
    if state is None:
        return last, reported
    return state, _catch_up(state, state["snapshot_losses"], slot, reported, state["completed_steps"])


def _catch_up(state: dict, points: list[tuple[int, list[float]]], slot: dict, reported: int, through: int) -> int:
    """Report the report points (steps, per-member losses) after ``reported`` up to ``through`` steps."""
    for done, losses in points:
        if reported < done <= through:
            reported = _report({**state, "completed_steps": done, "losses": losses}, slot["slot"], None)
    return reported


def _report(point: dict, slot: str, checkpoint: dict | None) -> int:
    """Report the per-member losses after ``point["completed_steps"]`` steps (with ``checkpoint`` if given)."""
    losses = point["losses"]
    metrics = {"loss": sum(losses) / len(losses), "min_member_loss": min(losses),
               "completed_steps": point["completed_steps"], "slot": slot,
               **{f"members/{member}/loss": loss for member, loss in zip(point["member_ids"], losses)}}
    if checkpoint is None:
        tune.report(metrics)
        return point["completed_steps"]
    with tempfile.TemporaryDirectory() as directory:
        torch.save(checkpoint, Path(directory) / CHECKPOINT_FILE)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(directory))
    return point["completed_steps"]
