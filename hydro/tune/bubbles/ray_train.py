"""Bubble slots of a Ray Train pipeline job: one call in the user's train loop.

A ``TorchTrainer`` worker running one stage of a single-stage ``torch.distributed.pipelining`` schedule
(``ScheduleGPipe``, ``Schedule1F1B``) calls :func:`bubble_slots` once; the returned :class:`BubbleSlots` runs the
schedule's ``step`` with every wait announced as a bubble (:class:`~hydro.bubbles.pipelining.PipeliningBubbles`)
to a :class:`~hydro.bubbles.host.GatedHost` in the worker's process, and after ``measure_steps`` steps registers the
stage with the placement service (:mod:`hydro.tune.bubbles.service`) as the bubble slot ``<job>/<stage>``.

Hydro's fill trials reach the host through a named relay actor, ``hydro-bubbles/<job>/<stage>``, with the host's
interface: the relay queues each call, a thread in the worker takes the calls (long polls) and runs them on the
host in a few threads of its own, and the relay returns their answers. The relay is owned by the worker, so it dies
with the worker's process: the fills' proxies see the host gone and their members continue elsewhere from the state
after their last epoch. A worker that is alive but stops taking calls for ``lost_after_s`` is lost too: the relay
reports its slot lost and exits. At the end of the train loop (``with`` block, or :meth:`BubbleSlots.close`) the
stage hands its fill's exact state back to the placement service, so its members continue elsewhere without loss.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ray
import torch

from hydro.bubbles.host import GatedHost
from hydro.bubbles.pipelining import PipeliningBubbles
from hydro.tune.bubbles.service import SERVICE_NAME
from hydro.tune.pipeline.job import FILL_PRELOAD

logger = logging.getLogger(__name__)

MEASURE_STEPS = 2  # steps whose bubbles give the stage's bubble fraction before it registers
POLL_S = 1.0  # how long one long poll of the relay waits for a call
LOST_AFTER_S = 30.0  # a worker that took no call for this long (polls every POLL_S) is lost
HOST_CALLS = ("attach_fill", "fill_status", "fill_steps", "fill_decide", "detach_fill", "check_fill", "fill_budget")


class SlotRelay:
    """Ray actor body (asyncio): the host interface of a Ray Train stage, forwarded to the worker's thread.
    ``slot``: the placement slot it serves (reported lost when the worker stops taking calls)."""

    def __init__(self, slot: str, lost_after_s: float = LOST_AFTER_S) -> None:
        self.slot, self.lost_after_s = slot, lost_after_s
        self.calls: asyncio.Queue = asyncio.Queue()
        self.waiting: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.last_poll = time.monotonic()

    async def _forward(self, method: str, *args, **kwargs):
        call_id = next(self.ids)
        answer = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = answer
        await self.calls.put((call_id, method, args, kwargs))
        while not answer.done():
            await asyncio.wait([answer], timeout=min(POLL_S, self.lost_after_s))
            if not answer.done() and time.monotonic() - self.last_poll > self.lost_after_s:
                await self._lost()
        raised, value = answer.result()
        if raised:
            raise value
        return value

    async def _lost(self) -> None:
        logger.warning("hydro: the Ray Train worker of bubble slot %s took no call for %.0f s: slot lost", self.slot,
                       self.lost_after_s)
        await ray.get_actor(SERVICE_NAME).slot_lost.remote(self.slot)
        ray.actor.exit_actor()

    async def next_calls(self, timeout_s: float) -> list[tuple]:
        """The calls queued for the worker (``(id, method, args, kwargs)``), waiting up to ``timeout_s`` for one."""
        self.last_poll = time.monotonic()
        try:
            calls = [await asyncio.wait_for(self.calls.get(), timeout_s)]
        except asyncio.TimeoutError:
            calls = []
        while not self.calls.empty():
            calls.append(self.calls.get_nowait())
        self.last_poll = time.monotonic()
        return calls

    def answer(self, call_id: int, raised: bool, value) -> None:
        """The worker's answer to call ``call_id``: its return value, or the exception it raised."""
        waiting = self.waiting.pop(call_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result((raised, value))


def _relayed(method: str):
    async def call(self, *args, **kwargs):
        return await self._forward(method, *args, **kwargs)

    call.__name__ = method
    call.__doc__ = f"``{method}`` of the worker's host (see :class:`~hydro.bubbles.host.FillHost`)."
    return call


for _method in HOST_CALLS:
    setattr(SlotRelay, _method, _relayed(_method))


class BubbleSlots:
    """One pipeline stage in a Ray Train worker as a bubble slot (make it with :func:`bubble_slots`). Call
    :meth:`step` in place of ``schedule.step``; :meth:`close` (or the end of a ``with`` block) at the end of the
    train loop. Attributes: ``slot`` (``<job>/<stage>``), ``host`` (the worker's
    :class:`~hydro.bubbles.host.GatedHost`), ``bubble_fraction`` (measured, once registered)."""

    def __init__(self, schedule, job: str, stage: int, device: torch.device | str, measure_steps: int,
                 fill_memory_bytes: int | None, timeouts: dict | None, lost_after_s: float) -> None:
        try:
            self.service = ray.get_actor(SERVICE_NAME)
        except ValueError:
            raise RuntimeError("hydro.tune.bubbles.ray_train.bubble_slots: no placement service on this cluster to "
                               "register the stage with; start it (hydro.tune.bubbles.service.placement_service()) "
                               "before the TorchTrainer") from None
        if measure_steps < 1:
            raise ValueError(f"hydro.tune.bubbles.ray_train.bubble_slots: measure_steps must be at least 1, "
                             f"got {measure_steps}")
        cores = sorted(os.sched_getaffinity(0))
        self.job, self.stage, self.slot = job, stage, f"{job}/{stage}"
        self.host = GatedHost(f"stage {self.slot}", {cores[stage % len(cores)]}, fill_memory_bytes, timeouts,
                              preload=FILL_PRELOAD)
        self.pipeline = PipeliningBubbles(schedule, self.host.recorder, stage, device)
        self.measure_steps, self.bubble_fraction = measure_steps, None
        self._steps, self._wall_s, self._bubble_s = 0, 0.0, 0.0
        self.relay_name = f"hydro-bubbles/{self.slot}"
        self.relay = ray.remote(num_cpus=0)(SlotRelay).options(name=self.relay_name).remote(self.slot, lost_after_s)
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=f"hydro-slot-{stage}")
        self._serving = threading.Event()
        self._serving.set()
        self._server = threading.Thread(target=self._serve, name=f"hydro-slot-relay-{stage}", daemon=True)
        self._server.start()
        self._registered, self._closed = False, False

    def step(self, *args, **kwargs):
        """``schedule.step(*args, **kwargs)`` with its bubbles open to the hosted fill trial."""
        started = time.monotonic()
        result = self.pipeline.step(*args, **kwargs)
        if not self._registered:
            self._steps += 1
            self._wall_s += time.monotonic() - started
            self._bubble_s += sum(b.length for b in self.host.recorder.bubbles)
            if self._steps >= self.measure_steps:
                self._register()
        self.host.recorder.bubbles.clear()
        self.host.check_fill()
        return result

    def _register(self) -> None:
        self.bubble_fraction = self._bubble_s / self._wall_s if self._wall_s > 0 else 0.0
        ray.get(self.service.register_stage.remote(self.job, self.stage, self.bubble_fraction,
                                                   self.host.fill_budget(), self.relay_name))
        self._registered = True
        logger.info("hydro: %s registered as a bubble slot (bubble fraction %.2f)", self.slot, self.bubble_fraction)

    def close(self) -> dict | None:
        """End the slot: no more fills are placed here, the hosted fill stops and its state is handed to the
        placement service (its members continue elsewhere); returns that hand-back (``None`` without a fill)."""
        if self._closed:
            return None
        self._closed = True
        if self._registered:
            ray.get(self.service.job_ending.remote(self.job))
        handed = self.host.detach_fill()
        if self._registered:
            ray.get(self.service.slot_ended.remote(self.slot, handed))
        self._serving.clear()
        ray.kill(self.relay)
        self._server.join(timeout=POLL_S * 10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.host.detach_fill()  # a fill attached by a call already under way when the job began ending
        return handed

    def __enter__(self) -> BubbleSlots:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _serve(self) -> None:
        """Take the relay's calls and run each on the host in the pool (a status request may wait a while)."""
        while self._serving.is_set():
            try:
                calls = ray.get(self.relay.next_calls.remote(POLL_S))
            except ray.exceptions.RayActorError:
                return  # closed (or the relay reported this worker lost)
            for call in calls:
                self._pool.submit(self._run, *call)

    def _run(self, call_id: int, method: str, args: tuple, kwargs: dict) -> None:
        try:
            answer = (False, getattr(self.host, method)(*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - the caller gets it, as from the host itself
            answer = (True, error)
        self.relay.answer.remote(call_id, *answer)


def bubble_slots(schedule, job: str, stage: int | None = None, device: torch.device | str = "cpu", *,
                 measure_steps: int = MEASURE_STEPS, fill_memory_bytes: int | None = None,
                 timeouts: dict | None = None, lost_after_s: float = LOST_AFTER_S) -> BubbleSlots:
    """Offer this Ray Train worker's pipeline stage to Hydro's fill trials; call it in the train loop of every
    worker, after building the schedule::

        with bubble_slots(schedule, job="llm") as pipe:
            for x, y in batches:
                pipe.step(x) if rank == 0 else pipe.step(target=y, losses=losses)

    Args:
        schedule: a single-stage ``torch.distributed.pipelining`` schedule (``ScheduleGPipe``, ``Schedule1F1B``).
        job: the pipeline job's name, the same on every worker; its slots are ``<job>/<stage>``.
        stage: this worker's stage (default: its Ray Train world rank).
        device: the stage's device (its bubbles are measured there).
        measure_steps: steps measured for the bubble fraction before the stage registers.
        fill_memory_bytes: what a fill trial may use here (default: a quarter of the free memory).
        timeouts: ``answer_timeout_s``/``unit_timeout_s`` of the fill processes.
        lost_after_s: a worker that takes no call from the relay for this long is reported lost.

    Raises:
        RuntimeError: no placement service on the cluster.
        TypeError: ``schedule`` is not a single-stage schedule.
    """
    if stage is None:
        stage = ray.train.get_context().get_world_rank()
    return BubbleSlots(schedule, job, stage, device, measure_steps, fill_memory_bytes, timeouts, lost_after_s)
