"""Hosts of fill trials: what a pipeline stage actor and a dedicated worker actor share.

A host runs at most one fill trial at a time, in a :class:`~hydro.bubbles.fill_process.FillProcess` on the
host's cores, sized to the memory the host can spare. Nothing of the fill trial runs in the host's own
process: torch.fx tracing (fusing) patches ``nn.Module.__call__`` process-wide and would break the modules
a stage runs meanwhile, and the user's code may raise, crash or hang. A fill that fails is detached at once
(the slot can host a new one) and its cause is kept for the next :meth:`FillHost.fill_status`.
:class:`~hydro.tune.pipeline.job.StageHost` gates it by the stage's bubbles; :class:`DedicatedHost` (a worker
of its own) lets it run freely.
"""
from __future__ import annotations

import enum
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import replace

from hydro.pipeline.hooks import BubbleRecorder
from hydro.profiling import free_memory_bytes
from hydro.trial.plan import TrialPlan

from .fill_process import FillFailed, FillFailure, FillProcess, FillTooLarge, start_fill_server
from .gate import BubbleGate

logger = logging.getLogger(__name__)


class SlotMode(enum.StrEnum):
    """How a host runs its fill trial."""

    GATED = "gated"          # inside a stage's bubbles only, layer by layer, under SCHED_IDLE
    NAIVE = "naive"          # alongside the stage at normal priority (for contrast)
    DEDICATED = "dedicated"  # on a worker of its own, ungated


