"""A :class:`~hydro.pipeline.hooks.BubbleListener` adapter for ``torch.distributed.pipelining`` schedules.

Those schedules run a whole iteration inside ``schedule.step()`` and expose no callback around their waits, but
the single-stage ones (``ScheduleGPipe``, ``Schedule1F1B`` in torch 2.13) wait for every activation and
gradient through one module-level function, ``schedules._wait_batch_p2p``. :class:`PipeliningBubbles` wraps
``step`` and, for its duration, that function: each wait is announced as a bubble, its predicted length the
smoothed length of the same wait (by its position in the iteration) in earlier iterations, measured on the
stage's device (:func:`~hydro.pipeline.hooks.announced_wait`: on a GPU the host blocks where the stream idles, so
the bubble the listener sees is the device's; that is one host synchronisation per wait, none elsewhere). Limits: it relies on
that private function (checked at construction; a torch that renames it is refused with an error), and the
multi-stage runtime schedules (``_PipelineScheduleRuntime`` subclasses) also call ``work.wait()`` directly, so
for them only part of the waits would be seen — they are refused too.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from hydro.pipeline.hooks import BubbleListener, announced_wait
from hydro.pipeline.timing import DeviceTimer


class PipeliningBubbles:
    """Wraps a single-stage ``torch.distributed.pipelining`` schedule of stage ``stage``: ``step(...)`` runs
    the schedule's step with every wait reported to ``listener``."""

    def __init__(self, schedule, listener: BubbleListener, stage: int, device: torch.device | str = "cpu") -> None:
        from torch.distributed.pipelining import schedules

        if not isinstance(schedule, schedules.PipelineScheduleSingle):
            raise TypeError(f"hydro.bubbles.pipelining.PipeliningBubbles: {type(schedule).__name__} is not a "
                            f"single-stage schedule; the runtime (multi-stage) schedules wait outside "
                            f"_wait_batch_p2p, so their bubbles cannot all be seen. Use ScheduleGPipe or Schedule1F1B")
        if not callable(getattr(schedules, "_wait_batch_p2p", None)):
            raise RuntimeError("hydro.bubbles.pipelining.PipeliningBubbles: this torch has no "
                               "torch.distributed.pipelining.schedules._wait_batch_p2p to hook; use "
                               "hydro.pipeline.PipelineStage, or call the BubbleListener around the waits yourself")
        self.schedule, self.listener, self.stage, self.device = schedule, listener, stage, torch.device(device)
        self.timer = DeviceTimer(self.device)
        self.predicted: list[float] = []  # seconds, by the wait's position in the iteration
        self._schedules = schedules

    def step(self, *args, **kwargs):
        original: Callable = self._schedules._wait_batch_p2p
        position = [0]

        def waiting(work) -> None:
            index = position[0]
            position[0] += 1
            if index == len(self.predicted):
                self.predicted.append(0.0)
            start, end = announced_wait(self.listener, self.stage, self.predicted[index], self.timer,
                                        lambda: original(work))
            self.predicted[index] = 0.5 * self.predicted[index] + 0.5 * self.timer.seconds(start, end)

        self._schedules._wait_batch_p2p = waiting
        try:
            return self.schedule.step(*args, **kwargs)
        finally:
            self._schedules._wait_batch_p2p = original
