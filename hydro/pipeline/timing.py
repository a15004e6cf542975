"""Device time for pipeline stages and fill units: CUDA events on the current stream on a GPU, a host clock on the
CPU, behind one small interface, so the same stage and gate code measures GPU work where it runs.

A mark is taken where the host issues work; on CUDA it is an event recorded on the current stream, so the time
it stands for is when the device reached that point (not when the host launched the kernels before it).
:meth:`DeviceTimer.seconds` and :meth:`DeviceTimer.wall` read marks once they are reached (:meth:`wait`): a
stage reads its marks once per iteration, after its one synchronisation at the optimizer step.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Union

import torch

Mark = Union[float, "torch.cuda.Event"]


class DeviceTimer:
    """Marks and elapsed times on ``device``. ``clock``: the host clock of CPU marks (seconds; default
    ``time.perf_counter``, e.g. ``time.thread_time`` for the CPU time of the calling thread).

    On CUDA, :meth:`anchor` ties the device's time to the host's ``time.time()`` at a point where the stream is
    idle (the stage calls it after its per-iteration synchronisation), and :meth:`wall` gives a mark's
    wall-clock time from that anchor; on the CPU a mark is its own time (``wall`` maps ``clock`` to
    ``time.time()`` by their offset at the anchor)."""

    def __init__(self, device: torch.device | str = "cpu", clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.clock = clock
        self._anchor: tuple[Mark, float] | None = None
        self.anchor()

    def mark(self) -> Mark:
        """A mark at this point of the current stream's work (CUDA) or now (CPU)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return self.clock()

    def wait(self, mark: Mark) -> None:
        """Block the host until the device has reached ``mark`` (CPU: returns at once)."""
        if self.cuda:
            mark.synchronize()

    def seconds(self, start: Mark, end: Mark) -> float:
        """Seconds from ``start`` to ``end`` (both reached)."""
        if self.cuda:
            return start.elapsed_time(end) / 1e3
        return end - start

    def anchor(self) -> None:
        """Tie marks to the host's wall clock now (CUDA: synchronises the stream first)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        mark = self.mark()
        self.wait(mark)
        self._anchor = (mark, time.time())

    def wall(self, mark: Mark) -> float:
        """``mark`` (reached) as ``time.time()`` seconds."""
        origin, origin_wall = self._anchor
        return origin_wall + self.seconds(origin, mark)