class FillHost:
    """Attach, observe and detach one fill trial. ``fill_memory_bytes``: what a fill trial may use (default:
    a quarter of the free memory); ``name`` appears in errors. ``timeouts``: ``answer_timeout_s`` and
    ``unit_timeout_s`` of the fill processes (see :class:`~hydro.bubbles.fill_process.FillProcess`).
    ``preload``: modules the host's fill server imports besides torch (see :func:`start_fill_server`, started
    here)."""

    modes: tuple[SlotMode, ...] = ()

    def __init__(self, name: str, cpus: set[int] | None, fill_memory_bytes: int | None,
                 timeouts: dict | None = None, preload: Sequence[str] = ()) -> None:
        start_fill_server(preload)
        self.name, self.cpus, self.fill_memory_bytes = name, cpus, fill_memory_bytes
        self.timeouts = dict(timeouts or {})
        self.gate = BubbleGate()
        self.fill: FillProcess | None = None
        self.failure: FillFailure | None = None  # the last fill's failure, until fill_status reports it
        self.fill_lock = threading.Lock()  # actor calls run concurrently: attach/detach/status one at a time

    def attach_fill(self, workload: bytes, plan: TrialPlan, mode: SlotMode, *, member_ids: Sequence[str] | None = None,
                    state: dict | None = None, epochs: int | None = None,
                    one_member_bytes: int | None = None) -> list[str]:
        """Start a fill trial here: new with (as many as fit of) ``member_ids``, or continued from ``state``;
        returns the member ids it trains (the fusion count follows the memory this host can spare, from
        ``one_member_bytes`` if the caller measured a member's step, else measured in the fill; raises
        :class:`FillTooLarge` if not even one fits)."""
        mode = SlotMode(mode)
        if mode not in self.modes:
            raise ValueError(f"{self.name}: mode must be one of {[m.value for m in self.modes]}, got {mode.value!r}")
        with self.fill_lock:
            if self.fill is not None:
                raise RuntimeError(f"{self.name} already hosts a fill trial; detach_fill() it first")
            gate = BubbleGate(always_open=mode != SlotMode.GATED)
            self.failure = None
            try:
                self.fill = FillProcess(gate, self.cpus, workload=workload, plan=plan, member_ids=member_ids,
                                        state=state, idle=mode == SlotMode.GATED, epochs=epochs,
                                        memory_budget_bytes=None if state else self.fill_budget(),
                                        one_member_bytes=one_member_bytes, **self.timeouts)
            except FillTooLarge as error:
                raise FillTooLarge(f"{self.name}: {error}") from None
            except FillFailed as error:
                raise FillFailed(replace(error.failure, cause=f"{self.name}: {error.failure.cause}")) from None
            self._set_gate(gate)
            return self.fill.member_ids

    def fill_status(self, wait_s: float = 0.0) -> dict | None:
        """The hosted fill trial: ``{"result": EpochResult | None, "finished": bool}``; ``{"failed": cause,
        "failure": FillFailure}`` once after it failed (it is detached then); ``None`` if there is none.
        ``wait_s``: first wait up to this long for news of the fill (an epoch posted, its end, a failure; see
        :meth:`FillProcess.wait_news`), so a caller can follow a fill with one call per epoch instead of polling
        the host — whose process is the pipeline stage's — many times a second."""
        fill = self.fill
        if wait_s > 0 and fill is not None:
            fill.wait_news(wait_s)
        with self.fill_lock:
            if self.fill is None:
                failure, self.failure = self.failure, None
                return None if failure is None else _failed(failure)
            try:
                return self.fill.poll()
            except FillFailed as error:
                return self._drop_and_report(error.failure)

    def fill_steps(self) -> int | None:
        """Training steps the hosted fill trial has done here (read without asking it); ``None`` if there is none."""
        fill = self.fill
        return None if fill is None else fill.completed_steps

    def fill_decide(self, keep: Sequence[str]) -> dict:
        """Decide the posted epoch result (see :meth:`FillProcess.decide`); ``{"state": ...}`` or
        ``{"failed": cause, "failure": FillFailure}``."""
        with self.fill_lock:
            if self.fill is None:
                raise RuntimeError(f"{self.name} hosts no fill trial to decide for")
            try:
                return {"state": self.fill.decide(keep)}
            except FillFailed as error:
                return self._drop_and_report(error.failure)

    def detach_fill(self) -> dict | None:
        """Stop the fill trial at its next layer boundary; returns ``{"state": ...}`` (to continue from) or
        ``{"failed": cause, "failure": FillFailure}``; ``None`` if there is none."""
        with self.fill_lock:
            if self.fill is None:
                return None
            try:
                state = self.fill.stop()
            except FillFailed as error:
                return self._drop_and_report(error.failure)
            self.fill = None
            self._set_gate(BubbleGate())
            return {"state": state}

    def check_fill(self) -> None:
        """Detach the fill trial if it has died or hangs (the watchdog; call it often, it does not block)."""
        if self.fill is None or not self.fill_lock.acquire(blocking=False):
            return
        try:
            if self.fill is not None:
                self.fill.check()
        except FillFailed as error:
            self._drop(error.failure)
        finally:
            self.fill_lock.release()

    def _drop(self, failure: FillFailure) -> None:
        """The fill failed (its process is gone): free the slot, keep the failure (call with ``fill_lock``
        held)."""
        logger.warning("%s: fill trial failed and was detached: %s", self.name, failure.cause)
        self.fill, self.failure = None, failure
        self._set_gate(BubbleGate())

    def _drop_and_report(self, failure: FillFailure) -> dict:
        """Drop the failed fill and report its failure to this caller only: it is not reported again."""
        self._drop(failure)
        self.failure = None
        return _failed(failure)

    def _set_gate(self, gate: BubbleGate) -> None:
        self.gate = gate

    def fill_budget(self) -> int:
        """Bytes a fill trial may use here."""
        return self.fill_memory_bytes if self.fill_memory_bytes is not None else free_memory_bytes() // 4


def _failed(failure: FillFailure) -> dict:
    return {"failed": failure.cause, "failure": failure}


class GatedHost(FillHost):
    """The host of a pipeline stage: :attr:`recorder` is the stage's :class:`~hydro.pipeline.hooks.BubbleListener`
    (it records the bubbles and forwards them to the hosted fill's gate). Fill modes: ``GATED`` (inside bubbles
    only) and ``NAIVE`` (alongside the stage, for contrast)."""

    modes = (SlotMode.GATED, SlotMode.NAIVE)

    def __init__(self, name: str, cpus: set[int] | None, fill_memory_bytes: int | None,
                 timeouts: dict | None = None, preload: Sequence[str] = ()) -> None:
        super().__init__(name, cpus, fill_memory_bytes, timeouts, preload)
        self.recorder = BubbleRecorder(self.gate)

    def _set_gate(self, gate: BubbleGate) -> None:
        self.gate = gate
        self.recorder.listeners = [gate]


class DedicatedHost(FillHost):
    """A worker of its own for fill trials (mode ``DEDICATED``: they run at normal priority, ungated)."""

    modes = (SlotMode.DEDICATED,)

    def __init__(self, name: str, fill_memory_bytes: int | None = None, timeouts: dict | None = None,
                 preload: Sequence[str] = ()) -> None:
        super().__init__(name, set(os.sched_getaffinity(0)), fill_memory_bytes, timeouts, preload)
