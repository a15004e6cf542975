"""Hydro's trials in pipeline bubbles: a Ray Tune trainable whose fused trials run on fill hosts.

The Tune trial is a thin proxy that needs almost no CPU of its own: it asks the placement service
(:mod:`hydro.tune.bubbles.service`) for a slot, attaches its fused trial (the ``HydroSearcher``'s plan of the
user's ``TuneSpec``, a :class:`~hydro.trial.unit.FusedTrial` in a fill process) to the slot's host — a pipeline
stage actor (gated by its bubbles) or a dedicated worker — and after every epoch takes the members' metrics,
asks the run's per-member stopping rule (:class:`~hydro.tune.search.session.MemberSession`), tells the fill which
members go on and reports, with a checkpoint every ``TuneSpec.checkpoint_every`` epochs.

Fusion follows the slot's free memory: when a slot holds fewer members than the trial has, the rest start
another fused trial (a second *unit* of the same Tune trial, placed on its own slot); the units meet at every
epoch's report. A unit moves without loss: when its pipeline job ends it continues elsewhere from the exact
state the job handed back; when the scheduler promotes the trial (:class:`~hydro.tune.bubbles.scheduler.
BubbleScheduler`) it moves to a dedicated worker with its exact state; if its host dies it resumes from the
state after its last epoch (batches depend only on (seed, epoch), so the replay is identical). A fill whose
own code raised fails its live members with the fill's exception (its traceback in the trial's
``hydro_traceback``), not retried: it would raise again; a fill process that was killed (e.g. by the OOM killer),
exited or hangs, or a fill that ran out of memory, raises :class:`FillTrialLost` to Tune, which retries the trial
from its last checkpoint. A fill that met only bubbles too short for one of its units of work (a layer, the loss,
the optimizer step) moves to a dedicated worker and goes on from the state after its last epoch.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable

import ray
import torch
from ray import tune

from hydro.bubbles.fill_process import RAISED, EpochResult, FailureKind, FillFailed, FillFailure
from hydro.bubbles.fit import member_bytes
from hydro.bubbles.gate import UnitNeverFits
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.energy.tuning import EnergySettings
from hydro.trial.spec import TuneSpec
from hydro.tune.bubbles.service import SERVICE_NAME, unit_key
from hydro.tune.placement.gpu_types import PLACEMENT_KEY
from hydro.tune.pipeline.job import pickled_workload
from hydro.tune.search.session import MemberSession, TrialFailed, TrialLost
from hydro.tune.search.trainable import run_trial

logger = logging.getLogger(__name__)

STATE_FILE = "hydro_fill_units.pt"
POLL_S = 0.02  # how often a proxy turns: takes its hosts' answers, asks the placement service where units go
WAIT_S = 1.0  # how long a host holds a proxy's status request while its fill has no news (see FillHost.fill_status)


def _qualified(error: type[BaseException]) -> str:
    return f"{error.__module__}.{error.__qualname__}"


# Raised in a fill because of where and when it ran, not by its code (a retry, elsewhere or later, can succeed):
# out of memory; a unit longer than the bubbles seen so far (moved to a dedicated worker where it is met in a
# unit, see _Proxy._failed).
CIRCUMSTANTIAL = (_qualified(UnitNeverFits), _qualified(torch.OutOfMemoryError))
NEVER_FITS = _qualified(UnitNeverFits)


class FillTrialError(TrialFailed):
    """A fill trial's own code raised in its process: the fill's exception in one line; ``details``: its
    traceback."""


class FillTrialLost(TrialLost):
    """A fill trial's process was killed, exited or hangs, or it raised one of the :data:`CIRCUMSTANTIAL` errors;
    the message carries the cause."""


def _fill_failure(members: list[str], slot: str, failure: FillFailure,
                  started: bool = True) -> FillTrialError | FillTrialLost:
    """The error of the fill trial of ``members`` on ``slot`` that failed with ``failure``."""
    where = f"the fill trial of members {', '.join(members)} {'failed' if started else 'could not start'} on {slot}"
    if failure.kind is not FailureKind.RAISED or any(t in CIRCUMSTANTIAL for t in failure.exception_types):
        return FillTrialLost(f"{where}: {failure.cause}")
    return FillTrialError(f"{failure.exception} ({where}: {RAISED})", f"{where}: {failure.cause}")


def bubble_trainable(spec: TuneSpec, poll_s: float = POLL_S) -> Callable[[dict], None]:
    """A Tune function trainable for a ``HydroSearcher`` run whose trials run on fill hosts. Run it with a
    placement service up and small trial resources (``tune.with_resources(..., {"cpu": 0.01})``)."""

    def hydro_bubble_trial(config: dict) -> None:
        run_bubble_trial(spec, config, poll_s)

    return hydro_bubble_trial


class _Unit:
    """One fused trial of the Tune trial's members on one slot (moves between slots with its state)."""

    def __init__(self, key: str, member_ids: list[str], state: dict | None = None) -> None:
        self.key, self.member_ids, self.state = key, member_ids, state
        self.slot: dict | None = None  # {"slot", "host", "mode"} while attached
        self.host = None
        self.result: EpochResult | None = None
        self.status = None  # the host's answer to come (an ObjectRef of fill_status) while awaiting an epoch
        self.done = False
        self.dedicated = False  # its units of work are longer than the bubbles it met: dedicated workers only


