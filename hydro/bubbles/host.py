"""Hosts of fill trials: what a pipeline stage actor and a dedicated worker actor share.

A host runs at most one fill trial at a time, in a :class:`~hydro.bubbles.fill_process.FillProcess` on the
host's cores, sized to the memory the host can spare. Nothing of the fill trial runs in the host's own
process: torch.fx tracing (fusing) patches ``nn.Module.__call__`` process-wide and would break the modules
a stage runs meanwhile. :class:`~hydro.tune.pipeline_job.StageHost` gates it by the stage's bubbles;
:class:`DedicatedHost` (a worker of its own) lets it run freely.
"""
from __future__ import annotations

import os
import threading

from hydro.planning import free_memory_bytes

from .fill import FillSpec, FillTooLarge
from .fill_process import FillProcess
from .gate import BubbleGate


class FillHost:
    """Attach, observe and detach one fill trial. ``fill_memory_bytes``: what a fill trial may use (default:
    a quarter of the free memory); ``name`` appears in errors."""

    modes: tuple[str, ...] = ()

    def __init__(self, name: str, cpus: set[int] | None, fill_memory_bytes: int | None) -> None:
        self.name, self.cpus, self.fill_memory_bytes = name, cpus, fill_memory_bytes
        self.gate = BubbleGate()
        self.fill: FillProcess | None = None
        self.fill_lock = threading.Lock()  # actor calls run concurrently: attach/detach/status one at a time

    def attach_fill(self, spec: FillSpec | None = None, mode: str = "gated", steps: int = 1_000_000,
                    checkpoint: dict | None = None, snapshot_every: int = 0) -> int:
        """Start a fill trial here, new from ``spec`` or continued from ``checkpoint``; returns its fusion
        count, which follows the memory this host can spare (raises :class:`FillTooLarge` with the numbers
        if one member does not fit). ``snapshot_every``: steps between the snapshots :meth:`fill_status`
        returns."""
        if mode not in self.modes:
            raise ValueError(f"{self.name}: mode must be one of {self.modes}, got {mode!r}")
        with self.fill_lock:
            if self.fill is not None:
                raise RuntimeError(f"{self.name} already hosts a fill trial; detach_fill() it first")
            gate = BubbleGate(always_open=mode != "gated")
            try:
                self.fill = FillProcess(gate, self.cpus, spec=None if checkpoint else spec, checkpoint=checkpoint,
                                        steps=steps, idle=mode == "gated", snapshot_every=snapshot_every,
                                        memory_budget_bytes=self.fill_budget())
            except FillTooLarge as error:
                raise FillTooLarge(f"{self.name}: {error}") from None
            self._set_gate(gate)
            return self.fill.num_members

    def fill_status(self, since: int = 0) -> dict | None:
        """The hosted fill trial's progress (see :meth:`FillProcess.status`), or ``None`` if there is none."""
        with self.fill_lock:
            return None if self.fill is None else self.fill.status(since)

    def detach_fill(self) -> dict | None:
        """Stop the fill trial at its next layer boundary; returns its checkpoint (completed steps only)."""
        with self.fill_lock:
            if self.fill is None:
                return None
            checkpoint, self.fill = self.fill.stop(), None
            self._set_gate(BubbleGate())
            return checkpoint

    def _set_gate(self, gate: BubbleGate) -> None:
        self.gate = gate

    def fill_budget(self) -> int:
        """Bytes a fill trial may use here."""
        return self.fill_memory_bytes if self.fill_memory_bytes is not None else free_memory_bytes() // 4


class DedicatedHost(FillHost):
    """A worker of its own for fill trials (mode ``"dedicated"``: they run at normal priority, ungated)."""

    modes = ("dedicated",)

    def __init__(self, name: str, fill_memory_bytes: int | None = None) -> None:
        super().__init__(name, set(os.sched_getaffinity(0)), fill_memory_bytes)
