"""The gate that lets fill work run only inside a stage's bubbles, one layer at a time."""
from __future__ import annotations

import threading
import time


class FillAborted(Exception):
    """Raised inside a fill trial at a layer boundary when its host stops; the step in flight is dropped."""


class BubbleGate:
    """A :class:`~hydro.bubbles.hooks.BubbleListener` that fill trials wait on between layers.

    ``wait_for(cost_s)`` returns when a bubble is open and its predicted remaining time covers ``cost_s``
    (the layer's measured time), so fill work is cut to the predicted bubble and the stage waits for at
    most the layer in flight when a bubble ends early. ``always_open=True`` is naive co-location: fill
    work runs regardless of bubbles.
    """

    def __init__(self, always_open: bool = False) -> None:
        self.always_open = always_open
        self._cond = threading.Condition()
        self._open = False
        self._deadline = 0.0
        self._aborted = False

    def bubble_started(self, stage: int, predicted_s: float, free_bytes: int) -> None:
        with self._cond:
            self._open = True
            self._deadline = time.perf_counter() + predicted_s
            self._cond.notify_all()

    def bubble_ended(self, stage: int) -> None:
        with self._cond:
            self._open = False

    def abort(self) -> None:
        """Make every waiting and future ``wait_for`` raise :class:`FillAborted`."""
        with self._cond:
            self._aborted = True
            self._cond.notify_all()

    def wait_for(self, cost_s: float) -> None:
        with self._cond:
            while True:
                if self._aborted:
                    raise FillAborted
                if self.always_open:
                    return
                if self._open and time.perf_counter() + cost_s <= self._deadline:
                    return
                self._cond.wait()