class _Proxy:
    def __init__(self, spec: TuneSpec, session: MemberSession, states: list[dict], poll_s: float) -> None:
        self.spec, self.session, self.poll_s = spec, session, poll_s
        self.service = ray.get_actor(SERVICE_NAME)
        self.trial_id = tune.get_context().get_trial_id()
        self.plan: TrialPlan = self.session.plan
        self.workload = pickled_workload(spec)
        self.dedicated_only = self.plan.kind != TrialKind.SURROGATE  # the target trains on a dedicated worker
        first = self.session.configs[0]
        self.need = member_bytes(spec, first, self.plan.scale, self.plan.mup, spec.load_data())
        self.units = ([_Unit(unit_key(self.trial_id, i), list(s["trial"]["member_ids"]), s) for i, s in enumerate(states)]
                      if states else [_Unit(unit_key(self.trial_id, 0), list(self.session.member_ids))])
        self.epoch = session.epoch
        self.decided: dict[str, list[str]] = {}  # unit key -> its members that went on after ``self.epoch``

    def run(self) -> None:
        try:
            while True:
                for unit in list(self.units):
                    if not unit.done:
                        self._advance(unit)
                live = [u for u in self.units if not u.done]
                if live and all(u.result is not None for u in live):
                    if not self._step(live):
                        return
                time.sleep(self.poll_s)
        finally:
            for unit in self.units:
                if unit.host is not None:
                    _quietly(unit.host.detach_fill)
            ray.get(self.service.release.remote(self.trial_id))

    def _advance(self, unit: _Unit) -> None:
        """Place/attach the unit, or follow it: take its posted epoch result, move it when it must."""
        if unit.slot is None:
            self._attach(unit)
            return
        if unit.result is None:
            self._follow(unit)
            if unit.slot is None:  # lost, failed or done
                return
        where = ray.get(self.service.assignment.remote(unit.key))
        if where is not None and "evicted" in where:  # the job ended: its hand-back, or what the host still has
            handed = where["evicted"] if where["evicted"] is not None else _quietly(unit.host.detach_fill)
            self._moved(unit, handed)
        elif where is not None and where["slot"] != unit.slot["slot"]:  # promoted to a dedicated worker
            moved = _quietly(unit.host.detach_fill)  # None: its host died meanwhile; it resumes from its last state
            self.service.left.remote(unit.slot["slot"])
            self._moved(unit, moved)

    def _follow(self, unit: _Unit) -> None:
        """A unit awaiting its epoch: keep one status request in flight (the host answers it at the fill's news,
        or after ``WAIT_S``) and take its answer once there is one."""
        if unit.status is None:
            unit.status = unit.host.fill_status.remote(WAIT_S)
        if not ray.wait([unit.status], timeout=0)[0]:
            return
        answer, unit.status = unit.status, None
        try:
            status = ray.get(answer)
        except ray.exceptions.RayActorError:  # the host died: resume elsewhere from the last state
            self._lost(unit)
            return
        if status is not None and "failed" in status:
            self._failed(unit, status["failure"])
        elif status is not None and status["result"] is not None:
            if status["result"].epoch <= self.epoch:  # replayed after a move: it was decided already
                self._decide(unit, self.decided[unit.key])
            else:
                unit.result = status["result"]

    def _attach(self, unit: _Unit) -> None:
        dedicated = self.dedicated_only or unit.dedicated
        slot = ray.get(self.service.place.remote(unit.key, self.need, self.epoch, dedicated))
        if slot is None:
            return
        try:
            host = ray.get_actor(slot["host"])
        except ValueError:  # the host's actor is gone
            self.service.slot_lost.remote(slot["slot"])
            return
        try:
            kept = ray.get(host.attach_fill.remote(self.workload, self.plan, slot["mode"],
                                                   member_ids=None if unit.state else unit.member_ids,
                                                   state=unit.state, epochs=self.spec.epochs,
                                                   one_member_bytes=self.need))
        except ray.exceptions.RayActorError:
            self.service.slot_lost.remote(slot["slot"])
            return
        except ray.exceptions.RayTaskError as error:
            if not isinstance(error.cause, FillFailed):
                raise FillTrialLost(f"the fill trial of members {', '.join(unit.member_ids)} could not start on "
                                    f"{slot['slot']}: {error.cause}") from None
            raise _fill_failure(unit.member_ids, slot["slot"], error.cause.failure, started=False) from None
        unit.slot, unit.host = slot, host
        if len(kept) < len(unit.member_ids):  # the slot holds fewer: the rest start another fused trial
            rest = unit.member_ids[len(kept):]
            unit.member_ids = list(kept)
            self.units.append(_Unit(unit_key(self.trial_id, len(self.units)), rest))
            logger.info("slot %s holds %d of %d members; the other %d start another fused trial", slot["slot"],
                        len(kept), len(kept) + len(rest), len(rest))

    def _step(self, live: list[_Unit]) -> bool:
        """Every unit posted the epoch: decide, tell the units, report. ``False`` when the trial is over."""
        epoch = live[0].result.epoch
        values = {m: {name: vs[i] for name, vs in u.result.metrics.items()}
                  for u in live for i, m in enumerate(u.result.member_ids)}
        names = list(live[0].result.metrics)
        metrics = {name: [values[m][name] for m in self.session.member_ids] for name in names}
        keep = self.session.step(epoch, metrics, final=epoch == self.spec.epochs,
                                 extra={"fused": True, "units": len(live),
                                        "slots": ",".join(u.slot["slot"] for u in live)})
        going_on = set(self.session.member_ids) if keep else set()
        self.epoch = epoch
        for unit in live:
            self.decided[unit.key] = [m for m in unit.member_ids if m in going_on]
            self._decide(unit, self.decided[unit.key])
        if keep and epoch % self.spec.checkpoint_every:
            self.session.report()
        else:
            with tempfile.TemporaryDirectory() as directory:
                states = [u.state for u in self.units if u.state is not None and (u.member_ids or not keep)]
                torch.save(states, os.path.join(directory, STATE_FILE))
                self.session.report(checkpoint=tune.Checkpoint.from_directory(directory))
        return bool(keep)

    def _decide(self, unit: _Unit, keep: list[str]) -> None:
        unit.status = None  # an answer asked for before the decision would be stale
        try:
            answer = ray.get(unit.host.fill_decide.remote(keep))
        except ray.exceptions.RayActorError:  # resumes from its last state, replays this epoch, decided again
            self._lost(unit)
            return
        if "failed" in answer:
            self._failed(unit, answer["failure"])
            return
        unit.state, unit.result, unit.member_ids = answer["state"], None, list(keep)  # the state: all after the last
        if not keep:  # its members are done: free the slot
            unit.done = True
            _quietly(unit.host.detach_fill)
            unit.host, unit.slot = None, None
            self.service.release_unit.remote(unit.key)

    def _failed(self, unit: _Unit, failure: FillFailure) -> None:
        """The unit's fill failed: a unit of work longer than every bubble of its slot moves to a dedicated worker
        and goes on from its last state (replaying, exactly, what came after it); any other failure ends the Tune
        trial (see :func:`_fill_failure`)."""
        if failure.kind is not FailureKind.RAISED or NEVER_FITS not in failure.exception_types:
            raise _fill_failure(unit.member_ids, unit.slot["slot"], failure)
        logger.warning("hydro: the fill trial of members %s does not fit the bubbles of %s (%s); it goes on from its "
                       "last state on a dedicated worker", ", ".join(unit.member_ids), unit.slot["slot"],
                       failure.exception)
        self.service.release_unit.remote(unit.key)
        unit.slot, unit.host, unit.result, unit.status, unit.dedicated = None, None, None, None, True

    def _lost(self, unit: _Unit) -> None:
        self.service.slot_lost.remote(unit.slot["slot"])
        unit.slot, unit.host, unit.result, unit.status = None, None, None, None

    def _moved(self, unit: _Unit, handed: dict | None) -> None:
        """The unit left its slot with ``handed`` (exact state; else it resumes from its last state)."""
        if handed is not None and "failed" in handed:
            self._failed(unit, handed["failure"])
            return
        if handed is not None:
            unit.state = handed["state"]
            unit.member_ids = list(unit.state["trial"]["member_ids"])
        unit.slot, unit.host, unit.result, unit.status = None, None, None, None


