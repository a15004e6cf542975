"""The gate that lets fill work run only inside a stage's bubbles, one layer at a time."""
from __future__ import annotations

import multiprocessing
import time

_OPEN, _DEADLINE, _ABORTED = range(3)


class FillAborted(Exception):
    """Raised inside a fill trial at a layer boundary when its host stops; the step in flight is dropped."""


class BubbleGate:
    """A :class:`~hydro.bubbles.hooks.BubbleListener` that fill trials wait on between layers.

    ``wait_for(cost_s)`` returns when a bubble is open and its predicted remaining time covers ``cost_s``
    (the layer's measured time), so fill work is cut to the predicted bubble and the stage waits for at
    most the layer in flight when a bubble ends early. ``always_open=True`` is naive co-location: fill
    work runs regardless of bubbles.

    The state lives in shared memory and wake-ups go through a semaphore, so the gate works across threads
    and across processes (pass it to a ``spawn`` child at creation). The stage's side never blocks:
    ``bubble_started``/``bubble_ended``/``abort`` are a few memory writes and one semaphore post.
    """

    def __init__(self, always_open: bool = False) -> None:
        context = multiprocessing.get_context("spawn")
        self.always_open = always_open
        self._state = context.RawArray("d", 3)  # open flag, deadline (time.monotonic() s), aborted flag
        self._doorbell = context.Semaphore(0)  # posted on every bubble start and on abort

    def bubble_started(self, stage: int, predicted_s: float, free_bytes: int) -> None:
        self._state[_DEADLINE] = time.monotonic() + predicted_s
        self._state[_OPEN] = 1.0
        self._doorbell.release()

    def bubble_ended(self, stage: int) -> None:
        self._state[_OPEN] = 0.0

    def abort(self) -> None:
        """Make every waiting and future ``wait_for`` raise :class:`FillAborted`."""
        self._state[_ABORTED] = 1.0
        self._doorbell.release()

    def wait_for(self, cost_s: float) -> None:
        while self._doorbell.acquire(False):  # posts of bubbles already over: the state below says it all
            pass
        while True:
            if self._state[_ABORTED]:
                self._doorbell.release()  # other waiters see the abort too
                raise FillAborted
            if self.always_open:
                return
            if self._state[_OPEN] and time.monotonic() + cost_s <= self._state[_DEADLINE]:
                return
            self._doorbell.acquire()
