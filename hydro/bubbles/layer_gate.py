"""``LayerGate``: the fused-trial gate that holds a :class:`~hydro.trial.unit.FusedTrial` at layer boundaries
until its :class:`~hydro.bubbles.gate.BubbleGate` has a bubble long enough for the next unit of work.

Units: every leaf module's forward, every leaf module's backward (a hook on its output's gradient) and each
optimizer step. On the CPU each unit is timed in this thread's CPU time (wall time would count the preemptions of
an idle-policy fill as layer cost). On a GPU it is timed with CUDA events on the fill's stream, and the fill waits
for each unit's end event before it asks the gate for the next: the host-side gate then keeps the fill's kernels
out of the stage's compute on the device itself, since at most one unit of fill work is ever queued, and only
once the stage's own stream has drained and its predicted bubble has room for that unit's measured device time
(see :func:`~hydro.pipeline.hooks.announced_wait` for the stage's side). The median of the unit's last few costs is what it asks the bubble for, so one
slow run (a unit that happened to include a one-off piece of work, e.g. copying the state at an epoch's end, or
a page-faulting first touch) cannot make it wait for a bubble that never comes.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable

import torch

from hydro.pipeline.timing import DeviceTimer, Mark
from hydro.trial.unit import FusedTrial, Gate

from .gate import BubbleGate


COST_SAMPLES = 5  # a unit's cost is the median of its last 5 runs: robust to 2 outliers


class LayerGate(Gate):
    """Gates ``trial``'s units on ``bubbles``. ``compute_s``: seconds spent in units (CPU time of this thread on
    the CPU, device time on a GPU); ``activity``: recent
    wall-clock ``(start, end)`` of units; ``unit_started``: ``time.monotonic()`` when the unit in progress
    started (0 while waiting at the gate), also passed to ``on_unit`` — a watchdog's view of a hung unit."""

    def __init__(self, bubbles: BubbleGate, on_unit: Callable[[float], None] | None = None) -> None:
        self.bubbles, self.on_unit = bubbles, on_unit
        self.compute_s = 0.0
        self.activity: deque[tuple[float, float]] = deque(maxlen=4096)
        self.layer_cost: dict[str, float] = {}  # unit -> median of its recent costs (CPU s)
        self._costs: dict[str, deque[float]] = {}
        self.unit_started = 0.0
        self.timed = False  # costs are learned once the first step (one-off set-up) is over
        self.timer = DeviceTimer("cpu", clock=time.thread_time)  # (the trial's device once attached)
        self._current: tuple[str, Mark, float] | None = None  # unit, its start mark and wall-clock start
        self._handles: list = []

    def attach(self, trial: FusedTrial) -> None:
        self.timer = DeviceTimer(trial.device, clock=time.thread_time)
        for module in trial.modules():
            for name, layer in module.named_modules():
                if not list(layer.children()):
                    self._handles.append(layer.register_forward_pre_hook(
                        lambda m, a, name=name: self.boundary("F:" + name)))
                    self._handles.append(layer.register_forward_hook(
                        lambda m, a, out, name=name: self._hook_backward(out, "B:" + name)))
        for optimizer in trial.optimizers():
            self._handles.append(optimizer.register_step_pre_hook(lambda o, a, k: self.boundary("optimizer")))
            self._handles.append(optimizer.register_step_post_hook(lambda o, a, k: self.step_done()))

    def detach(self, trial: FusedTrial) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def step_done(self) -> None:
        """Close the unit in progress (the end of an optimizer step, or work dropped by an abort)."""
        self.boundary(None)
        self.timed = True

    def _started(self, when: float) -> None:
        self.unit_started = when
        if self.on_unit is not None:
            self.on_unit(when)

    def _hook_backward(self, output, unit: str) -> None:
        first = output[0] if isinstance(output, tuple) else output
        if isinstance(first, torch.Tensor) and first.requires_grad:
            first.register_hook(lambda grad: self.boundary(unit))

    def boundary(self, unit: str | None) -> None:
        """Close the timing of the unit that just ran; wait for room in a bubble for ``unit`` (``None``: none)."""
        now = self.timer.mark()
        if self._current is not None:
            name, start, wall_start = self._current
            self.timer.wait(now)  # (GPU: the unit's kernels are done before the next unit is asked for)
            cost = self.timer.seconds(start, now)
            self.compute_s += cost
            self.activity.append((wall_start, time.time()))
            if self.timed:
                costs = self._costs.setdefault(name, deque(maxlen=COST_SAMPLES))
                costs.append(cost)
                self.layer_cost[name] = statistics.median(costs)
            self._current = None
        self._started(0.0)
        if unit is None:
            return
        self.bubbles.wait_for(self.layer_cost.get(unit, 0.0), unit)
        self._started(time.monotonic())
        self._current = (unit, self.timer.mark(), time.time())