def bubble_fill(spec: TuneSpec, energy: EnergySettings | None = None):
    """:func:`bubble_trainable` with the small resources of a proxy; refuses to start without a placement
    service (nothing would host the trials). A trial whose config carries a GPU type (``placement="elastic"``
    places a bubbles run's targets) trains as an ordinary Hydro trial instead
    (:func:`~hydro.tune.search.trainable.run_trial`, measured with ``energy``), on 1 CPU and one GPU of that type."""
    try:
        ray.get_actor(SERVICE_NAME)
    except ValueError:
        raise RuntimeError("hydro.tune: bubbles=True needs the cluster's placement service with slots: register a "
                           "pipeline job (PipelineJob.register(placement_service())) and/or start_dedicated_hosts() "
                           "first") from None
    fill = bubble_trainable(spec)

    def hydro_bubble_trial(config: dict) -> None:
        if PLACEMENT_KEY in config:
            run_trial(spec, config, energy=energy)
        else:
            fill(config)

    def trial_request(config: dict) -> tune.PlacementGroupFactory:
        if PLACEMENT_KEY in config:
            return tune.PlacementGroupFactory([{"CPU": 1.0, **dict(config[PLACEMENT_KEY].resources)}])
        return tune.PlacementGroupFactory([{"CPU": 0.01}])

    return tune.with_resources(hydro_bubble_trial, trial_request)


def run_bubble_trial(spec: TuneSpec, config: dict, poll_s: float) -> None:
    """Train the trial described by ``config`` on fill hosts, reporting per member every epoch."""
    states = _restored_states()
    ids = [m for s in states for m in s["trial"]["member_ids"]] if states else None
    epoch = max((s["trial"]["epoch"] for s in states), default=0)
    session = MemberSession(config, spec.metric, spec.mode, ids, epoch)
    with session.failing():  # an error of the trial's own code (the fill's included) fails its members, no retry
        _Proxy(spec, session, states, poll_s).run()


def _restored_states() -> list[dict]:
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return []
    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), weights_only=False)


def _quietly(method) -> dict | None:
    """``method.remote()``'s answer, or ``None`` if its actor is gone."""
    try:
        return ray.get(method.remote())
    except ray.exceptions.RayActorError:
        return None
