"""The small interface a pipeline framework calls around its idle waits, and a recorder of bubbles."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


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
