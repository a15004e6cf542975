"""A fill trial in its own process beside a pipeline stage, on the stage's cores, under ``SCHED_IDLE``.

A process of its own rather than a thread of the stage: a thread shares the stage's GIL, and a fill thread
preempted while holding it delays the stage each time a wait ends (measured: +9% main-job iteration time
in ``benchmarks/bubble_squeeze.py`` with a ``SCHED_IDLE`` thread). The child trains a
:class:`~hydro.bubbles.fill.FillTrial` gated by the stage's shared :class:`~hydro.bubbles.gate.BubbleGate`;
progress counters are in shared memory (read without waking the child); status and checkpoints travel
over a pipe on request, answered by a control thread in the child, as plain pickles (torch's multiprocessing
pickler would pass tensors as shared-memory handles that die with the child).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import threading
import traceback

import torch

from .fill import FillSpec, FillTooLarge, FillTrial, fit_to_memory
from .gate import BubbleGate

_STEPS, _COMPUTE_S = range(2)


class FillProcessError(RuntimeError):
    """The fill trial failed in its process; the message carries the child's traceback."""


class FillProcess:
    """Runs ``steps`` steps of a fill trial (new from ``spec``, or continued from ``checkpoint``).

    ``idle=True`` (gated fill): the child runs under Linux's ``SCHED_IDLE`` policy, so the stage preempts it
    the moment its wait ends; ``idle=False`` (naive co-location): normal priority. ``snapshot_every``: the
    child keeps a copy of its state every so many steps, for :meth:`status` (0: never).
    ``memory_budget_bytes``: a new trial keeps as many members as fit (:func:`~hydro.bubbles.fill.fit_to_memory`,
    :class:`~hydro.bubbles.fill.FillTooLarge` if none does).
    """

    def __init__(self, gate: BubbleGate, cpus: set[int] | None, *, spec: FillSpec | None = None,
                 checkpoint: dict | None = None, steps: int = 1_000_000, idle: bool = True,
                 snapshot_every: int = 0, memory_budget_bytes: int | None = None) -> None:
        if (spec is None) == (checkpoint is None):
            raise ValueError("give exactly one of spec (a new fill trial) or checkpoint (a trial to continue)")
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._progress = context.RawArray("d", 2)
        self._lock = threading.Lock()  # one request/answer on the pipe at a time
        self.gate = gate
        self._process = context.Process(
            target=_child_main, name="hydro-fill", daemon=True,
            args=(spec, pickle.dumps(checkpoint), memory_budget_bytes, gate, cpus, idle, steps, snapshot_every,
                  child_conn, self._progress))
        self._process.start()
        self.num_members: int = self._answer()

    @property
    def completed_steps(self) -> int:
        return int(self._progress[_STEPS])

    @property
    def compute_s(self) -> float:
        """CPU seconds the trial has spent computing (inside bubbles when gated)."""
        return self._progress[_COMPUTE_S]

    def status(self, since: int = 0) -> dict:
        """Completed steps, member ids and per-member losses of the last step; ``snapshot``: the latest
        snapshot (a checkpoint) if taken after ``since`` steps, else ``None``; ``snapshot_losses``:
        ``(completed steps, per-member losses)`` of every snapshot after ``since`` steps."""
        return self._request("status", since)

    def activity(self) -> list[tuple[float, float]]:
        """Wall-clock ``(start, end)`` of the trial's recent units of work (layers, loss, optimizer step)."""
        return self._request("activity")

    def stop(self) -> dict:
        """Stop at the next layer boundary (the step in flight is dropped); returns the trial's checkpoint,
        with ``snapshot_losses`` as in :meth:`status`."""
        self.gate.abort()
        checkpoint = self._request("stop")
        self._process.join()
        return checkpoint

    def _request(self, command: str, argument: int = 0):
        with self._lock:
            self._conn.send((command, argument))
            return self._answer()

    def _answer(self):
        kind, payload = pickle.loads(self._conn.recv_bytes())
        if kind == "too_large":
            self._process.join()
            raise FillTooLarge(payload)
        if kind == "error":
            self._process.join()
            raise FillProcessError(f"fill trial failed in its process:\n{payload}")
        return payload


def _child_main(spec, checkpoint, memory_budget_bytes, gate, cpus, idle, steps, snapshot_every, conn, progress
                ) -> None:
    def send(kind: str, payload) -> None:
        conn.send_bytes(pickle.dumps((kind, payload)))

    try:
        checkpoint = pickle.loads(checkpoint)
        if idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # threads started below inherit it
        if cpus:
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(1)
        if checkpoint is None and memory_budget_bytes is not None:
            spec = fit_to_memory(spec, memory_budget_bytes)
        trial = FillTrial(spec, gate) if checkpoint is None else FillTrial.from_checkpoint(checkpoint, gate)
    except FillTooLarge as error:
        send("too_large", str(error))
        return
    except BaseException:  # noqa: BLE001 - reported to the host, which raises it
        send("error", traceback.format_exc())
        return
    snapshot: list[dict | None] = [None]
    snapshot_losses: list[tuple[int, list[float]]] = []
    failure: list[str] = []

    def train() -> None:
        try:
            for _ in range(steps):
                if not trial.train(1):
                    return
                progress[_STEPS], progress[_COMPUTE_S] = trial.completed_steps, trial.compute_s
                if snapshot_every and trial.completed_steps % snapshot_every == 0:
                    snapshot[0] = trial.checkpoint()
                    snapshot_losses.append((trial.completed_steps, trial.last_losses))
        except BaseException:  # noqa: BLE001 - reported on the next request
            failure.append(traceback.format_exc())

    trainer = threading.Thread(target=train, name="hydro-fill-train")
    trainer.start()
    send("ok", trial.num_members)
    while True:
        try:
            command, argument = conn.recv()
        except EOFError:  # the host process died: nothing can use this trial any more
            os._exit(0)
        if command == "stop":
            trainer.join()
        if failure:
            send("error", failure[0])
            return
        if command == "stop":
            send("ok", {**trial.checkpoint(), "snapshot_losses": snapshot_losses})
            return
        if command == "activity":
            send("ok", list(trial.activity))
            continue
        latest = snapshot[0]
        send("ok", {"completed_steps": trial.completed_steps, "member_ids": trial.model.member_ids,
                    "losses": trial.last_losses,
                    "snapshot": latest if latest is not None and latest["completed_steps"] > argument else None,
                    "snapshot_losses": [point for point in snapshot_losses if point[0] > argument]})
