"""The gate that lets fill work run only inside a stage's bubbles, one layer at a time."""
from __future__ import annotations

import multiprocessing
import time

_OPEN, _DEADLINE, _ABORTED, _PREDICTED = range(4)

MAX_SKIPPED_BUBBLES = 200  # bubbles in a row too short for one unit before the gate reports it (UnitNeverFits)
OVERRUN_FACTOR = 2.0  # after those, a unit up to this many times the longest bubble runs in one anyway


class FillAborted(Exception):
    """Raised inside a fill trial at a layer boundary when its host stops; the step in flight is dropped."""


class UnitNeverFits(RuntimeError):
    """A unit of fill work (a layer's forward or backward, an optimizer step) is longer than every bubble the
    gate saw: it would wait forever. The message gives the numbers."""


class BubbleGate:
    """A :class:`~hydro.pipeline.hooks.BubbleListener` that fill trials wait on between layers.

    ``wait_for(cost_s)`` returns when a bubble is open and its predicted remaining time covers ``cost_s``
    (the layer's measured time), so fill work is cut to the predicted bubble and the stage waits for at
    most the layer in flight when a bubble ends early. ``always_open=True`` is naive co-location: fill
    work runs regardless of bubbles. A unit that ``max_skipped`` bubbles in a row were too short for runs in
    the next bubble anyway if it is at most ``OVERRUN_FACTOR`` times the longest of them (a unit a little
    longer than every bubble of a fast stage, overrunning it by a fraction of a millisecond, preempted by the
    stage under ``SCHED_IDLE``); a longer one raises :class:`UnitNeverFits` (with its cost and the longest
    bubble) instead of waiting forever.

    The state lives in shared memory and wake-ups go through a semaphore, so the gate works across threads
    and across processes (pass it to a ``spawn`` child at creation). The stage's side never blocks:
    ``bubble_started``/``bubble_ended``/``abort`` are a few memory writes and one semaphore post.
    """

    def __init__(self, always_open: bool = False, max_skipped: int = MAX_SKIPPED_BUBBLES) -> None:
        context = multiprocessing.get_context("spawn")
        self.always_open, self.max_skipped = always_open, max_skipped
        self._state = context.RawArray("d", 4)  # open flag, deadline (time.monotonic() s), aborted, predicted s
        self._doorbell = context.Semaphore(0)  # posted on every bubble start and on abort

    def bubble_started(self, stage: int, predicted_s: float, free_bytes: int) -> None:
        self._state[_PREDICTED] = predicted_s
        self._state[_DEADLINE] = time.monotonic() + predicted_s
        self._state[_OPEN] = 1.0
        self._doorbell.release()

    def bubble_ended(self, stage: int) -> None:
        self._state[_OPEN] = 0.0

    def abort(self) -> None:
        """Make every waiting and future ``wait_for`` raise :class:`FillAborted`."""
        self._state[_ABORTED] = 1.0
        self._doorbell.release()

    def wait_for(self, cost_s: float, unit: str = "unit") -> None:
        """Return when ``unit`` (``cost_s`` seconds of work) fits the open bubble."""
        while self._doorbell.acquire(False):  # posts of bubbles already over: the state below says it all
            pass
        skipped, longest = 0, 0.0
        while True:
            if self._state[_ABORTED]:
                self._doorbell.release()  # other waiters see the abort too
                raise FillAborted
            if self.always_open:
                return
            if self._state[_OPEN] and time.monotonic() + cost_s <= self._state[_DEADLINE]:
                return
            if self._state[_OPEN] and self._state[_PREDICTED] < cost_s:  # this bubble is too short for it
                if skipped >= self.max_skipped and cost_s <= OVERRUN_FACTOR * longest:
                    return  # it overruns this bubble a little rather than never running
                skipped, longest = skipped + 1, max(longest, self._state[_PREDICTED])
                if skipped >= self.max_skipped and cost_s > OVERRUN_FACTOR * longest:
                    raise UnitNeverFits(
                        f"hydro.bubbles: fill unit {unit!r} takes {cost_s * 1e3:.2f} ms but the last {skipped} "
                        f"bubbles were at most {longest * 1e3:.2f} ms long: it never fits. Shrink the model "
                        f"(a larger scale), use fewer members per trial, or run the trial on a dedicated worker")
            self._doorbell.acquire()
