"""The small interface a pipeline framework calls around its idle waits, and a recorder of bubbles."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from hydro.profiling import free_memory_bytes

from .timing import DeviceTimer, Mark


class BubbleListener(Protocol):
    """Called by a pipeline stage around every wait for an activation or a gradient (a bubble)."""

    def bubble_started(self, stage: int, predicted_s: float, free_bytes: int) -> None: ...

    def bubble_ended(self, stage: int) -> None: ...


@dataclass
class Bubble:
    stage: int
    start: float  # wall-clock seconds (time.time())
    end: float
    predicted_s: float
    free_bytes: int

    @property
    def length(self) -> float:
        return self.end - self.start


class BubbleRecorder:
    """A listener that records every bubble (start, end, predicted length, free memory) and forwards the
    calls to further listeners."""

    def __init__(self, *listeners: BubbleListener) -> None:
        self.bubbles: list[Bubble] = []
        self.listeners = list(listeners)
        self._open: Bubble | None = None

    def bubble_started(self, stage: int, predicted_s: float, free_bytes: int) -> None:
        self._open = Bubble(stage, time.time(), float("nan"), predicted_s, free_bytes)
        for listener in self.listeners:
            listener.bubble_started(stage, predicted_s, free_bytes)

    def bubble_ended(self, stage: int) -> None:
        for listener in self.listeners:
            listener.bubble_ended(stage)
        if self._open is not None:
            self._open.end = time.time()
            self.bubbles.append(self._open)
            self._open = None


def announced_wait(listener: BubbleListener, stage: int, predicted_s: float, timer: DeviceTimer,
                   wait: Callable[[], None]) -> tuple[Mark, Mark]:
    """Run ``wait()`` (a wait for a received activation or gradient) as a bubble announced to ``listener``; returns
    the bubble's start and end marks on the stage's device (read them once reached: ``timer.seconds``).

    The host blocks where the device idles, so the listener's bubble is the device's: first until the stage's
    queued work is done (the device idles from then), then, after ``wait()`` (NCCL's ``work.wait()`` only makes
    the stream wait), until the received data is there. On the CPU both blocks return at once.
    """
    timer.wait(timer.mark())
    start = timer.mark()
    listener.bubble_started(stage, predicted_s, free_memory_bytes(timer.device))
    try:
        wait()
        end = timer.mark()
        timer.wait(end)
    finally:
        listener.bubble_ended(stage)
    return start, end
